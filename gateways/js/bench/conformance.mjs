// node bench/conformance.mjs POLICY_FOLDER: load a policy's files, run its conformance vectors,
// print the report as JSON (with load and check times in ms). Used by the benchmarks and tests.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { checkVectors, conformanceSummary, readPolicy } from "../dist/index.js";

const dir = process.argv[2];
const t0 = performance.now();
const files = Object.fromEntries(["policy.json", "arrays.safetensors", "conformance.safetensors"].map((f) => [f, readFileSync(join(dir, f))]));
const t1 = performance.now();
const policy = readPolicy(files["policy.json"], files["arrays.safetensors"]);
const t2 = performance.now();
const cpu0 = process.cpuUsage();
const report = await checkVectors(policy, files["conformance.safetensors"]);
const t3 = performance.now();
const cpu = process.cpuUsage(cpu0);
process.stdout.write(JSON.stringify({ ...report, summary: conformanceSummary(report), readMs: t1 - t0, loadMs: t2 - t1, checkMs: t3 - t2, checkCpuMs: (cpu.user + cpu.system) / 1000 }) + "\n");
process.exitCode = report.ok ? 0 : 1;
