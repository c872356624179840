// Drive test/worker/entry.mjs in workerd (miniflare): node test/worker/run.mjs REGISTRY_URL PEM_FILE REQUESTS_JSON
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import { Miniflare } from "miniflare";

const [url, pemFile, requestsFile] = process.argv.slice(2);
const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const mf = new Miniflare({
  modules: true,
  modulesRoot: root,
  scriptPath: join(root, "test/worker/entry.mjs"),
  modulesRules: [{ type: "ESModule", include: ["**/*.js", "**/*.mjs"] }],
  compatibilityDate: "2024-09-23",
  bindings: { REGISTRY_URL: url, PUBLIC_KEY: readFileSync(pemFile, "utf8") },
});
try {
  const res = await mf.dispatchFetch("http://worker/", { method: "POST", body: readFileSync(requestsFile, "utf8") });
  process.stdout.write(await res.text());
} finally {
  await mf.dispose();
}
