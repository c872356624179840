// Section 2.1: every malformed container is a named error, never a crash or a silent misread.
import { test } from "node:test";
import assert from "node:assert/strict";
import { FormatError, need, readContainer } from "../dist/container.js";

function file(header, body) {
  const text = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(8 + text.length + body.length);
  new DataView(out.buffer).setUint32(0, text.length, true);
  out.set(text, 8);
  out.set(body, 8 + text.length);
  return out;
}
const f64 = (n) => new Uint8Array(new Float64Array(Array.from({ length: n }, (_, i) => i + 0.5)).buffer);

test("a well-formed file reads back", () => {
  const body = new Uint8Array([...f64(2), 7, 0, 0, 0]);
  const { tensors, metadata } = readContainer(file({ __metadata__: { a: "b" }, x: { dtype: "F64", shape: [2], data_offsets: [0, 16] },
    y: { dtype: "I32", shape: [1], data_offsets: [16, 20] } }, body), "t");
  assert.deepEqual(metadata, { a: "b" });
  assert.deepEqual(Array.from(tensors.get("x").data), [0.5, 1.5]);
  assert.deepEqual(Array.from(need(tensors, "y", ["I32"], [1], "t")), [7]);
  assert.throws(() => need(tensors, "y", ["F64"], [1], "t"), /is I32, expected F64/);
  assert.throws(() => need(tensors, "x", ["F64"], [3], "t"), /shape/);
  assert.throws(() => need(tensors, "z", ["F64"], [3], "t"), /missing/);
});

const cases = [
  [new Uint8Array(3), /too short/],
  [(() => { const b = new Uint8Array(10); b[0] = 200; return b; })(), /runs past the file/],
  [file({ x: { dtype: "F99", shape: [1], data_offsets: [0, 8] } }, f64(1)), /dtype/],
  [file({ x: { dtype: "F64", shape: [2], data_offsets: [0, 8] } }, f64(1)), /8 bytes for shape/],
  [file({ x: { dtype: "F64", shape: [1], data_offsets: [8, 16] } }, f64(2)), /expected 0/],
  [file({ x: { dtype: "F64", shape: [2], data_offsets: [0, 16] } }, f64(1)), /truncated/],
  [file({ x: { dtype: "U8", shape: [1], data_offsets: [0, 1] } }, new Uint8Array(9)), /after the last/],
  [file({ x: { dtype: "U8", shape: [-1], data_offsets: [0, 1] } }, new Uint8Array(1)), /shape/],
  [file({ __metadata__: { a: 1 } }, new Uint8Array(0)), /__metadata__/],
  [(() => { const b = file({}, new Uint8Array(0)); b[9] = 0xff; return b; })(), /not JSON/],
];
for (const [i, [bytes, pattern]] of cases.entries()) {
  test(`malformed container ${i} is a FormatError`, () => {
    assert.throws(() => readContainer(bytes, "arrays.safetensors"), (e) => e instanceof FormatError && pattern.test(e.message));
  });
}
