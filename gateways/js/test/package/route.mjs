// Run inside an app that installed the packed tarball: node route.mjs VERSION_DIR PEM_FILE REQUESTS_JSON
// Routes the requests with the policy in VERSION_DIR through the package as an app imports it.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createRequire } from "node:module";
import { FORMAT_VERSION, KERNEL_ENGINE, Router } from "@routeopt/gateway";
import { FileLog } from "@routeopt/gateway/node";

const [dir, pemFile, requestsFile] = process.argv.slice(2);
const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
const router = await Router.open({ files, publicKeys: [readFileSync(pemFile, "utf8")] });
const { requests } = JSON.parse(readFileSync(requestsFile, "utf8"));
const decisions = requests.map((r) => router.route(r.prompt, { suite: r.suite, qualityTarget: r.quality_target, requestId: r.id }));
const pkg = createRequire(import.meta.url)("@routeopt/gateway/package.json");
process.stdout.write(JSON.stringify({
  decisions, version: router.version, conformance: router.status().conformance, kernel: KERNEL_ENGINE,
  formatVersion: FORMAT_VERSION, packageVersion: pkg.version, fileLog: typeof FileLog,
}));
