// node bench/latency.mjs VERSION_FOLDER REQUESTS.jsonl [ROUNDS]: per-request decision latency of
// Router.route() on a published policy (loaded and verified from its files), after a warm-up.
// Prints {p50_us, p99_us, n} per round as JSON lines. Benchmarks only; never a test.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Router } from "../dist/index.js";

const [dir, requestsFile, rounds = "3"] = process.argv.slice(2);
const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
const pem = readFileSync(process.env.ROUTEOPT_PUBLIC_KEY, "utf8");
const router = await Router.open({ files, publicKeys: [pem] });
const requests = readFileSync(requestsFile, "utf8").trim().split("\n").map((l) => JSON.parse(l));
for (const r of requests.slice(0, 500)) router.route(r.prompt, { suite: r.suite, requestId: "w" });
for (let round = 0; round < Number(rounds); round++) {
  const times = new Float64Array(requests.length);
  for (let i = 0; i < requests.length; i++) {
    const r = requests[i];
    const t = process.hrtime.bigint();
    router.route(r.prompt, { suite: r.suite, requestId: r.id });
    times[i] = Number(process.hrtime.bigint() - t) / 1000;
  }
  times.sort();
  const q = (p) => times[Math.min(times.length - 1, Math.floor(p * times.length))];
  process.stdout.write(JSON.stringify({ n: times.length, p50_us: q(0.5), p99_us: q(0.99) }) + "\n");
}
