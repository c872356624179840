/**
 * Section 1, "Numbers": 64-bit integers as two 32-bit halves, and the spec's ln1p, exp and
 * sigmoid built from correctly rounded double operations only.
 *
 * JavaScript numbers are IEEE-754 doubles and never fuse a multiply and an add, so every
 * double expression here gives the spec's bits when written in the spec's order. 64-bit
 * wrap-around arithmetic uses 32-bit halves (BigInt is an order of magnitude slower): a
 * product of two 32-bit halves is split into 16-bit pieces so every partial sum stays exact.
 */

const TWO32 = 4294967296;

/** A u64 as [hi, lo], each an integer in [0, 2^32). Functions write into `out` to avoid allocation. */
export type U64 = Float64Array | number[];

/** out = a * b mod 2^64: the high half of alo * blo from 16-bit pieces, the rest with Math.imul. */
export function mul64(ahi: number, alo: number, bhi: number, blo: number, out: U64): void {
  const a0 = alo & 0xffff, a1 = alo >>> 16, b0 = blo & 0xffff, b1 = blo >>> 16;
  const p01 = a0 * b1, p10 = a1 * b0; // each < 2^32
  const mid = ((a0 * b0) >>> 16) + (p01 & 0xffff) + (p10 & 0xffff); // < 3 * 2^16
  const hi = a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16); // alo * blo's high half, < 2^32
  out[0] = (hi + Math.imul(ahi, blo) + Math.imul(alo, bhi)) >>> 0;
  out[1] = Math.imul(alo, blo) >>> 0;
}

/** The FNV prime P = 2^40 + 0x1B3 of section 4.3. */
export const P_HI = 0x100;
export const P_LO = 0x1b3;

/** out = h * P + b mod 2^64 (P = 2^40 + 435): one Horner step of a word hash. */
export function mulPAdd(hi: number, lo: number, b: number, out: U64): void {
  const t = lo * 435 + b; // < 2^41, exact
  const carry = (t * 2.3283064365386963e-10) | 0; // t / 2^32 (exact: a power of two), < 2^9
  out[0] = ((lo << 8) + Math.imul(hi, 435) + carry) >>> 0; // (h << 40) adds lo << 8 to the high half
  out[1] = t >>> 0;
}

/** out = a + b mod 2^64. */
export function add64(ahi: number, alo: number, bhi: number, blo: number, out: U64): void {
  const lo = alo + blo;
  const carry = lo >= TWO32 ? 1 : 0;
  out[0] = (ahi + bhi + carry) >>> 0;
  out[1] = lo - carry * TWO32;
}

/** A u64 converted to a double (round to nearest even, once) and divided by 2^64. */
export function unitOf(hi: number, lo: number): number {
  return (hi * TWO32 + lo) / 18446744073709551616;
}

const F64 = new Float64Array(1);
const U32 = new Uint32Array(F64.buffer);
const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const HI = LITTLE ? 1 : 0;
const LO = LITTLE ? 0 : 1;

/** 2^k exactly, for -1022 <= k <= 1023. */
export function pow2(k: number): number {
  U32[HI] = (k + 1023) << 20;
  U32[LO] = 0;
  return F64[0];
}

export const SQRT2 = 1.4142135623730951;
export const LN2_HI = 0.6931471803691238;
export const LN2_LO = 1.9082149292705877e-10;
export const INV_LN2 = 1.4426950408889634;
export const EXP_FLOOR = -700;
/** A[k] = 1 / (25 - 2k): the atanh series of ln1p, Horner order. */
const A = Array.from({ length: 12 }, (_, k) => 1 / (25 - 2 * k));
/** E[j] = 1 / (13 - j)!: the Taylor series of exp, Horner order. */
const E = Array.from({ length: 14 }, (_, j) => {
  let f = 1;
  for (let i = 2; i <= 13 - j; i++) f *= i;
  return 1 / f;
});

/** ln(1 + n) for integers 0 <= n < 2^53, by section 1's algorithm. */
export function ln1p(n: number): number {
  if (n === 0) return 0;
  F64[0] = 1 + n;
  let e = ((U32[HI] >>> 20) & 0x7ff) - 1023;
  U32[HI] = (U32[HI] & 0x800fffff) | (1023 << 20); // the same mantissa with exponent 0: m in [1, 2)
  let m = F64[0];
  if (m > SQRT2) {
    m = m / 2;
    e = e + 1;
  }
  const f = m - 1;
  const s = f / (2 + f);
  const z = s * s;
  let r = A[0];
  for (let k = 1; k < 12; k++) r = r * z + A[k];
  r = r * z;
  const lm = 2 * (s + s * r);
  return e * LN2_HI + (e * LN2_LO + lm);
}

const TF_CACHE = new Float64Array(4096).fill(-1);

/** ln1p of a count, cached for small counts (term frequencies repeat). */
export function ln1pCount(n: number): number {
  if (n < 4096) {
    const v = TF_CACHE[n];
    if (v >= 0) return v;
    return (TF_CACHE[n] = ln1p(n));
  }
  return ln1p(n);
}

/** e^x for x <= 0, by section 1's algorithm. */
export function expNonPositive(x: number): number {
  if (x < EXP_FLOOR) return 0;
  const k = Math.floor(x * INV_LN2 + 0.5);
  const r = (x - k * LN2_HI) - k * LN2_LO;
  let p = E[0];
  for (let j = 1; j < 14; j++) p = p * r + E[j];
  return p * pow2(k);
}

/** 1 / (1 + e^-t), as section 1 computes it. */
export function sigmoid(t: number): number {
  const e = expNonPositive(-Math.abs(t));
  return t >= 0 ? 1 / (1 + e) : e / (1 + e);
}
