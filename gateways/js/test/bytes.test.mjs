// Section 3: counts read from the string agree with counts over its UTF-8 bytes, surrogates included.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ByteScratch, promptBytes } from "../dist/bytes.js";

const texts = ["", "abc", "a\nb?\n?", "é?", "日本\n", "\u{1F600}", "\uD800", "\uDC00", "\uD800\uD800\uDC00", "\uD800\uDC00\uDC00",
  "a\uDBFFx\uDFFF\uD83D\uDE00?", "x".repeat(9000) + "é\n" + "y".repeat(9000)];

test("code points, newlines and question marks match the bytes; the cut is the head and tail", () => {
  const scratch = new ByteScratch(8);
  for (const t of texts) {
    const b = new TextEncoder().encode(t);
    const count = (f) => b.reduce((n, x) => n + (f(x) ? 1 : 0), 0);
    for (const got of [promptBytes(t), promptBytes(t, scratch)]) {
      assert.deepEqual(Array.from(got.raw), Array.from(b));
      assert.equal(got.nChars, count((x) => (x & 0xc0) !== 0x80), JSON.stringify(t.slice(0, 20)));
      assert.equal(got.newlines, count((x) => x === 0x0a));
      assert.equal(got.questions, count((x) => x === 0x3f));
      const cut = b.length > 8192 ? [...b.subarray(0, 4096), ...b.subarray(b.length - 4096)] : [...b];
      assert.deepEqual(Array.from(got.cut), cut);
    }
  }
});
