/**
 * BLAKE2b (RFC 7693), synchronous, with keys and any digest length up to 64 bytes.
 *
 * WebCrypto has no BLAKE2 and its digests are asynchronous, but a routing decision is
 * synchronous: the knob's mixing draw (section 7), the exploration and canary draws (8.1) and
 * the log's prompt hash (8.2) are BLAKE2b. 64-bit words are pairs of 32-bit halves in a
 * Uint32Array (low word first), as in RFC 7693's reference code.
 */

const IV = new Uint32Array([
  0xf3bcc908, 0x6a09e667, 0x84caa73b, 0xbb67ae85, 0xfe94f82b, 0x3c6ef372, 0x5f1d36f1, 0xa54ff53a,
  0xade682d1, 0x510e527f, 0x2b3e6c1f, 0x9b05688c, 0xfb41bd6b, 0x1f83d9ab, 0x137e2179, 0x5be0cd19,
]);

const SIGMA = [
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
].map((row) => row.map((i) => i * 2));

const v = new Uint32Array(32);
const m = new Uint32Array(32);

/** The G mixing function on v's words a, b, c, d (indices of low halves) with message words x, y. */
function g(a: number, b: number, c: number, d: number, x: number, y: number): void {
  let alo = v[a], ahi = v[a + 1], blo = v[b], bhi = v[b + 1];
  let clo = v[c], chi = v[c + 1], dlo = v[d], dhi = v[d + 1];
  let t = alo + blo + m[x];
  ahi = (ahi + bhi + m[x + 1] + ((t * 2.3283064365386963e-10) | 0)) >>> 0;
  alo = t >>> 0;
  let xlo = dlo ^ alo, xhi = dhi ^ ahi; // rotr 32
  dlo = xhi >>> 0; dhi = xlo >>> 0;
  t = clo + dlo;
  chi = (chi + dhi + (t > 0xffffffff ? 1 : 0)) >>> 0;
  clo = t >>> 0;
  xlo = blo ^ clo; xhi = bhi ^ chi; // rotr 24
  blo = ((xlo >>> 24) | (xhi << 8)) >>> 0; bhi = ((xhi >>> 24) | (xlo << 8)) >>> 0;
  t = alo + blo + m[y];
  ahi = (ahi + bhi + m[y + 1] + ((t * 2.3283064365386963e-10) | 0)) >>> 0;
  alo = t >>> 0;
  xlo = dlo ^ alo; xhi = dhi ^ ahi; // rotr 16
  dlo = ((xlo >>> 16) | (xhi << 16)) >>> 0; dhi = ((xhi >>> 16) | (xlo << 16)) >>> 0;
  t = clo + dlo;
  chi = (chi + dhi + (t > 0xffffffff ? 1 : 0)) >>> 0;
  clo = t >>> 0;
  xlo = blo ^ clo; xhi = bhi ^ chi; // rotr 63 = rotl 1
  blo = ((xlo << 1) | (xhi >>> 31)) >>> 0; bhi = ((xhi << 1) | (xlo >>> 31)) >>> 0;
  v[a] = alo; v[a + 1] = ahi; v[b] = blo; v[b + 1] = bhi;
  v[c] = clo; v[c + 1] = chi; v[d] = dlo; v[d + 1] = dhi;
}

function compress(h: Uint32Array, block: Uint8Array, offset: number, t: number, last: boolean): void {
  for (let i = 0; i < 16; i++) {
    v[i] = h[i];
    v[i + 16] = IV[i];
  }
  v[24] ^= t % 0x100000000;
  v[25] ^= ((t * 2.3283064365386963e-10) | 0);
  if (last) {
    v[28] = ~v[28];
    v[29] = ~v[29];
  }
  for (let i = 0; i < 32; i++) {
    const j = offset + i * 4;
    m[i] = block[j] | (block[j + 1] << 8) | (block[j + 2] << 16) | (block[j + 3] << 24);
  }
  for (let round = 0; round < 12; round++) {
    const s = SIGMA[round];
    g(0, 8, 16, 24, s[0], s[1]);
    g(2, 10, 18, 26, s[2], s[3]);
    g(4, 12, 20, 28, s[4], s[5]);
    g(6, 14, 22, 30, s[6], s[7]);
    g(0, 10, 20, 30, s[8], s[9]);
    g(2, 12, 22, 24, s[10], s[11]);
    g(4, 14, 16, 26, s[12], s[13]);
    g(6, 8, 18, 28, s[14], s[15]);
  }
  for (let i = 0; i < 16; i++) h[i] = h[i] ^ v[i] ^ v[i + 16];
}

const H = new Uint32Array(16);
const BLOCK = new Uint8Array(128);
const OUT = new Uint8Array(64);

/** BLAKE2b of `data`, `outLen` bytes (1..64), keyed with `key` (0..64 bytes). */
export function blake2b(data: Uint8Array, outLen: number, key: Uint8Array = new Uint8Array(0)): Uint8Array {
  if (outLen < 1 || outLen > 64 || key.length > 64) throw new RangeError("blake2b: digest 1..64 bytes, key up to 64");
  const h = H;
  h.set(IV);
  h[0] ^= 0x01010000 ^ (key.length << 8) ^ outLen;
  let t = 0;
  let at = 0;
  if (key.length) {
    BLOCK.fill(0);
    BLOCK.set(key);
    if (data.length > 0) {
      t = 128;
      compress(h, BLOCK, 0, t, false);
    } else {
      t = 128; // the key block is the last block
      at = -1;
    }
  }
  if (at === 0) {
    while (data.length - at > 128) { // whole blocks with more data after them
      t += 128;
      compress(h, data, at, t, false);
      at += 128;
    }
    const rest = data.length - at;
    BLOCK.fill(0);
    BLOCK.set(data.subarray(at), 0);
    t += rest;
  }
  compress(h, BLOCK, 0, t, true);
  for (let i = 0; i < outLen; i++) OUT[i] = h[i >> 2] >>> (8 * (i & 3));
  return OUT.slice(0, outLen);
}
