/**
 * BLAKE2b (RFC 7693), synchronous, with keys and any digest length up to 64 bytes.
 *
 * WebCrypto has no BLAKE2 and its digests are asynchronous, but a routing decision is
 * synchronous: the knob's mixing draw (section 7), the exploration and canary draws (8.1) and
 * the log's prompt hash (8.2) are BLAKE2b.
 *
 * The compression function F has two engines that give the same bytes. Where the platform
 * compiles WebAssembly (Node), F is the module scripts/wasm.mjs writes at build time (its IV and
 * SIGMA are this file's, in 64-bit words; the unit tests hold the engines to the same bytes):
 * 64-bit words are native there, and it runs at
 * full speed from its first call, which matters for a policy's self-check (section 9 hashes
 * every conformance request's cut twice before V8 has optimised any JavaScript). Where it does
 * not (Cloudflare's workerd refuses to compile WebAssembly from bytes at run time), F is the
 * JavaScript below: 64-bit words are pairs of signed 32-bit halves (low word first, as in RFC
 * 7693's reference code); a 64-bit sum carries when its low half's unsigned value wraps below
 * an addend's; `compress` keeps the sixteen state words in local variables through all twelve
 * rounds, each G written out in full.
 */

import { BLAKE2B_WASM } from "./blake2b-wasm.js";

const IV = new Int32Array([
  0xf3bcc908, 0x6a09e667, 0x84caa73b, 0xbb67ae85, 0xfe94f82b, 0x3c6ef372, 0x5f1d36f1, 0xa54ff53a,
  0xade682d1, 0x510e527f, 0x2b3e6c1f, 0x9b05688c, 0xfb41bd6b, 0x1f83d9ab, 0x137e2179, 0x5be0cd19,
]);

