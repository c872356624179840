// Fixtures made by tests/gateways/test_js_runtime.py (trained and published with the real
// Python pipeline): ROUTEOPT_JS_FIXTURES names their folder.
import { readdirSync, readFileSync, existsSync } from "node:fs";
import { join } from "node:path";

export const ROOT = process.env.ROUTEOPT_JS_FIXTURES ?? "";
export const NO_FIXTURES = ROOT ? false : "ROUTEOPT_JS_FIXTURES is not set: run through tests/gateways/test_js_runtime.py";

export function policyNames() {
  return ROOT && existsSync(join(ROOT, "policies")) ? readdirSync(join(ROOT, "policies")).sort() : [];
}

export function policyFiles(name) {
  const dir = join(ROOT, "policies", name);
  return Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
}

/** A published version's files (manifest.json, manifest.sig and the policy's files). */
export function versionFiles(registry, n = 1) {
  const versions = join(ROOT, registry, "versions");
  const dir = readdirSync(versions).sort()[n - 1];
  return Object.fromEntries(readdirSync(join(versions, dir)).map((f) => [f, new Uint8Array(readFileSync(join(versions, dir, f)))]));
}

export function publicKey() {
  return readFileSync(join(ROOT, "keys", "public_key.pem"), "utf8");
}

export function expected(name) {
  return JSON.parse(readFileSync(join(ROOT, "expected", `${name}.json`), "utf8"));
}

/** Change tensor `name` of a container in place: fn(typedArray). */
export function patchTensor(bytes, name, fn) {
  const out = new Uint8Array(bytes);
  const dv = new DataView(out.buffer);
  const size = dv.getUint32(0, true);
  const header = JSON.parse(new TextDecoder().decode(out.subarray(8, 8 + size)));
  const t = header[name];
  const start = 8 + size + t.data_offsets[0];
  const length = (t.data_offsets[1] - t.data_offsets[0]);
  const copy = out.slice(start, start + length);
  const view = t.dtype === "F64" ? new Float64Array(copy.buffer) : t.dtype === "F32" ? new Float32Array(copy.buffer)
    : t.dtype === "I32" ? new Int32Array(copy.buffer) : t.dtype === "U32" ? new Uint32Array(copy.buffer) : copy;
  fn(view);
  out.set(copy, start);
  return out;
}

/** The container with tensor `name` (F32) stored as F64, the same numbers widened exactly:
 * tensors are laid out by element size, largest first, so each stays aligned. */
export function widenTensor(bytes, name) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const size = dv.getUint32(0, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + size)));
  const SIZES = { F64: 8, I64: 8, U64: 8, F32: 4, I32: 4, U32: 4, I16: 2, U16: 2, I8: 1, U8: 1 };
  const parts = [];
  for (const [key, t] of Object.entries(header)) {
    if (key === "__metadata__") continue;
    let data = bytes.slice(8 + size + t.data_offsets[0], 8 + size + t.data_offsets[1]);
    let dtype = t.dtype;
    if (key === name) {
      if (dtype !== "F32") throw new Error(`${name} is ${dtype}, not F32`);
      data = new Uint8Array(Float64Array.from(new Float32Array(data.buffer)).buffer);
      dtype = "F64";
    }
    parts.push({ key, dtype, shape: t.shape, data });
  }
  parts.sort((a, b) => SIZES[b.dtype] - SIZES[a.dtype]);
  const out = { __metadata__: header.__metadata__ ?? {} };
  let at = 0;
  for (const p of parts) {
    out[p.key] = { dtype: p.dtype, shape: p.shape, data_offsets: [at, at + p.data.length] };
    at += p.data.length;
  }
  let head = new TextEncoder().encode(JSON.stringify(out));
  head = Uint8Array.from([...head, ...new Array((8 - (head.length % 8)) % 8).fill(0x20)]);
  const result = new Uint8Array(8 + head.length + at);
  new DataView(result.buffer).setUint32(0, head.length, true);
  result.set(head, 8);
  let pos = 8 + head.length;
  for (const p of parts) {
    result.set(p.data, pos);
    pos += p.data.length;
  }
  return result;
}

/** The container with its metadata entry `key` (a JSON text) changed by fn(parsed) -> parsed. */
export function patchMetadata(bytes, key, fn) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const size = dv.getUint32(0, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + size)));
  header.__metadata__[key] = JSON.stringify(fn(JSON.parse(header.__metadata__[key])));
  let head = new TextEncoder().encode(JSON.stringify(header));
  head = Uint8Array.from([...head, ...new Array((8 - (head.length % 8)) % 8).fill(0x20)]);
  const data = bytes.subarray(8 + size);
  const out = new Uint8Array(8 + head.length + data.length);
  new DataView(out.buffer).setUint32(0, head.length, true);
  out.set(head, 8);
  out.set(data, 8 + head.length);
  return out;
}
