// node bench/route.mjs VERSION_FOLDER REQUESTS.jsonl: decide every request (at its
// quality_target) and print one JSON decision per line, for comparison with Python's.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Router } from "../dist/index.js";

const [dir, requestsFile] = process.argv.slice(2);
const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
const router = await Router.open({ files, publicKeys: [readFileSync(process.env.ROUTEOPT_PUBLIC_KEY, "utf8")] });
const out = [];
for (const line of readFileSync(requestsFile, "utf8").trim().split("\n")) {
  const r = JSON.parse(line);
  const d = router.route(r.prompt, { suite: r.suite, qualityTarget: r.quality_target, requestId: r.id });
  out.push(JSON.stringify({ id: r.id, model: d.model, fallbacks: d.fallbacks, propensity: d.propensity }));
}
process.stdout.write(out.join("\n") + "\n");
