// node bench/latency.mjs VERSION_FOLDER REQUESTS.jsonl [ROUNDS] [KIND=SECONDS]: per-request decision
// latency of Router.route() on a published policy (loaded and verified from its files), after a
// warm-up; with KIND=SECONDS (ttft or latency), every request under that budget (format 4).
// Warm-up: $WARMUP calls (default 500), cycling through the requests.
// With PAIRED=1 and a budget, each request is routed without it and with it, back to back (in
// turn which first), so both see the same moments of the machine.
// Prints {n, p50_us, p99_us} per round as JSON lines (with PAIRED, also budget_p50_us and
// budget_p99_us), then {per_request: ...}: the p50 and p99 over requests of each request's
// median time across rounds, which leaves out what the machine did to one call.
// Benchmarks only; never a test.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Router } from "../dist/index.js";

const [dir, requestsFile, rounds = "3", budgetArg] = process.argv.slice(2);
const [kind, seconds] = budgetArg ? budgetArg.split("=") : [];
const budget = kind === "ttft" ? { ttftBudgetS: Number(seconds) } : kind === "latency" ? { latencyBudgetS: Number(seconds) } : {};
if (budgetArg && !Object.keys(budget).length) throw new Error(`budget ${budgetArg}: give ttft=SECONDS or latency=SECONDS`);
const paired = Boolean(process.env.PAIRED) && Boolean(budgetArg);
const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
const pem = readFileSync(process.env.ROUTEOPT_PUBLIC_KEY, "utf8");
const router = await Router.open({ files, publicKeys: [pem] });
const requests = readFileSync(requestsFile, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const warmup = Number(process.env.WARMUP ?? 500);
for (let i = 0; i < warmup; i++) {
  const r = requests[i % requests.length];
  router.route(r.prompt, { suite: r.suite, requestId: "w", ...budget });
  if (paired) router.route(r.prompt, { suite: r.suite, requestId: "w" });
}
const q = (times, p) => Float64Array.from(times).sort()[Math.min(times.length - 1, Math.floor(p * times.length))];
const n = requests.length, plain = [], budgeted = [];
const timed = (r, extra) => {
  const t = process.hrtime.bigint();
  router.route(r.prompt, { suite: r.suite, requestId: r.id, ...extra });
  return Number(process.hrtime.bigint() - t) / 1000;
};
for (let round = 0; round < Number(rounds); round++) {
  const a = new Float64Array(n), b = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    if (paired && i % 2 === 0) {
      a[i] = timed(requests[i], {});
      b[i] = timed(requests[i], budget);
    } else if (paired) {  // the other order every other request: the second call finds warm caches
      b[i] = timed(requests[i], budget);
      a[i] = timed(requests[i], {});
    } else a[i] = timed(requests[i], budget);
  }
  plain.push(a);
  budgeted.push(b);
  const out = { n, p50_us: q(a, 0.5), p99_us: q(a, 0.99) };
  if (paired) Object.assign(out, { budget_p50_us: q(b, 0.5), budget_p99_us: q(b, 0.99) });
  process.stdout.write(JSON.stringify(out) + "\n");
}
const medians = (runs) => Float64Array.from({ length: n }, (_, i) => runs.map((r) => r[i]).sort((x, y) => x - y)[runs.length >> 1]);
const m = medians(plain), per = { p50_us: q(m, 0.5), p99_us: q(m, 0.99) };
if (paired) {
  const mb = medians(budgeted);
  Object.assign(per, { budget_p50_us: q(mb, 0.5), budget_p99_us: q(mb, 0.99) });
}
process.stdout.write(JSON.stringify({ per_request: per }) + "\n");
