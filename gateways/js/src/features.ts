/**
 * Section 4, "Features": byte classes, lower-casing, word hashes, n-gram keys, buckets,
 * tf-idf and the nine statistics, assembled into the sparse feature row.
 *
 * The hot path allocates no arrays per request: the prompt's bytes, word hashes, bucket counts,
 * the touched buckets and the row live in scratch buffers sized for the largest cut (8192
 * bytes).
 */

import { ByteScratch, MAX_BYTES, PromptBytes, promptBytes } from "./bytes.js";
import { Engine, Kernel } from "./kernel.js";
import { ln1p, ln1pCount, U64 } from "./numbers.js";

export const N_STATS = 9;
export const STAT_NAMES = ["log_chars", "log_words", "log_lines", "digit_frac", "upper_frac", "punct_frac",
  "code_frac", "mean_word_len", "question_marks"];

const DIGIT = 1, UPPER = 2, PUNCT = 4, CODE = 8, ALNUM = 16;
/** 4.1: the classes of every byte value. */
export const CLASS = new Uint8Array(256);
for (let b = 0x30; b <= 0x39; b++) CLASS[b] |= DIGIT | ALNUM;
for (let b = 0x41; b <= 0x5a; b++) CLASS[b] |= UPPER | ALNUM;
for (let b = 0x61; b <= 0x7a; b++) CLASS[b] |= ALNUM;
for (let b = 0x80; b <= 0xff; b++) CLASS[b] |= ALNUM;
for (const c of "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") CLASS[c.charCodeAt(0)] |= PUNCT;
for (const c of "{}()[];=<>_") CLASS[c.charCodeAt(0)] |= CODE;
/** Per byte value, its class counts packed in two words, a count per 16-bit half (digit, upper;
 * punct, code): a cut has at most 8192 bytes, so the halves never carry into each other. */
const DIGIT_UPPER = Int32Array.from(CLASS, (c) => (c & DIGIT ? 1 : 0) + (c & UPPER ? 1 << 16 : 0));
const PUNCT_CODE = Int32Array.from(CLASS, (c) => (c & PUNCT ? 1 : 0) + (c & CODE ? 1 << 16 : 0));
/** The classes as the WebAssembly words loop tests 16 bytes at once (kernel.ts): per class
 * (digit, upper, punct, code, alphanumeric), a table by a byte's low nibble of the high nibbles
 * it has in the class; then the bit of each high nibble (none from 8 up: a byte of 0x80 or more
 * is alphanumeric and nothing else, which the loop tests by its sign). */
export const CLASS_NIBBLES = (() => {
  const out = new Uint8Array(96);
  [DIGIT, UPPER, PUNCT, CODE, ALNUM].forEach((c, i) => {
    for (let b = 0; b < 128; b++) if (CLASS[b] & c) out[16 * i + (b & 15)] |= 1 << (b >> 4);
  });
  for (let h = 0; h < 8; h++) out[80 + h] = 1 << h;
  for (let b = 128; b < 256; b++) if (CLASS[b] !== ALNUM) throw new Error("byte classes: the kernel assumes bytes >= 0x80 are alphanumeric only");
  return out;
})();
/** 4.2: ASCII lower-casing. */
const LOWER = Uint8Array.from(CLASS, (_, b) => (b >= 0x41 && b <= 0x5a ? b + 32 : b));

// 4.5: mix(k) constants as [hi, lo]
const SALT_HI = 0x53845412, SALT_LO = 0x7b096493;
const MIX1_HI = 0xff51afd7, MIX1_LO = 0xed558ccd;
const MIX2_HI = 0xc4ceb9fe, MIX2_LO = 0x1a85ec53;

export interface FeatureSpec {
  suites: string[];
  suiteIndex: Map<string, number>;
  nBuckets: number;
  charNgrams: number[];
  wordBigrams: boolean;
  idf: Float64Array | null;
  statMean: Float64Array | null;
  statStd: Float64Array | null;
}

/** The suite's one-hot column, or -1 (missing, empty or unknown). */
export function suitePosition(spec: FeatureSpec, suite: string | null | undefined): number {
  if (!suite) return -1;
  const i = spec.suiteIndex.get(suite);
  return i === undefined ? -1 : i;
}