/** Each round's message schedule, as indices of low halves in `m`. */
const SIGMA = Uint8Array.from([
  [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
  [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
  [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
  [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
  [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
  [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
  [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
  [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
  [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
  [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
  [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
  [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
].flat().map((i) => i * 2));

const m = new Int32Array(32);

/** h ^= F(h, the 128-byte block at block[offset], t bytes so far, last?) (RFC 7693 3.2). */
function compressBlock(h: Int32Array, block: Uint8Array, offset: number, t: number, last: boolean): void {
  for (let i = 0; i < 32; i++) {
    const j = offset + i * 4;
    m[i] = block[j] | (block[j + 1] << 8) | (block[j + 2] << 16) | (block[j + 3] << 24);
  }
  let v0 = h[0], v1 = h[1], v2 = h[2], v3 = h[3], v4 = h[4], v5 = h[5], v6 = h[6], v7 = h[7];
  let v8 = h[8], v9 = h[9], v10 = h[10], v11 = h[11], v12 = h[12], v13 = h[13], v14 = h[14], v15 = h[15];
  let v16 = IV[0], v17 = IV[1], v18 = IV[2], v19 = IV[3], v20 = IV[4], v21 = IV[5], v22 = IV[6], v23 = IV[7];
  let v24 = IV[8] ^ (t | 0), v25 = IV[9] ^ ((t / 4294967296) | 0), v26 = IV[10], v27 = IV[11];
  const f = last ? -1 : 0; // the final-block flag inverts word 14 (both of its halves)
  let v28 = IV[12] ^ f, v29 = IV[13] ^ f, v30 = IV[14], v31 = IV[15];
  let lo = 0, x = 0, y = 0;
  for (let s = 0; s < 192; s += 16) {
    // G(v0, v8, v16, v24) with m[s], m[s + 1]
    x = SIGMA[s]; y = SIGMA[s + 1];
    lo = (v0 + v8) | 0; v1 = (v1 + v9 + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = (v0 + m[x]) | 0; v1 = (v1 + m[x + 1] + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = v24 ^ v0; v24 = v25 ^ v1; v25 = lo;
    lo = (v16 + v24) | 0; v17 = (v17 + v25 + ((lo >>> 0) < (v16 >>> 0) ? 1 : 0)) | 0; v16 = lo;
    lo = v8 ^ v16; x = v9 ^ v17; v8 = (lo >>> 24) | (x << 8); v9 = (x >>> 24) | (lo << 8);
    lo = (v0 + v8) | 0; v1 = (v1 + v9 + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = (v0 + m[y]) | 0; v1 = (v1 + m[y + 1] + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = v24 ^ v0; x = v25 ^ v1; v24 = (lo >>> 16) | (x << 16); v25 = (x >>> 16) | (lo << 16);
    lo = (v16 + v24) | 0; v17 = (v17 + v25 + ((lo >>> 0) < (v16 >>> 0) ? 1 : 0)) | 0; v16 = lo;
    lo = v8 ^ v16; x = v9 ^ v17; v8 = (lo << 1) | (x >>> 31); v9 = (x << 1) | (lo >>> 31);
    // G(v2, v10, v18, v26) with m[s + 2], m[s + 3]
    x = SIGMA[s + 2]; y = SIGMA[s + 3];
    lo = (v2 + v10) | 0; v3 = (v3 + v11 + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = (v2 + m[x]) | 0; v3 = (v3 + m[x + 1] + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = v26 ^ v2; v26 = v27 ^ v3; v27 = lo;
    lo = (v18 + v26) | 0; v19 = (v19 + v27 + ((lo >>> 0) < (v18 >>> 0) ? 1 : 0)) | 0; v18 = lo;
    lo = v10 ^ v18; x = v11 ^ v19; v10 = (lo >>> 24) | (x << 8); v11 = (x >>> 24) | (lo << 8);
    lo = (v2 + v10) | 0; v3 = (v3 + v11 + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = (v2 + m[y]) | 0; v3 = (v3 + m[y + 1] + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = v26 ^ v2; x = v27 ^ v3; v26 = (lo >>> 16) | (x << 16); v27 = (x >>> 16) | (lo << 16);
    lo = (v18 + v26) | 0; v19 = (v19 + v27 + ((lo >>> 0) < (v18 >>> 0) ? 1 : 0)) | 0; v18 = lo;
    lo = v10 ^ v18; x = v11 ^ v19; v10 = (lo << 1) | (x >>> 31); v11 = (x << 1) | (lo >>> 31);
    // G(v4, v12, v20, v28) with m[s + 4], m[s + 5]
    x = SIGMA[s + 4]; y = SIGMA[s + 5];
    lo = (v4 + v12) | 0; v5 = (v5 + v13 + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = (v4 + m[x]) | 0; v5 = (v5 + m[x + 1] + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = v28 ^ v4; v28 = v29 ^ v5; v29 = lo;
    lo = (v20 + v28) | 0; v21 = (v21 + v29 + ((lo >>> 0) < (v20 >>> 0) ? 1 : 0)) | 0; v20 = lo;
    lo = v12 ^ v20; x = v13 ^ v21; v12 = (lo >>> 24) | (x << 8); v13 = (x >>> 24) | (lo << 8);
    lo = (v4 + v12) | 0; v5 = (v5 + v13 + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = (v4 + m[y]) | 0; v5 = (v5 + m[y + 1] + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = v28 ^ v4; x = v29 ^ v5; v28 = (lo >>> 16) | (x << 16); v29 = (x >>> 16) | (lo << 16);
    lo = (v20 + v28) | 0; v21 = (v21 + v29 + ((lo >>> 0) < (v20 >>> 0) ? 1 : 0)) | 0; v20 = lo;
    lo = v12 ^ v20; x = v13 ^ v21; v12 = (lo << 1) | (x >>> 31); v13 = (x << 1) | (lo >>> 31);
    // G(v6, v14, v22, v30) with m[s + 6], m[s + 7]
    x = SIGMA[s + 6]; y = SIGMA[s + 7];
    lo = (v6 + v14) | 0; v7 = (v7 + v15 + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = (v6 + m[x]) | 0; v7 = (v7 + m[x + 1] + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = v30 ^ v6; v30 = v31 ^ v7; v31 = lo;
    lo = (v22 + v30) | 0; v23 = (v23 + v31 + ((lo >>> 0) < (v22 >>> 0) ? 1 : 0)) | 0; v22 = lo;
    lo = v14 ^ v22; x = v15 ^ v23; v14 = (lo >>> 24) | (x << 8); v15 = (x >>> 24) | (lo << 8);
    lo = (v6 + v14) | 0; v7 = (v7 + v15 + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = (v6 + m[y]) | 0; v7 = (v7 + m[y + 1] + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = v30 ^ v6; x = v31 ^ v7; v30 = (lo >>> 16) | (x << 16); v31 = (x >>> 16) | (lo << 16);
    lo = (v22 + v30) | 0; v23 = (v23 + v31 + ((lo >>> 0) < (v22 >>> 0) ? 1 : 0)) | 0; v22 = lo;
    lo = v14 ^ v22; x = v15 ^ v23; v14 = (lo << 1) | (x >>> 31); v15 = (x << 1) | (lo >>> 31);
    // G(v0, v10, v20, v30) with m[s + 8], m[s + 9]
    x = SIGMA[s + 8]; y = SIGMA[s + 9];
    lo = (v0 + v10) | 0; v1 = (v1 + v11 + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = (v0 + m[x]) | 0; v1 = (v1 + m[x + 1] + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = v30 ^ v0; v30 = v31 ^ v1; v31 = lo;
    lo = (v20 + v30) | 0; v21 = (v21 + v31 + ((lo >>> 0) < (v20 >>> 0) ? 1 : 0)) | 0; v20 = lo;
    lo = v10 ^ v20; x = v11 ^ v21; v10 = (lo >>> 24) | (x << 8); v11 = (x >>> 24) | (lo << 8);
    lo = (v0 + v10) | 0; v1 = (v1 + v11 + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = (v0 + m[y]) | 0; v1 = (v1 + m[y + 1] + ((lo >>> 0) < (v0 >>> 0) ? 1 : 0)) | 0; v0 = lo;
    lo = v30 ^ v0; x = v31 ^ v1; v30 = (lo >>> 16) | (x << 16); v31 = (x >>> 16) | (lo << 16);
    lo = (v20 + v30) | 0; v21 = (v21 + v31 + ((lo >>> 0) < (v20 >>> 0) ? 1 : 0)) | 0; v20 = lo;
    lo = v10 ^ v20; x = v11 ^ v21; v10 = (lo << 1) | (x >>> 31); v11 = (x << 1) | (lo >>> 31);
    // G(v2, v12, v22, v24) with m[s + 10], m[s + 11]
    x = SIGMA[s + 10]; y = SIGMA[s + 11];
    lo = (v2 + v12) | 0; v3 = (v3 + v13 + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = (v2 + m[x]) | 0; v3 = (v3 + m[x + 1] + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = v24 ^ v2; v24 = v25 ^ v3; v25 = lo;
    lo = (v22 + v24) | 0; v23 = (v23 + v25 + ((lo >>> 0) < (v22 >>> 0) ? 1 : 0)) | 0; v22 = lo;
    lo = v12 ^ v22; x = v13 ^ v23; v12 = (lo >>> 24) | (x << 8); v13 = (x >>> 24) | (lo << 8);
    lo = (v2 + v12) | 0; v3 = (v3 + v13 + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = (v2 + m[y]) | 0; v3 = (v3 + m[y + 1] + ((lo >>> 0) < (v2 >>> 0) ? 1 : 0)) | 0; v2 = lo;
    lo = v24 ^ v2; x = v25 ^ v3; v24 = (lo >>> 16) | (x << 16); v25 = (x >>> 16) | (lo << 16);
    lo = (v22 + v24) | 0; v23 = (v23 + v25 + ((lo >>> 0) < (v22 >>> 0) ? 1 : 0)) | 0; v22 = lo;
    lo = v12 ^ v22; x = v13 ^ v23; v12 = (lo << 1) | (x >>> 31); v13 = (x << 1) | (lo >>> 31);
    // G(v4, v14, v16, v26) with m[s + 12], m[s + 13]
    x = SIGMA[s + 12]; y = SIGMA[s + 13];
    lo = (v4 + v14) | 0; v5 = (v5 + v15 + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = (v4 + m[x]) | 0; v5 = (v5 + m[x + 1] + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = v26 ^ v4; v26 = v27 ^ v5; v27 = lo;
    lo = (v16 + v26) | 0; v17 = (v17 + v27 + ((lo >>> 0) < (v16 >>> 0) ? 1 : 0)) | 0; v16 = lo;
    lo = v14 ^ v16; x = v15 ^ v17; v14 = (lo >>> 24) | (x << 8); v15 = (x >>> 24) | (lo << 8);
    lo = (v4 + v14) | 0; v5 = (v5 + v15 + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = (v4 + m[y]) | 0; v5 = (v5 + m[y + 1] + ((lo >>> 0) < (v4 >>> 0) ? 1 : 0)) | 0; v4 = lo;
    lo = v26 ^ v4; x = v27 ^ v5; v26 = (lo >>> 16) | (x << 16); v27 = (x >>> 16) | (lo << 16);
    lo = (v16 + v26) | 0; v17 = (v17 + v27 + ((lo >>> 0) < (v16 >>> 0) ? 1 : 0)) | 0; v16 = lo;
    lo = v14 ^ v16; x = v15 ^ v17; v14 = (lo << 1) | (x >>> 31); v15 = (x << 1) | (lo >>> 31);
    // G(v6, v8, v18, v28) with m[s + 14], m[s + 15]
    x = SIGMA[s + 14]; y = SIGMA[s + 15];
    lo = (v6 + v8) | 0; v7 = (v7 + v9 + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = (v6 + m[x]) | 0; v7 = (v7 + m[x + 1] + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = v28 ^ v6; v28 = v29 ^ v7; v29 = lo;
    lo = (v18 + v28) | 0; v19 = (v19 + v29 + ((lo >>> 0) < (v18 >>> 0) ? 1 : 0)) | 0; v18 = lo;
    lo = v8 ^ v18; x = v9 ^ v19; v8 = (lo >>> 24) | (x << 8); v9 = (x >>> 24) | (lo << 8);
    lo = (v6 + v8) | 0; v7 = (v7 + v9 + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = (v6 + m[y]) | 0; v7 = (v7 + m[y + 1] + ((lo >>> 0) < (v6 >>> 0) ? 1 : 0)) | 0; v6 = lo;
    lo = v28 ^ v6; x = v29 ^ v7; v28 = (lo >>> 16) | (x << 16); v29 = (x >>> 16) | (lo << 16);
    lo = (v18 + v28) | 0; v19 = (v19 + v29 + ((lo >>> 0) < (v18 >>> 0) ? 1 : 0)) | 0; v18 = lo;
    lo = v8 ^ v18; x = v9 ^ v19; v8 = (lo << 1) | (x >>> 31); v9 = (x << 1) | (lo >>> 31);
  }
  h[0] ^= v0 ^ v16; h[1] ^= v1 ^ v17; h[2] ^= v2 ^ v18; h[3] ^= v3 ^ v19;
  h[4] ^= v4 ^ v20; h[5] ^= v5 ^ v21; h[6] ^= v6 ^ v22; h[7] ^= v7 ^ v23;
  h[8] ^= v8 ^ v24; h[9] ^= v9 ^ v25; h[10] ^= v10 ^ v26; h[11] ^= v11 ^ v27;
  h[12] ^= v12 ^ v28; h[13] ^= v13 ^ v29; h[14] ^= v14 ^ v30; h[15] ^= v15 ^ v31;
}

/** F on `n` whole blocks of `data` from `at`: the first after `t` bytes, each next 128 bytes
 * later; with `last`, one block, the input's final, and `t` the input's length. */
export type Compress = (h: Int32Array, data: Uint8Array, at: number, n: number, t: number, last: boolean) => void;

/** F in JavaScript. */
export const compressJs: Compress = (h, data, at, n, t, last) => {
  for (let i = 0; i < n; i++) {
    if (!last) t += 128;
    compressBlock(h, data, at + 128 * i, t, last);
  }
};

/** F in WebAssembly (scripts/wasm.mjs), or null where the platform will not compile it. */
export const compressWasm: Compress | null = (() => {
  let exports: WebAssembly.Exports;
  try {
    const bytes = Uint8Array.from(atob(BLAKE2B_WASM), (c) => c.charCodeAt(0));
    exports = new WebAssembly.Instance(new WebAssembly.Module(bytes)).exports;
  } catch {
    return null;
  }
  const buffer = (exports.memory as WebAssembly.Memory).buffer;
  const state = new Int32Array(buffer, 0, 16), message = new Uint8Array(buffer, 128, 256 * 128);
  const f = exports.compress as (n: number, t: number, last: number) => void;
  return (h, data, at, n, t, last) => {
    state.set(h); // the 64-bit words' halves, low first: the module's little-endian words
    while (n > 0) {
      const k = Math.min(n, 256);
      message.set(data.subarray(at, at + 128 * k));
      f(k, t, last ? 1 : 0);
      at += 128 * k;
      t += 128 * k;
      n -= k;
    }
    h.set(state);
  };
})();

/** Which engine `Blake2b` uses by default. */
export const ENGINE: "webassembly" | "javascript" = compressWasm ? "webassembly" : "javascript";

/** dst[at...] = src[from..to), by hand: for a part of a block this is faster than a subarray
 * view and `set`, and allocates nothing. */
function copyInto(dst: Uint8Array, at: number, src: Uint8Array, from: number, to: number): void {
  for (let i = from; i < to; i++) dst[at++] = src[i];
}

/** An incremental BLAKE2b: `start`, `update` any number of times, then `digest`. The parts are
 * hashed in place (only a block that straddles two parts is copied). One instance is reused,
 * so nothing is allocated per hash. */
export class Blake2b {
  private readonly h = new Int32Array(16);
  private readonly block = new Uint8Array(128);
  private filled = 0;
  private t = 0;
  private outLen = 0;

  constructor(private readonly compress: Compress = compressWasm ?? compressJs) {}

  start(outLen: number, key?: Uint8Array): this {
    if (outLen < 1 || outLen > 64 || (key && key.length > 64)) throw new RangeError("blake2b: digest 1..64 bytes, key up to 64");
    const keyLen = key ? key.length : 0;
    this.h.set(IV);
    this.h[0] ^= 0x01010000 ^ (keyLen << 8) ^ outLen;
    this.outLen = outLen;
    this.t = 0;
    this.filled = 0;
    if (keyLen) {
      this.block.fill(0);
      this.block.set(key!);
      this.filled = 128;
    }
    return this;
  }

  /** Hash `data` (or its bytes from..to); a full block waits until more data or the digest
   * says whether it is the last. */
  update(data: Uint8Array, from = 0, to = data.length): this {
    let at = from;
    if (this.filled > 0 && at < to) {
      const take = Math.min(128 - this.filled, to - at);
      copyInto(this.block, this.filled, data, at, at + take);
      this.filled += take;
      at += take;
      if (this.filled === 128 && at < to) {
        this.compress(this.h, this.block, 0, 1, this.t, false);
        this.t += 128;
        this.filled = 0;
      }
    }
    const n = Math.floor((to - at - 1) / 128); // whole blocks with more input after them
    if (n > 0) {
      this.compress(this.h, data, at, n, this.t, false);
      this.t += 128 * n;
      at += 128 * n;
    }
    if (at < to) {
      copyInto(this.block, 0, data, at, to);
      this.filled = to - at;
    }
    return this;
  }

  /** Finish with the last block (zero-padded): the state words, whose first outLen bytes,
   * little-endian, are the digest. Valid until the next start. */
  finish(): Int32Array {
    this.block.fill(0, this.filled);
    this.t += this.filled;
    this.compress(this.h, this.block, 0, 1, this.t, true);
    return this.h;
  }

  digest(): Uint8Array {
    const h = this.finish();
    const out = new Uint8Array(this.outLen);
    for (let i = 0; i < out.length; i++) out[i] = h[i >> 2] >>> (8 * (i & 3));
    return out;
  }
}

/** Digest bytes 8i..8i+7 (from `finish`) read big-endian, as a u64 divided by 2^64: the unit
 * draws of sections 7 and 8.1. */
export function unitAt(h: Int32Array, i: number): number {
  return (swap32(h[2 * i]) * 4294967296 + swap32(h[2 * i + 1])) / 18446744073709551616;
}

/** A little-endian word's bytes read big-endian, as an unsigned number. */
function swap32(x: number): number {
  return (((x & 0xff) << 24) | ((x & 0xff00) << 8) | ((x >>> 8) & 0xff00) | (x >>> 24)) >>> 0;
}

const shared = new Blake2b();

/** BLAKE2b of `data`, `outLen` bytes (1..64), keyed with `key` (0..64 bytes). */
export function blake2b(data: Uint8Array, outLen: number, key?: Uint8Array): Uint8Array {
  return shared.start(outLen, key).update(data).digest();
}
