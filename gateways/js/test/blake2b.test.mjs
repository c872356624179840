// BLAKE2b against RFC 7693's test vector and answers computed with Python's hashlib.
import { test } from "node:test";
import assert from "node:assert/strict";
import { blake2b, Blake2b } from "../dist/blake2b.js";

const hex = (b) => Buffer.from(b).toString("hex");
const enc = (s) => new TextEncoder().encode(s);
const range = (n, times = 1) => Uint8Array.from({ length: n * times }, (_, i) => i % n);

test("RFC 7693 appendix A: BLAKE2b-512('abc')", () => {
  assert.equal(hex(blake2b(enc("abc"), 64)),
    "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923");
});

test("digest lengths, keys, block edges agree with hashlib", () => {
  assert.equal(hex(blake2b(new Uint8Array(0), 8)), "e4a6a0577479b2b4");
  assert.equal(hex(blake2b(enc("abc"), 16, enc("k".repeat(32)))), "c741392fb3956d217ba181c601bfd493");
  assert.equal(hex(blake2b(range(256, 3), 64, range(64))),
    "81380d61d438c42eb39629bf670f5e5eda128d8c62eb28668899496fefe844a0631a10cd97654adbe9322bc7582445b557dd14a6aa794b91a74c6ca664e0f877");
  assert.equal(hex(blake2b(new Uint8Array(128), 8)), "2ca5d3f9f96a9545");
  assert.equal(hex(blake2b(new Uint8Array(129), 8, enc("x"))), "f5bb5c46d9e23859");
  assert.equal(hex(blake2b(new Uint8Array(0), 16, enc("key"))), "1bc5b5f140c8cb507a6b0e4adc292525");
});

test("bad lengths are refused", () => {
  assert.throws(() => blake2b(new Uint8Array(1), 0), RangeError);
  assert.throws(() => blake2b(new Uint8Array(1), 65), RangeError);
  assert.throws(() => blake2b(new Uint8Array(1), 8, new Uint8Array(65)), RangeError);
});

test("hashing in parts gives the one-shot digest, at every block edge", () => {
  const data = range(251, 2).subarray(0, 400);
  for (const n of [0, 1, 127, 128, 129, 255, 256, 257, 400]) {
    for (const key of [undefined, enc("k"), range(64)]) {
      const whole = hex(blake2b(data.subarray(0, n), 8, key));
      for (const a of [0, 1, 64, 127, 128, 129, n]) {
        for (const b of [a, a + 1, a + 128, n]) {
          if (a > n || b > n || b < a) continue;
          const h = new Blake2b().start(8, key).update(data.subarray(0, a)).update(data, a, b).update(data.subarray(b, n));
          assert.equal(hex(h.digest()), whole, `n ${n}, parts at ${a} and ${b}, key ${key?.length ?? 0}`);
        }
      }
    }
  }
});
