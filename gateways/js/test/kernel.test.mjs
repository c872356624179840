// The two engines of the hot loops (kernel.ts): WebAssembly and JavaScript give the same bits
// on random and hostile input, for every feature layout and every column count, including the
// ones no fixture policy has (the conformance tests run both engines on published policies).
import { test } from "node:test";
import assert from "node:assert/strict";
import { featureKernel, featureLayers, Scratch } from "../dist/features.js";
import { rowSums } from "../dist/scorer.js";

/** A deterministic generator (mulberry32), so a failure names a reproducible case. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PIECES = ["the", "The", "QUICK", "fox", "x", "42", "3.14", " ", "  ", "\n", "\t", "?", "!", "{", "}", "()", ";", "=",
  "é", "İ", "ς", "日本語", "\u{1F600}", "\u0301", "\u05D0\u05D1", "\0", "\uD800", "a_b", "--", "Über", "ﬁ"];

function prompt(r, n) {
  let s = "";
  for (let i = 0; i < n; i++) s += PIECES[Math.floor(r() * PIECES.length)];
  return s;
}

function spec(r, nBuckets, charNgrams, wordBigrams, withIdf, suites) {
  return {
    suites, suiteIndex: new Map(suites.map((s, i) => [s, i])), nBuckets, charNgrams, wordBigrams,
    idf: withIdf ? Float64Array.from({ length: nBuckets }, () => 0.5 + 3 * r()) : null,
    statMean: null, statStd: null,
  };
}

/** Where the WebAssembly words loop changes step: words of 1 to 70 bytes starting at every
 * offset within its 16-byte blocks, ending on a block's or a 64-bit chunk's last byte or at the
 * end of the text, and cuts of exactly 8192 bytes that end inside a word. */
const EDGES = [
  ...Array.from({ length: 70 * 3 }, (_, i) => " ".repeat(i % 18) + "aB3\u00e9Zz".repeat(12).slice(0, 1 + (i % 70)) + (i % 3 ? "" : "!?")),
  ...Array.from({ length: 70 }, (_, i) => "x".repeat(i + 1)),
  ...[15, 16, 17, 63, 64, 65, 127, 128].flatMap((n) => [" ".repeat(n - 3) + "abc", "q".repeat(n) + " " + "w".repeat(n)]),
  "a ".repeat(4095) + "zz", "b".repeat(8191) + " ", "\u00ff".repeat(4096), "word ".repeat(3000) + "end",
];

const LAYOUTS = [
  [16384, [], true, true], [1 << 10, [3, 4], true, false], [1 << 12, [1, 2, 5, 7], false, true], [2, [6], true, true],
  [1 << 20, [4], true, true], [1, [], false, false],
];

test("features: the engines agree layer by layer on random and hostile prompts", () => {
  const r = rng(7);
  for (const [nBuckets, grams, bigrams, idf] of LAYOUTS) {
    const sp = spec(r, nBuckets, grams, bigrams, idf, ["a", "b"]);
    const kernel = featureKernel(sp, null, 0);
    assert.ok(kernel, "Node compiles the kernel");
    const [wasm, js] = [new Scratch(nBuckets, kernel), new Scratch(nBuckets)];
    const texts = ["", " ", "\0\0", "x".repeat(20000), "ab ".repeat(5000), ...Array.from({ length: 150 }, () => prompt(r, Math.floor(r() * 400))),
      ...EDGES];
    for (const [i, t] of texts.entries()) {
      const suite = ["a", "b", "zzz", null][i % 4];
      // twice through each, kept and not: counters must be left cleared for the next request
      for (const keep of [false, true]) {
        const a = featureLayers(t, suite, sp, wasm, keep), b = featureLayers(t, suite, sp, js, keep);
        const where = `buckets ${nBuckets}, grams [${grams}], prompt ${i}, keep ${keep}`;
        for (const layer of ["wordHi", "wordLo", "buckets", "counts", "ids", "vals", "stats"]) {
          assert.deepEqual(Array.from(a[layer]), Array.from(b[layer]), `${layer}: ${where}`);
        }
        assert.equal(a.wordChars, b.wordChars, where);
        assert.deepEqual([a.text.newlines, a.text.questions], [b.text.newlines, b.text.questions], `newlines, questions: ${where}`);
      }
    }
    assert.ok(wasm.counts.every((c) => c === 0) && js.counts.every((c) => c === 0), "counters cleared");
  }
});

test("row sums: the engines agree to the bit for 1 to 50 columns, F32 and F64 weights", () => {
  const r = rng(11);
  const nBuckets = 256;
  for (let c = 1; c <= 50; c++) {
    for (const Weights of [Float32Array, Float64Array]) {
      const nFeatures = 3 + nBuckets + 9;
      const w = Weights.from({ length: nFeatures * c }, () => (r() - 0.5) * 10 ** Math.floor(r() * 8 - 4));
      const sp = spec(r, nBuckets, [], true, false, ["a", "b", "c"]);
      const kernel = featureKernel(sp, w, c);
      for (const n of [0, 1, 2, 7, 60]) {
        const ids = Int32Array.from({ length: n }, () => Math.floor(r() * nFeatures));
        const vals = Float64Array.from({ length: n }, () => (r() - 0.5) * 10 ** Math.floor(r() * 6 - 3));
        const expected = new Float64Array(c);
        rowSums(w, c, ids, vals, expected);
        const got = kernel.rowSums(ids, vals).subarray(0, c);
        // the same bits, -0 and +0 told apart
        assert.deepEqual(Array.from(got, (x) => Object.is(x, -0) ? "-0" : x), Array.from(expected, (x) => Object.is(x, -0) ? "-0" : x),
          `${c} columns, ${Weights.name}, ${n} entries`);
      }
    }
  }
});

test("a kernel refused by the caller (engine javascript) is not made", () => {
  const sp = spec(rng(1), 16, [], true, false, []);
  assert.equal(featureKernel(sp, null, 0, "javascript"), null);
  assert.ok(featureKernel(sp, null, 0, "webassembly"));
});
