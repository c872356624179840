// Section 1: 64-bit arithmetic in 32-bit halves against BigInt, and the spec's ln1p, exp and
// sigmoid within an ulp of the platform's Math (whose last bit the spec does not rely on).
import { test } from "node:test";
import assert from "node:assert/strict";
import { add64, expNonPositive, ln1p, mul64, mulPAdd, sigmoid, unitOf } from "../dist/numbers.js";

const M = (1n << 64n) - 1n;
const big = (hi, lo) => (BigInt(hi) << 32n) | BigInt(lo);
let seed = 42;
const rand32 = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0), (seed ^ (seed >>> 16)) >>> 0);

test("mul64, mulPAdd and add64 wrap exactly like 64-bit integers", () => {
  const out = [0, 0];
  const edge = [0, 1, 0xffffffff, 0x80000000, 0x7fffffff];
  const pairs = [];
  for (const a of edge) for (const b of edge) pairs.push([a, b]);
  for (let i = 0; i < 20000; i++) pairs.push([rand32(), rand32()]);
  for (let i = 0; i + 1 < pairs.length; i++) {
    const [ahi, alo] = pairs[i], [bhi, blo] = pairs[i + 1];
    mul64(ahi, alo, bhi, blo, out);
    assert.equal(big(out[0], out[1]), (big(ahi, alo) * big(bhi, blo)) & M);
    const b = blo & 0xff;
    mulPAdd(ahi, alo, b, out);
    assert.equal(big(out[0], out[1]), (big(ahi, alo) * 0x100000001b3n + BigInt(b)) & M);
    add64(ahi, alo, bhi, blo, out);
    assert.equal(big(out[0], out[1]), (big(ahi, alo) + big(bhi, blo)) & M);
  }
});

test("a u64 becomes a unit number with one rounding", () => {
  assert.equal(unitOf(0, 0), 0);
  assert.equal(unitOf(0xffffffff, 0xffffffff), 1); // rounds up to 2^64
  assert.equal(unitOf(0x80000000, 0), 0.5);
});

const ulp = (x) => {
  const b = new Float64Array([Math.abs(x)]);
  const u = new BigUint64Array(b.buffer);
  u[0] += 1n;
  return b[0] - Math.abs(x);
};

test("ln1p is within an ulp of Math.log1p, and 0 at 0", () => {
  assert.equal(ln1p(0), 0);
  for (let n = 1; n < 70000; n++) assert.ok(Math.abs(ln1p(n) - Math.log1p(n)) <= ulp(Math.log1p(n)), `n=${n}`);
  for (let e = 0; e < 53; e++) assert.ok(Math.abs(ln1p(2 ** e) - Math.log1p(2 ** e)) <= ulp(Math.log1p(2 ** e)));
});

test("exp is within an ulp of Math.exp, and 0 below -700", () => {
  for (let i = 0; i <= 200000; i++) {
    const x = -745 * (i / 200000);
    const want = x < -700 ? 0 : Math.exp(x);
    assert.ok(Math.abs(expNonPositive(x) - want) <= (x < -700 ? 0 : ulp(want)), `x=${x}`);
  }
});

test("sigmoid is symmetric and monotone", () => {
  assert.equal(sigmoid(0), 0.5);
  assert.equal(sigmoid(-0), 0.5);
  let last = 0;
  for (let t = -40; t <= 40; t += 0.01) {
    const p = sigmoid(t);
    assert.ok(p >= last && Math.abs(p + sigmoid(-t) - 1) < 1e-15);
    last = p;
  }
});
