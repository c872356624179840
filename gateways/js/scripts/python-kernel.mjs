// Writes the WebAssembly kernel that `npm run build` assembled (src/kernel-wasm.ts, base64) to
// router_training/policy/kernel.wasm, where the Python runtime runs the same module with
// wasmtime. Run after a change to scripts/kernel.mjs:
//
//   cd gateways/js && npm run build && node scripts/python-kernel.mjs
//
// tests/gateways/test_js_package.py fails while the two differ.
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const source = readFileSync(fileURLToPath(new URL("../src/kernel-wasm.ts", import.meta.url)), "utf8");
const base64 = /KERNEL_WASM: string = "([^"]+)"/.exec(source)[1];
writeFileSync(fileURLToPath(new URL("../../../router_training/policy/kernel.wasm", import.meta.url)),
  Buffer.from(base64, "base64"));
