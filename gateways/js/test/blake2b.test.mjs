// BLAKE2b against RFC 7693's test vector and answers computed with Python's hashlib, for each
// engine of F: WebAssembly (Node's default) and JavaScript (where WebAssembly is not compiled).
import { test } from "node:test";
import assert from "node:assert/strict";
import { blake2b, Blake2b, compressJs, compressWasm, ENGINE } from "../dist/blake2b.js";

const hex = (b) => Buffer.from(b).toString("hex");
const enc = (s) => new TextEncoder().encode(s);
const range = (n, times = 1) => Uint8Array.from({ length: n * times }, (_, i) => i % n);
const ENGINES = [["javascript", compressJs], ["webassembly", compressWasm]];

test("Node compiles the WebAssembly engine, and blake2b() uses it", () => {
  assert.ok(compressWasm, "WebAssembly.Module refused the BLAKE2b module");
  assert.equal(ENGINE, "webassembly");
});

for (const [name, engine] of ENGINES) {
  const hash = (data, outLen, key) => hex(new Blake2b(engine).start(outLen, key).update(data).digest());

  test(`${name}: RFC 7693 appendix A: BLAKE2b-512('abc')`, () => {
    assert.equal(hash(enc("abc"), 64),
      "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923");
  });

  test(`${name}: digest lengths, keys, block edges agree with hashlib`, () => {
    assert.equal(hash(new Uint8Array(0), 8), "e4a6a0577479b2b4");
    assert.equal(hash(enc("abc"), 16, enc("k".repeat(32))), "c741392fb3956d217ba181c601bfd493");
    assert.equal(hash(range(256, 3), 64, range(64)),
      "81380d61d438c42eb39629bf670f5e5eda128d8c62eb28668899496fefe844a0631a10cd97654adbe9322bc7582445b557dd14a6aa794b91a74c6ca664e0f877");
    assert.equal(hash(new Uint8Array(128), 8), "2ca5d3f9f96a9545");
    assert.equal(hash(new Uint8Array(129), 8, enc("x")), "f5bb5c46d9e23859");
    assert.equal(hash(new Uint8Array(0), 16, enc("key")), "1bc5b5f140c8cb507a6b0e4adc292525");
  });

  test(`${name}: more blocks than the WebAssembly message area holds at once`, () => {
    // 256 blocks per call into the module: 100,000 bytes cross that edge; hashlib's answer
    assert.equal(hash(range(251, 400).subarray(0, 100000), 32),
      "916cfaa800ee55811e82095babeb88ea29c9ef8a36e8d7e20c7b772c344c9e1c");
  });

  test(`${name}: hashing in parts gives the one-shot digest, at every block edge`, () => {
    const data = range(251, 2).subarray(0, 400);
    for (const n of [0, 1, 127, 128, 129, 255, 256, 257, 400]) {
      for (const key of [undefined, enc("k"), range(64)]) {
        const whole = hash(data.subarray(0, n), 8, key);
        for (const a of [0, 1, 64, 127, 128, 129, n]) {
          for (const b of [a, a + 1, a + 128, n]) {
            if (a > n || b > n || b < a) continue;
            const h = new Blake2b(engine).start(8, key).update(data.subarray(0, a)).update(data, a, b).update(data.subarray(b, n));
            assert.equal(hex(h.digest()), whole, `n ${n}, parts at ${a} and ${b}, key ${key?.length ?? 0}`);
          }
        }
      }
    }
  });
}

test("the engines agree on random inputs, keys and lengths", () => {
  let seed = 7;
  const next = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0);
  for (let i = 0; i < 300; i++) {
    const data = Uint8Array.from({ length: next() % 3000 }, next);
    const key = next() % 3 ? undefined : Uint8Array.from({ length: 1 + (next() % 64) }, next);
    const outLen = 1 + (next() % 64);
    const [a, b] = ENGINES.map(([, e]) => hex(new Blake2b(e).start(outLen, key).update(data).digest()));
    assert.equal(a, b, `input ${i}: ${data.length} bytes, key ${key?.length ?? 0}, ${outLen}-byte digest`);
  }
});

test("bad lengths are refused", () => {
  assert.throws(() => blake2b(new Uint8Array(1), 0), RangeError);
  assert.throws(() => blake2b(new Uint8Array(1), 65), RangeError);
  assert.throws(() => blake2b(new Uint8Array(1), 8, new Uint8Array(65)), RangeError);
});
