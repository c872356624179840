/**
 * The hot loops of sections 4 and 5 in WebAssembly: word hashing, bucketing and the linear
 * scorer's row sums (scripts/kernel.mjs, assembled at build time).
 *
 * They are most of a decision's time in JavaScript, where a 64-bit key is two 32-bit halves
 * and a multiply four 16-bit limbs, and each weight column one scalar multiply-add. WebAssembly
 * has i64 and f64x2, and runs them at full speed from the first request (a policy's self-check
 * runs before V8 has optimised any JavaScript). Each function mirrors the JavaScript loop it
 * replaces step for step, so both engines give the same bits, and the conformance vectors are
 * run on both (test/conformance.test.mjs). Where the platform will not compile WebAssembly from
 * bytes (Cloudflare's workerd), `Kernel.create` returns null and the JavaScript loops run.
 *
 * One instance per policy: its memory holds the policy's weights and the scratch buffers of
 * one request, whose typed-array views the feature code fills and reads in place.
 */

import { KERNEL_WASM } from "./kernel-wasm.js";
import { ln1p } from "./numbers.js";

/** The counts' and the class tables' addresses (scripts/kernel.mjs TABLES). */
const OUT = 0, NIBBLES = 16, TABLES_END = 128;
/** Counts below this take their ln1p from a table (numbers.ts caches the same range). */
const TF_TABLE = 4096;

export type Engine = "webassembly" | "javascript";

const module: WebAssembly.Module | null = (() => {
  try {
    return new WebAssembly.Module(Uint8Array.from(atob(KERNEL_WASM), (c) => c.charCodeAt(0)));
  } catch {
    return null;
  }
})();

/** The engine a policy's features and scorer use unless told otherwise. */
export const ENGINE: Engine = module ? "webassembly" : "javascript";

interface Exports {
  memory: WebAssembly.Memory;
  words(cut: number, len: number, low: number, bits: number, wh: number, wl: number): number;
  buckets(nWords: number, wh: number, wl: number, bigrams: number, low: number, len: number, grams: number,
    nGrams: number, mask: number, counts: number, touched: number): number;
  row(nt: number, counts: number, touched: number, sorted: number, digits: number, bits: number, passes: number,
    tf: number, idf: number, bc: number, ids: number, vals: number, nS: number): number;
  rowsums32(w: number, c: number, ids: number, vals: number, n: number, r: number): void;
  rowsums64(w: number, c: number, ids: number, vals: number, n: number, r: number): void;
}

/** What a Kernel is sized for. */
export interface KernelLayout {
  nBuckets: number;
  /** touched buckets per request at most */
  maxTouched: number;
  /** row entries at most */
  maxRow: number;
  maxBytes: number;
  charNgrams: number[];
  wordBigrams: boolean;
  nSuites: number;
  idf: Float64Array | null;
  /** the linear scorer's (F, C) weights, or null */
  weights: Float32Array | Float64Array | null;
  columns: number;
}

/** Where a kernel's buffers lie in its memory, in one pass (16-byte aligned), so the memory is
 * grown to `end` once before any view is made: growing detaches the views. */
function plan(layout: KernelLayout) {
  let at = TABLES_END;
  const take = (bytes: number): number => {
    const p = at;
    at += Math.ceil(bytes / 16) * 16;
    return p;
  };
  const { nBuckets, maxTouched, maxRow, maxBytes, columns } = layout;
  const words = maxBytes / 2 + 1;
  const bits = Math.max(1, Math.round(Math.log2(nBuckets)));
  const radixPasses = Math.ceil(bits / 8);
  const radixBits = Math.ceil(bits / radixPasses);
  const addresses = {
    weights: layout.weights ? take(layout.weights.byteLength) : 0,
    counts: take(4 * nBuckets),
    touched: take(4 * (maxTouched + 1)), // + 1: buckets writes one past the last touch
    sorted: take(4 * maxTouched),
    // `words` reads the cut and writes `lower` 16 bytes at a time (take rounds up to 16), and
    // reads a word's last 8 bytes at once, up to 7 past the text (into `bits`; masked off)
    cut: take(maxBytes),
    lower: take(maxBytes),
    bits: take(maxBytes / 8 + 16),
    wordHi: take(4 * words),
    wordLo: take(4 * words),
    ids: take(4 * maxRow),
    vals: take(8 * maxRow),
    bucketCounts: take(4 * maxTouched),
    r: take(8 * Math.max(columns, 1)),
    grams: take(layout.charNgrams.length),
    tf: take(8 * TF_TABLE),
    idf: layout.idf ? take(layout.idf.byteLength) : 0,
    digits: take(4 << radixBits),
  };
  return { ...addresses, words, radixBits, radixPasses, end: at };
}

type Plan = ReturnType<typeof plan>;

export class Kernel {
  readonly counts: Int32Array;
  readonly touched: Int32Array;
  readonly sorted: Int32Array;
  readonly cut: Uint8Array;
  readonly lower: Uint8Array;
  readonly wordHi: Uint32Array;
  readonly wordLo: Uint32Array;
  readonly ids: Int32Array;
  readonly vals: Float64Array;
  readonly bucketCounts: Int32Array;
  readonly r: Float64Array;
  private readonly out: Int32Array;