/** Each step's output for one request, as the conformance vectors record them. */
export interface FeatureLayers {
  text: PromptBytes;
  wordHi: Uint32Array;
  wordLo: Uint32Array;
  wordChars: number;
  buckets: Int32Array;
  counts: Int32Array;
  textValues: Float64Array;
  stats: Float64Array;
  suitePos: number;
  ids: Int32Array;
  vals: Float64Array;
}

const BYTE_PLACE = [1, 256, 65536, 16777216];

/** out = mix(k) with the given salt (4.5), as [hi, lo]; int32 arithmetic as in bucketOf. */
export function mix(hi: number, lo: number, saltHi: number, saltLo: number, out: U64): void {
  hi = hi ^ saltHi;
  lo = lo ^ saltLo ^ (hi >>> 1);
  let h = (((mulHi(lo, MIX1_LO) + Math.imul(hi, MIX1_LO)) | 0) + Math.imul(lo, MIX1_HI)) | 0;
  const l = Math.imul(lo, MIX1_LO) ^ (h >>> 1);
  h = (((mulHi(l, MIX2_LO) + Math.imul(h, MIX2_LO)) | 0) + Math.imul(l, MIX2_HI)) | 0;
  out[0] = h >>> 0;
  out[1] = (Math.imul(l, MIX2_LO) ^ (h >>> 1)) >>> 0;
}

/** The high 32 bits of a * b for 32-bit a, b (as int32 bits): 16-bit pieces, whose products
 * are below 2^32, so Math.imul's bits are theirs and every sum stays exact. */
function mulHi(a: number, b: number): number {
  const a0 = a & 0xffff, a1 = a >>> 16, b0 = b & 0xffff, b1 = b >>> 16;
  const p01 = Math.imul(a0, b1), p10 = Math.imul(a1, b0);
  const mid = (Math.imul(a0, b0) >>> 16) + (p01 & 0xffff) + (p10 & 0xffff);
  return (Math.imul(a1, b1) + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)) | 0;
}

/** mix(k) & mask: the bucket of a key (4.5), inlined for the hot path (same bits as `mix`, in
 * int32 arithmetic: halves may come in and go round as signed words). */
function bucketOf(hi: number, lo: number, mask: number): number {
  hi = hi ^ SALT_HI;
  lo = lo ^ SALT_LO ^ (hi >>> 1);
  let h = (((mulHi(lo, MIX1_LO) + Math.imul(hi, MIX1_LO)) | 0) + Math.imul(lo, MIX1_HI)) | 0;
  let l = Math.imul(lo, MIX1_LO) ^ (h >>> 1);
  h = (((mulHi(l, MIX2_LO) + Math.imul(h, MIX2_LO)) | 0) + Math.imul(l, MIX2_HI)) | 0;
  l = Math.imul(l, MIX2_LO);
  return (l ^ (h >>> 1)) & mask;
}

/** The most distinct buckets one request can touch: every byte starts at most one key of each
 * of the nine kinds (words, bigrams, seven char n-gram lengths). */
const maxTouched = (nBuckets: number) => Math.min(nBuckets, MAX_BYTES * 9);

/** The WebAssembly loops for a policy's features (and its linear scorer's weights), or null
 * where they are not compiled or `engine` is "javascript". */
export function featureKernel(spec: FeatureSpec, weights: Float32Array | Float64Array | null, columns: number,
  engine?: Engine): Kernel | null {
  const touched = maxTouched(spec.nBuckets);
  return Kernel.create({
    nBuckets: spec.nBuckets, maxTouched: touched, maxRow: 1 + touched + N_STATS, maxBytes: MAX_BYTES,
    charNgrams: spec.charNgrams, wordBigrams: spec.wordBigrams, nSuites: spec.suites.length, idf: spec.idf, weights, columns,
  }, CLASS_NIBBLES, engine);
}

/** Per-policy scratch space, so a decision allocates nothing but the objects it returns; with a
 * kernel, the buffers it reads and writes are views of its memory. */
