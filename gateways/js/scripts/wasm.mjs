// BLAKE2b's compression function F (RFC 7693 3.2) in WebAssembly, for src/blake2b.ts: writes
// it as WebAssembly text, assembles it with wabt (the WebAssembly Binary Toolkit) and writes
// src/blake2b-wasm.ts, the module's bytes as base64; does the same for the hot loops of the
// features and the scorer (scripts/kernel.mjs -> src/kernel-wasm.ts). Run by `npm run build`
// before tsc; the output is not committed.
//
// WebAssembly has 64-bit integers, so each word is one i64 and each rotation one i64.rotr,
// where the JavaScript F pairs 32-bit halves and carries by hand. The twelve rounds are written
// out with the sixteen state words and the sixteen message words in locals (registers), as
// every fast BLAKE2b is: a loop over rounds would have to index the message through SIGMA in
// memory, which ran at a third of the speed.
//
// Memory, one 64 KiB page: h (8 words) at 0, the message (whole 128-byte blocks) from 128.
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import initWabt from "wabt";
import { KERNEL_WAT } from "./kernel.mjs";

const IV = ["6a09e667f3bcc908", "bb67ae8584caa73b", "3c6ef372fe94f82b", "a54ff53a5f1d36f1",
  "510e527fade682d1", "9b05688c2b3e6c1f", "1f83d9abfb41bd6b", "5be0cd19137e2179"];
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
];
/** G's four words in each of a round's eight calls: the columns, then the diagonals. */
const LANES = [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15],
  [0, 5, 10, 15], [1, 6, 11, 12], [2, 7, 8, 13], [3, 4, 9, 14]];

const get = (x) => `(local.get $${x})`;
const set = (x, e) => `(local.set $${x} ${e})`;
const add = (...xs) => xs.reduce((a, b) => `(i64.add ${a} ${b})`);
const rotr = (e, n) => `(i64.rotr ${e} (i64.const ${n}))`;
const xor = (a, b) => `(i64.xor ${a} ${b})`;

/** G(a, b, c, d) with message words x, y (RFC 7693 3.1). */
function g([a, b, c, d], x, y) {
  const [va, vb, vc, vd] = [a, b, c, d].map((i) => `v${i}`);
  return [
    set(va, add(get(va), get(vb), get(x))), set(vd, rotr(xor(get(vd), get(va)), 32)),
    set(vc, add(get(vc), get(vd))), set(vb, rotr(xor(get(vb), get(vc)), 24)),
    set(va, add(get(va), get(vb), get(y))), set(vd, rotr(xor(get(vd), get(va)), 16)),
    set(vc, add(get(vc), get(vd))), set(vb, rotr(xor(get(vb), get(vc)), 63)),
  ];
}

function f() {
  const words = Array.from({ length: 16 }, (_, i) => i);
  const body = [
    ...words.map((i) => set(`m${i}`, `(i64.load offset=${8 * i} (local.get $block))`)),
    ...words.slice(0, 8).map((i) => set(`v${i}`, `(i64.load offset=${8 * i} (i32.const 0))`)),
    ...words.slice(8).map((i) => set(`v${i}`, `(i64.const 0x${IV[i - 8]})`)),
    set("v12", xor(get("v12"), get("t"))), // the counter's low word; its high word stays 0
    set("v14", xor(get("v14"), "(i64.sub (i64.const 0) (i64.extend_i32_u (local.get $last)))")),
  ];
  for (let r = 0; r < 12; r++) {
    const s = SIGMA[r % 10];
    LANES.forEach((lane, j) => body.push(...g(lane, `m${s[2 * j]}`, `m${s[2 * j + 1]}`)));
  }
  for (const i of words.slice(0, 8)) {
    body.push(`(i64.store offset=${8 * i} (i32.const 0) ${xor(`(i64.load offset=${8 * i} (i32.const 0))`, xor(get(`v${i}`), get(`v${i + 8}`)))})`);
  }
  const locals = words.map((i) => `(local $v${i} i64) (local $m${i} i64)`).join(" ");
  return `(func $f (param $block i32) (param $t i64) (param $last i32) ${locals}\n    ${body.join("\n    ")})`;
}

const text = `(module
  (memory (export "memory") 1)
  ;; h ^= F(h, the block at $block, $t bytes hashed, $last?)
  ${f()}
  ;; F on $n blocks from 128: the first after $t + 128 bytes, each next 128 bytes later; with $last,
  ;; one block, the input's final, and $t its length (a double below 2^53: no BigInt in JavaScript)
  (func (export "compress") (param $n i32) (param $t f64) (param $last i32)
    (local $at i32) (local $count i64)
    (local.set $at (i32.const 128))
    (local.set $count (i64.trunc_f64_u (local.get $t)))
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $n)))
        (if (i32.eqz (local.get $last)) (then (local.set $count (i64.add (local.get $count) (i64.const 128)))))
        (call $f (local.get $at) (local.get $count) (local.get $last))
        (local.set $at (i32.add (local.get $at) (i32.const 128)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $next)))))
`;

const wabt = await initWabt();
/** Assemble `wat` and write it to src/NAME as `export const CONST = "<base64>"`. */
function emit(wat, name, constName) {
  const module = wabt.parseWat(name.replace(".ts", ".wat"), wat);
  module.validate();
  const { buffer } = module.toBinary({ log: false, write_debug_names: false });
  module.destroy();
  writeFileSync(fileURLToPath(new URL(`../src/${name}`, import.meta.url)),
    "// Generated by scripts/wasm.mjs at `npm run build`: edit that, not this.\n" +
    `export const ${constName}: string = "${Buffer.from(buffer).toString("base64")}";\n`);
}
emit(text, "blake2b-wasm.ts", "BLAKE2B_WASM");
emit(KERNEL_WAT, "kernel-wasm.ts", "KERNEL_WASM");