  private constructor(private readonly x: Exports, private readonly layout: KernelLayout, private readonly at: Plan) {
    const buffer = x.memory.buffer;
    const { nBuckets, maxTouched, maxRow, maxBytes, columns } = layout;
    this.counts = new Int32Array(buffer, at.counts, nBuckets);
    this.touched = new Int32Array(buffer, at.touched, maxTouched);
    this.sorted = new Int32Array(buffer, at.sorted, maxTouched);
    this.cut = new Uint8Array(buffer, at.cut, maxBytes);
    this.lower = new Uint8Array(buffer, at.lower, maxBytes);
    this.wordHi = new Uint32Array(buffer, at.wordHi, at.words);
    this.wordLo = new Uint32Array(buffer, at.wordLo, at.words);
    this.ids = new Int32Array(buffer, at.ids, maxRow);
    this.vals = new Float64Array(buffer, at.vals, maxRow);
    this.bucketCounts = new Int32Array(buffer, at.bucketCounts, maxTouched);
    this.r = new Float64Array(buffer, at.r, Math.max(columns, 1));
    this.out = new Int32Array(buffer, OUT, 4);
  }

  /** A kernel for one policy, or null where WebAssembly is not compiled (or `engine` says not
   * to use it). */
  static create(layout: KernelLayout, nibbles: Uint8Array, engine: Engine = ENGINE): Kernel | null {
    if (engine === "javascript" || !module) return null;
    const x = new WebAssembly.Instance(module, { js: { ln1p } }).exports as unknown as Exports;
    const at = plan(layout);
    const pages = Math.ceil(at.end / 65536) - x.memory.buffer.byteLength / 65536;
    if (pages > 0) x.memory.grow(pages);
    const buffer = x.memory.buffer;
    new Uint8Array(buffer, NIBBLES, nibbles.length).set(nibbles);
    const w = layout.weights;
    if (w) new Uint8Array(buffer, at.weights, w.byteLength).set(new Uint8Array(w.buffer, w.byteOffset, w.byteLength));
    new Uint8Array(buffer, at.grams, layout.charNgrams.length).set(layout.charNgrams);
    const tf = new Float64Array(buffer, at.tf, TF_TABLE);
    for (let c = 0; c < TF_TABLE; c++) tf[c] = ln1p(c);
    if (layout.idf) new Float64Array(buffer, at.idf, layout.idf.length).set(layout.idf);
    return new Kernel(x, layout, at);
  }

  /** 4.1-4.3 on `cut` (copied in unless it is this kernel's): the number of words; word hashes
   * in wordHi/wordLo, the lower-cased bytes in `lower`. */
  words(cut: Uint8Array): number {
    if (cut.buffer !== this.cut.buffer || cut.byteOffset !== this.cut.byteOffset) this.cut.set(cut);
    return this.x.words(this.cut.byteOffset, cut.length, this.lower.byteOffset, this.at.bits,
      this.wordHi.byteOffset, this.wordLo.byteOffset);
  }

  /** After `words`: the words' characters, and the class counts packed as features.ts packs them. */
  get wordChars(): number { return this.out[0]; }
  get digitUpper(): number { return this.out[1]; }
  get punctCode(): number { return this.out[2]; }
  /** After `words`: the cut's newline and question-mark bytes (3.2's counts where it is the whole text). */
  get newlines(): number { return this.out[3] & 0xffff; }
  get questions(): number { return this.out[3] >>> 16; }

  /** 4.4-4.5 after `words`: the number of distinct buckets, listed in `touched`, counted in `counts`. */
  buckets(nWords: number, cutLength: number): number {
    const { layout: l } = this;
    return this.x.buckets(nWords, this.wordHi.byteOffset, this.wordLo.byteOffset, l.wordBigrams ? 1 : 0,
      this.lower.byteOffset, cutLength, this.at.grams, l.charNgrams.length, l.nBuckets - 1,
      this.counts.byteOffset, this.touched.byteOffset);
  }

  /** 4.5-4.6 after `buckets`: the nt touched buckets put in ascending order (in `sorted` when
   * this returns true, else in `touched`), their counts in `bucketCounts` (counters cleared),
   * their ids and tf-idf values in `ids` and `vals` from index `head`. */
  row(nt: number, head: number): boolean {
    return this.x.row(nt, this.counts.byteOffset, this.touched.byteOffset, this.sorted.byteOffset, this.at.digits,
      this.at.radixBits, this.at.radixPasses, this.at.tf, this.at.idf, this.bucketCounts.byteOffset, this.ids.byteOffset + 4 * head,
      this.vals.byteOffset + 8 * head, this.layout.nSuites) !== 0;
  }

  /** 5.1's row sums into `r` over the first n entries of a row (copied in unless they are this
   * kernel's). */
  rowSums(ids: Int32Array, vals: Float64Array, n = ids.length): Float64Array {
    if (ids.buffer !== this.ids.buffer || ids.byteOffset !== this.ids.byteOffset) this.ids.set(ids.subarray(0, n));
    if (vals.buffer !== this.vals.buffer || vals.byteOffset !== this.vals.byteOffset) this.vals.set(vals.subarray(0, n));
    const sum = this.layout.weights instanceof Float32Array ? this.x.rowsums32 : this.x.rowsums64;
    sum(this.at.weights, this.layout.columns, this.ids.byteOffset, this.vals.byteOffset, n, this.r.byteOffset);
    return this.r;
  }
}