export class Scratch {
  readonly bytes = new ByteScratch();
  readonly counts: Int32Array;
  readonly touched: Int32Array;
  /** the radix sort's other buffer, and its digit counts */
  readonly sorted: Int32Array;
  readonly digits: Int32Array;
  /** the bits of a bucket id the radix sort orders by per pass, and its passes */
  readonly radixBits: number;
  readonly radixPasses: number;
  /** the row (4.8) and the statistics, when a request's layers are not kept */
  readonly ids: Int32Array;
  readonly vals: Float64Array;
  readonly stats = new Float64Array(N_STATS);
  /** the touched buckets' counts, in the row's order */
  readonly bucketCounts: Int32Array;
  readonly lower: Uint8Array;
  readonly wordHi: Uint32Array;
  readonly wordLo: Uint32Array;
  /** the cut's class counts, packed as DIGIT_UPPER and PUNCT_CODE are */
  digitUpper = 0;
  punctCode = 0;
  nWords = 0;
  wordChars = 0;
  /** after fillRow: the distinct buckets, whether they are ordered in `sorted` (else in
   * `touched`), the suite's column (-1: none) and the row's length */
  nTouched = 0;
  inSorted = false;
  suitePos = -1;
  rowLength = 0;

  constructor(nBuckets: number, readonly kernel: Kernel | null = null) {
    const touched = maxTouched(nBuckets);
    this.counts = kernel ? kernel.counts : new Int32Array(nBuckets);
    this.touched = kernel ? kernel.touched : new Int32Array(touched);
    this.sorted = kernel ? kernel.sorted : new Int32Array(touched);
    this.ids = kernel ? kernel.ids : new Int32Array(1 + touched + N_STATS);
    this.vals = kernel ? kernel.vals : new Float64Array(this.ids.length);
    this.lower = kernel ? kernel.lower : new Uint8Array(MAX_BYTES);
    this.wordHi = kernel ? kernel.wordHi : new Uint32Array(MAX_BYTES / 2 + 1);
    this.wordLo = kernel ? kernel.wordLo : new Uint32Array(MAX_BYTES / 2 + 1);
    this.bucketCounts = kernel ? kernel.bucketCounts : new Int32Array(touched);
    const bits = Math.max(1, Math.round(Math.log2(nBuckets)));
    this.radixPasses = Math.ceil(bits / 8);
    this.radixBits = Math.ceil(bits / this.radixPasses);
    this.digits = new Int32Array(1 << this.radixBits);
  }
}

/** 4.1-4.3 in one pass: class counts, every word hashed into the scratch (s.nWords,
 * s.wordChars), and with `lower` the lower-cased bytes (char n-grams read them). */
function words(cut: Uint8Array, s: Scratch, lower: boolean): void {
  const k = s.kernel;
  if (k) {
    s.nWords = k.words(cut);
    s.wordChars = k.wordChars;
    s.digitUpper = k.digitUpper;
    s.punctCode = k.punctCode;
    return;
  }
  const low = s.lower, wh = s.wordHi, wl = s.wordLo, len = cut.length;
  let n = 0, chars = 0, start = -1, digitUpper = 0, punctCode = 0;
  for (let i = 0; i <= len; i++) {
    let alnum = false;
    if (i < len) {
      const b = cut[i];
      digitUpper += DIGIT_UPPER[b];
      punctCode += PUNCT_CODE[b];
      if (lower) low[i] = LOWER[b];
      alnum = (CLASS[b] & ALNUM) !== 0;
    }
    if (alnum) {
      if (start < 0) start = i;
      continue;
    }
    if (start < 0) continue;
    // Horner from the last byte: h = h P + b, P = 2^40 + 435; the low half as two 16-bit limbs,
    // so every step is 32-bit integer arithmetic (lo P = lo 435 + lo 2^40, the latter all high half)
    let hi = 0, l1 = 0, l0 = 0;
    for (let j = i - 1; j >= start; j--) {
      const t0 = Math.imul(l0, 435) + LOWER[cut[j]]; // < 2^25
      const t1 = Math.imul(l1, 435) + (t0 >>> 16); // < 2^25
      hi = ((((l1 << 24) | (l0 << 8)) + Math.imul(hi, 435)) | 0) + (t1 >>> 16) | 0;
      l0 = t0 & 0xffff;
      l1 = t1 & 0xffff;
    }
    wh[n] = hi;
    wl[n] = (l1 << 16) | l0;
    n++;
    chars += i - start;
    start = -1;
  }
  s.nWords = n;
  s.wordChars = chars;
  s.digitUpper = digitUpper;
  s.punctCode = punctCode;
}

