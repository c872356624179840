// node bench/latency.mjs VERSION_FOLDER REQUESTS.jsonl [ROUNDS] [KIND=SECONDS]: per-request decision
// latency of Router.route() on a published policy (loaded and verified from its files), after a
// warm-up; with KIND=SECONDS (ttft or latency), every request under that budget (format 4).
// Warm-up: $WARMUP calls (default 500), cycling through the requests.
// Prints {p50_us, p99_us, n} per round as JSON lines. Benchmarks only; never a test.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Router } from "../dist/index.js";

const [dir, requestsFile, rounds = "3", budgetArg] = process.argv.slice(2);
const [kind, seconds] = budgetArg ? budgetArg.split("=") : [];
const budget = kind === "ttft" ? { ttftBudgetS: Number(seconds) } : kind === "latency" ? { latencyBudgetS: Number(seconds) } : {};
if (budgetArg && !Object.keys(budget).length) throw new Error(`budget ${budgetArg}: give ttft=SECONDS or latency=SECONDS`);
const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
const pem = readFileSync(process.env.ROUTEOPT_PUBLIC_KEY, "utf8");
const router = await Router.open({ files, publicKeys: [pem] });
const requests = readFileSync(requestsFile, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const warmup = Number(process.env.WARMUP ?? 500);
for (let i = 0; i < warmup; i++) {
  const r = requests[i % requests.length];
  router.route(r.prompt, { suite: r.suite, requestId: "w", ...budget });
}
for (let round = 0; round < Number(rounds); round++) {
  const times = new Float64Array(requests.length);
  for (let i = 0; i < requests.length; i++) {
    const r = requests[i];
    const t = process.hrtime.bigint();
    router.route(r.prompt, { suite: r.suite, requestId: r.id, ...budget });
    times[i] = Number(process.hrtime.bigint() - t) / 1000;
  }
  times.sort();
  const q = (p) => times[Math.min(times.length - 1, Math.floor(p * times.length))];
  process.stdout.write(JSON.stringify({ n: times.length, p50_us: q(0.5), p99_us: q(0.99) }) + "\n");
}
