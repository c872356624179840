// node bench/ab.mjs DIST_A DIST_B VERSION_A VERSION_B REQUESTS.jsonl [ROUNDS]: per-request decision
// latency of two builds of this package (or two policies) in one process, so that both meet the
// same machine: each round, each router routes every request in turn (its own caches warm, as a
// gateway's would be), and which one goes first alternates. Prints one JSON line per router with
// the medians over rounds of p50, p99 and the median of the ten longest prompts. The public key is
// the one beside each version's registry (../../../keys/public_key.pem), or ROUTEOPT_PUBLIC_KEY.
// Benchmarks only; never a test.
import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";

const [distA, distB, versionA, versionB, requestsFile, rounds = "9"] = process.argv.slice(2);
const open = async (dist, dir) => {
  const { Router } = await import(join(resolve(dist), "index.js"));
  const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
  const pem = readFileSync(process.env.ROUTEOPT_PUBLIC_KEY ?? join(dir, "..", "..", "..", "keys", "public_key.pem"), "utf8");
  return Router.open({ files, publicKeys: [pem] });
};
const routers = { a: await open(distA, versionA), b: await open(distB, versionB) };
const requests = readFileSync(requestsFile, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const longest = requests.map((_, i) => i).sort((i, j) => requests[j].prompt.length - requests[i].prompt.length).slice(0, 10);
const quantile = (xs, p) => Float64Array.from(xs).sort()[Math.min(xs.length - 1, Math.floor(p * xs.length))];
const median = (xs) => quantile(xs, 0.5);

for (const r of requests) for (const router of Object.values(routers)) router.route(r.prompt, { suite: r.suite, requestId: "w" });
const rows = { a: [], b: [] };
for (let round = 0; round < Number(rounds); round++) {
  for (const name of round % 2 ? ["a", "b"] : ["b", "a"]) {
    const router = routers[name];
    const times = requests.map((r) => {
      const t = process.hrtime.bigint();
      router.route(r.prompt, { suite: r.suite, requestId: r.id });
      return Number(process.hrtime.bigint() - t) / 1000;
    });
    rows[name].push({ p50: quantile(times, 0.5), p99: quantile(times, 0.99), longest: median(longest.map((i) => times[i])) });
  }
}
for (const [name, rs] of Object.entries(rows)) {
  process.stdout.write(JSON.stringify({ router: name, p50_us: median(rs.map((r) => r.p50)), p99_us: median(rs.map((r) => r.p99)),
    longest10_us: median(rs.map((r) => r.longest)), rounds_p99_us: rs.map((r) => r.p99) }) + "\n");
}