function count(s: Scratch, b: number, nTouched: number): number {
  if (s.counts[b]++ === 0) s.touched[nTouched++] = b;
  return nTouched;
}

/** 4.4-4.5: every n-gram key's bucket, counted; returns the number of distinct buckets. */
function buckets(spec: FeatureSpec, s: Scratch, nWords: number, cutLength: number): number {
  if (s.kernel) return s.kernel.buckets(nWords, cutLength);
  const mask = spec.nBuckets - 1;
  let t = 0;
  const wh = s.wordHi, wl = s.wordLo;
  for (let w = 0; w < nWords; w++) { // word + 1
    const lo = (wl[w] + 1) | 0;
    t = count(s, bucketOf(lo === 0 ? (wh[w] + 1) | 0 : wh[w] | 0, lo, mask), t);
  }
  if (spec.wordBigrams) {
    for (let w = 0; w + 1 < nWords; w++) { // w1 P + w2 + 2 (P = 2^40 + 435), w1's low half in 16-bit limbs
      const l1 = wl[w] | 0, l2 = wl[w + 1] | 0;
      const t0 = Math.imul(l1 & 0xffff, 435) + (l2 & 0xffff) + 2; // < 2^26
      const t1 = Math.imul(l1 >>> 16, 435) + (l2 >>> 16) + (t0 >>> 16); // < 2^26
      const hi = ((((l1 << 8) + Math.imul(wh[w] | 0, 435)) | 0) + (wh[w + 1] | 0) | 0) + (t1 >>> 16) | 0;
      t = count(s, bucketOf(hi, (t1 << 16) | (t0 & 0xffff), mask), t);
    }
  }
  const low = s.lower;
  for (const n of spec.charNgrams) {
    for (let i = 0; i + n <= cutLength; i++) {
      let lo = 0, hi = 0;
      for (let j = 0; j < n; j++) {
        if (j < 4) lo += low[i + j] * BYTE_PLACE[j];
        else hi += low[i + j] * BYTE_PLACE[j - 4];
      }
      t = count(s, bucketOf((hi | (n << 24)) >>> 0, lo, mask), t);
    }
  }
  return t;
}

/** The first n touched buckets put in ascending order (the row's order, 4.8) in one of the
 * scratch buffers; true when that is `sorted`: an LSD radix sort, radixBits of the id per
 * pass, twice as fast as the typed array's sort on a prompt's few hundred buckets. */
function sortTouched(s: Scratch, n: number): boolean {
  let from = s.touched, to = s.sorted;
  const bits = s.radixBits, mask = (1 << bits) - 1, digits = s.digits;
  for (let pass = 0, shift = 0; pass < s.radixPasses; pass++, shift += bits) {
    digits.fill(0);
    for (let i = 0; i < n; i++) digits[(from[i] >>> shift) & mask]++;
    for (let d = 0, at = 0; d < digits.length; d++) {
      const c = digits[d];
      digits[d] = at;
      at += c;
    }
    for (let i = 0; i < n; i++) {
      const b = from[i];
      to[digits[(b >>> shift) & mask]++] = b;
    }
    [from, to] = [to, from];
  }
  return from === s.sorted;
}

/** 4.7: the nine statistics, standardised when the policy scales them. */
function stats(spec: FeatureSpec, text: PromptBytes, s: Scratch, nWords: number, wordChars: number, out: Float64Array): Float64Array {
  const size = Math.max(text.cut.length, 1);
  const digit = s.digitUpper & 0xffff, upper = s.digitUpper >>> 16;
  const punct = s.punctCode & 0xffff, code = s.punctCode >>> 16;
  out[0] = ln1p(text.nChars);
  out[1] = ln1p(nWords);
  out[2] = ln1p(text.newlines);
  out[3] = digit / size;
  out[4] = upper / size;
  out[5] = punct / size;
  out[6] = code / size;
  out[7] = nWords > 0 ? wordChars / nWords : 0;
  out[8] = ln1p(text.questions);
  if (spec.statMean && spec.statStd) {
    for (let i = 0; i < N_STATS; i++) out[i] = (out[i] - spec.statMean[i]) / spec.statStd[i];
  }
  return out;
}

