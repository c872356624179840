// node bench/open.mjs VERSION_FOLDER: cold load of a published policy in a fresh process:
// read its files, verify the signature and every hash, parse, run its conformance vectors.
// Prints {open_ms, total_ms} (total: from process start). Benchmarks only.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Router } from "../dist/index.js";

const dir = process.argv[2];
const t0 = performance.now();
const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
const router = await Router.open({ files, publicKeys: [readFileSync(process.env.ROUTEOPT_PUBLIC_KEY, "utf8")] });
const t1 = performance.now();
if (!router.status().conformance?.includes("agree")) throw new Error(router.status().conformance);
process.stdout.write(JSON.stringify({ open_ms: t1 - t0, total_ms: t1 }) + "\n");
