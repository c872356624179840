// node worker-run.mjs APP_DIR REGISTRY_URL PEM_FILE REQUESTS_JSON: bundles APP_DIR/worker.mjs with
// the package APP_DIR installed (esbuild, one ES module, as wrangler does) and runs the bundle in
// workerd (miniflare) on the requests. Dev tooling of gateways/js; the app itself needs none.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";
import { Miniflare } from "miniflare";

const [app, url, pemFile, requestsFile] = process.argv.slice(2);
const bundle = await build({
  absWorkingDir: app, entryPoints: ["worker.mjs"], bundle: true, format: "esm", platform: "neutral",
  conditions: ["workerd", "worker", "browser"], mainFields: ["module", "main"], write: false, metafile: true,
});
const inputs = Object.keys(bundle.metafile.inputs);
const mf = new Miniflare({
  modules: true, script: bundle.outputFiles[0].text, compatibilityDate: "2024-09-23",
  bindings: { REGISTRY_URL: url, PUBLIC_KEY: readFileSync(pemFile, "utf8") },
});
try {
  const res = await mf.dispatchFetch("http://worker/", { method: "POST", body: readFileSync(requestsFile, "utf8") });
  const answer = await res.json();
  process.stdout.write(JSON.stringify({ ...answer, bundleBytes: bundle.outputFiles[0].contents.length,
    bundled: inputs.map((p) => join(p)) }));
} finally {
  await mf.dispose();
}