/** 4.5-4.6: the touched buckets in ascending order (the row's order, 4.8), their counts into
 * s.bucketCounts (clearing the counters), their ids and L2-normalised tf-idf values into the
 * row from index `head`. Returns true when the ordered buckets are in s.sorted, else s.touched. */
function textRow(spec: FeatureSpec, s: Scratch, nt: number, head: number): boolean {
  if (s.kernel) return s.kernel.row(nt, head);
  const inSorted = sortTouched(s, nt);
  const touched = inSorted ? s.sorted : s.touched;
  const { ids, vals, bucketCounts } = s;
  const nS = spec.suites.length;
  let sq = 0;
  for (let i = 0; i < nt; i++) {
    const b = touched[i];
    const c = s.counts[b];
    s.counts[b] = 0;
    bucketCounts[i] = c;
    let x = ln1pCount(c);
    if (spec.idf) x = x * spec.idf[b];
    ids[head + i] = nS + b;
    vals[head + i] = x;
    sq = i === 0 ? x * x : sq + x * x;
  }
  const norm = Math.sqrt(sq);
  if (norm > 0) for (let i = 0; i < nt; i++) vals[head + i] = vals[head + i] / norm;
  return inSorted;
}

/** One request through 3.1 to 4.8 into the scratch, with no view made of it: the row is
 * s.ids and s.vals up to s.rowLength, the ordered buckets s.sorted or s.touched (s.inSorted)
 * up to s.nTouched. Returns the prompt's bytes (views of the scratch unless `keep`). */
export function fillRow(prompt: string, suite: string | null | undefined, spec: FeatureSpec, s: Scratch,
  keep = false): PromptBytes {
  const text = promptBytes(prompt, s.bytes, keep, !s.kernel);
  words(text.cut, s, spec.charNgrams.length > 0);
  if (text.newlines < 0) {
    text.newlines = s.kernel!.newlines;
    text.questions = s.kernel!.questions;
  }
  const nt = buckets(spec, s, s.nWords, text.cut.length);
  const pos = suitePosition(spec, suite);
  const head = pos >= 0 ? 1 : 0;
  s.inSorted = textRow(spec, s, nt, head);
  const st = stats(spec, text, s, s.nWords, s.wordChars, s.stats);
  const { ids, vals } = s;
  if (head) {
    ids[0] = pos;
    vals[0] = 1;
  }
  const base = spec.suites.length + spec.nBuckets;
  for (let i = 0; i < N_STATS; i++) {
    ids[head + nt + i] = base + i;
    vals[head + nt + i] = st[i];
  }
  s.nTouched = nt;
  s.suitePos = pos;
  s.rowLength = head + nt + N_STATS;
  return text;
}

/** One request through 3.1 to 4.8, every layer as the conformance vectors record it: views of
 * the scratch, good until its next request, unless `keep` asks for copies. */
export function featureLayers(prompt: string, suite: string | null | undefined, spec: FeatureSpec,
  s: Scratch, keep = false): FeatureLayers {
  const text = fillRow(prompt, suite, spec, s, keep);
  const { nTouched: nt, nWords, suitePos: pos, rowLength: size } = s;
  const head = pos >= 0 ? 1 : 0;
  const own = <T extends Int32Array | Uint32Array | Float64Array>(a: T): T => (keep ? a.slice() as T : a);
  const row = own(s.vals.subarray(0, size));
  return {
    text, suitePos: pos, ids: own(s.ids.subarray(0, size)), vals: row, stats: own(s.stats), wordChars: s.wordChars,
    wordHi: own(s.wordHi.subarray(0, nWords)), wordLo: own(s.wordLo.subarray(0, nWords)),
    buckets: own((s.inSorted ? s.sorted : s.touched).subarray(0, nt)), counts: own(s.bucketCounts.subarray(0, nt)),
    textValues: row.subarray(head, head + nt),
  };
}
