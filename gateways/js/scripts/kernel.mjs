// The hot loops of sections 4 and 5 in WebAssembly text, for src/kernel.ts (scripts/wasm.mjs
// assembles it). Each function is the JavaScript loop of src/features.ts or src/scorer.ts that
// it replaces, so the two engines give the same bits:
//
//  - `words` (4.1-4.3): the byte classes 16 bytes at a time, then the words as runs of set bits
//    64 at a time; a word's Horner hash (mod 2^64) is the same as the sum of its bytes times
//    powers of P, which is what this computes, eight bytes at a time, without a branch per byte;
//  - `buckets` (4.4-4.5): 64-bit keys are one i64 each, so the bigram key and mix() are a
//    multiply and an add instead of 16-bit limbs;
//  - `row` (4.5-4.6): the touched buckets sorted, their tf-idf values and the L2 norm (ln1p of
//    a count from a table JavaScript fills with its own ln1p, or from that function itself);
//  - `rowsums32`, `rowsums64` (5.1): each column's ordered sum over the row, two columns per
//    f64x2 lane pair. Every product is an f64 multiply of the value by the weight (an f32 weight
//    widened exactly), every sum an f64 add in row order, the first term the first product, as in
//    JavaScript: SIMD changes how many columns one instruction serves, not any column's rounding
//    (WebAssembly has no fused multiply-add outside relaxed SIMD, which this does not use).
//  - `sigmoids` (1) and `scores` (5.1-5.4, 6): section 1's sigmoid, and a linear scorer's
//    topic, logits, calibrated probabilities and costs from the row sums, with the same
//    operations in the same order as src/numbers.ts, src/scorer.ts and src/calibration.ts (2^k
//    built from its exponent bits, exact for the k that occur), so the same bits. The Python
//    runtime calls them, where these few dozen numbers cost ten times the module's time as
//    Python's floats; V8 runs the TypeScript as fast, so this runtime does not.
//  - `features` and `score_row`: `words`, `buckets`, `row` in one call, and the row sums and
//    `scores` in another, their arguments read from a block in memory: for Python, where each
//    call into the module costs about a microsecond of its own.
//
// The module owns no layout: JavaScript passes every buffer's address. The byte class tables
// live at fixed addresses (TABLES below), written once per instance by src/kernel.ts.

/** Where `words` leaves its counts and src/kernel.ts writes the byte class tables (4.1). */
export const TABLES = { out: 0, nibbles: 16, end: 112 };

const P = "0x100000001b3"; // 2^40 + 435
const SALT = "0x538454127b096493", MIX1 = "0xff51afd7ed558ccd", MIX2 = "0xc4ceb9fe1a85ec53";

/** mix(k) & mask (4.5) as an i32 expression over the i64 expression k (clobbers $k). */
const bucket = (k) => `(local.set $k (i64.xor ${k} (i64.const ${SALT})))
      (local.set $k (i64.mul (i64.xor (local.get $k) (i64.shr_u (local.get $k) (i64.const 33))) (i64.const ${MIX1})))
      (local.set $k (i64.mul (i64.xor (local.get $k) (i64.shr_u (local.get $k) (i64.const 33))) (i64.const ${MIX2})))
      (i32.and (i32.wrap_i64 (i64.xor (local.get $k) (i64.shr_u (local.get $k) (i64.const 33)))) (local.get $mask))`;

/** Count bucket b (an i32 expression) and note it when first touched: written at the end of the
 * list every time and kept only on a first touch, as a branch on it would be mispredicted about
 * as often as a first touch comes (the list has a slot to spare for the write). */
const count = (b) => `(local.set $b ${b})
      (local.set $at (i32.add (local.get $counts) (i32.shl (local.get $b) (i32.const 2))))
      (local.set $c (i32.load (local.get $at)))
      (i32.store (local.get $at) (i32.add (local.get $c) (i32.const 1)))
      (i32.store (i32.add (local.get $touched) (i32.shl (local.get $t) (i32.const 2))) (local.get $b))
      (local.set $t (i32.add (local.get $t) (i32.eqz (local.get $c))))`;

/** P^j mod 2^64 for j = 0..8: a word's hash is the sum of its bytes times these (4.3's Horner
 * step, unrolled eight bytes at a time; 2^64 wrap-around either way). */
const POW = Array.from({ length: 9 }, (_, j) => BigInt.asUintN(64, BigInt(P) ** BigInt(j)));
const hex = (x) => "0x" + x.toString(16);

/** The hash of eight lowered bytes (the i64 expression x, little-endian, byte j times P^j). */
const hash8 = (x) => Array.from({ length: 8 }, (_, j) => {
  const byte = j === 0 ? `(i64.and ${x} (i64.const 255))`
    : j === 7 ? `(i64.shr_u ${x} (i64.const 56))`
    : `(i64.and (i64.shr_u ${x} (i64.const ${8 * j})) (i64.const 255))`;
  return j === 0 ? byte : `(i64.mul ${byte} (i64.const ${hex(POW[j])}))`;
}).reduce((a, b) => `(i64.add ${a} ${b})`);

/** Lanes of the 16 bytes $v in a class: its nibble table (TABLES.nibbles + 16 * index) at the
 * low nibble, against the bit of the high nibble (ASCII only; see src/features.ts). */
const member = (index) => `(i8x16.ne (v128.and (i8x16.swizzle (v128.load offset=${TABLES.nibbles + 16 * index} (i32.const 0)) (local.get $lo))
        (local.get $hiBit)) (v128.const i64x2 0 0))`;
const popcount = (lanes) => `(i32.popcnt (i32.and (i8x16.bitmask ${lanes}) (local.get $keep)))`;

/** 4.1-4.3, in two passes. First, 16 bytes at a time: the class counts (and the newlines and
 * question marks, packed as a count per 16-bit half), the lower-cased bytes
 * into $low, and one bit per byte (alphanumeric or not) into $bits. Then the words are the runs
 * of set bits, found 64 bits at a time; each one's hash is the sum of its bytes times powers of
 * P, eight bytes at a time, which is the Horner step's value (mod 2^64) without its chain of
 * multiplies or a branch per byte. Returns the number of words; leaves the word characters and
 * the packed class counts at TABLES.out. */
const words = `(func $words (export "words") (param $cut i32) (param $len i32) (param $low i32) (param $bits i32) (param $wh i32) (param $wl i32) (result i32)
    (local $i i32) (local $v v128) (local $lo v128) (local $hiBit v128) (local $upper v128) (local $keep i32) (local $m i32)
    (local $du i32) (local $pc i32) (local $nq i32) (local $chars i32) (local $k i32) (local $c i64) (local $carry i64) (local $ev i64)
    (local $e i32) (local $start i32) (local $n i32) (local $q i32) (local $r i32) (local $at i32) (local $h i64)
    (block $classified (loop $block
      (br_if $classified (i32.ge_u (local.get $i) (local.get $len)))
      (local.set $v (v128.load (i32.add (local.get $cut) (local.get $i))))
      (local.set $lo (v128.and (local.get $v) (v128.const i8x16 ${Array(16).fill(15).join(" ")})))
      (local.set $hiBit (i8x16.swizzle (v128.load offset=${TABLES.nibbles + 80} (i32.const 0)) (i8x16.shr_u (local.get $v) (i32.const 4))))
      (local.set $keep (select (i32.const 0xffff) (i32.sub (i32.shl (i32.const 1) (i32.sub (local.get $len) (local.get $i))) (i32.const 1))
        (i32.ge_u (i32.sub (local.get $len) (local.get $i)) (i32.const 16))))
      (local.set $upper ${member(1)})
      (local.set $du (i32.add (local.get $du) (i32.add ${popcount(member(0))} (i32.shl ${popcount("(local.get $upper)")} (i32.const 16)))))
      (local.set $pc (i32.add (local.get $pc) (i32.add ${popcount(member(2))} (i32.shl ${popcount(member(3))} (i32.const 16)))))
      (local.set $nq (i32.add (local.get $nq) (i32.add ${popcount(`(i8x16.eq (local.get $v) (v128.const i8x16 ${Array(16).fill(10).join(" ")}))`)}
        (i32.shl ${popcount(`(i8x16.eq (local.get $v) (v128.const i8x16 ${Array(16).fill(63).join(" ")}))`)} (i32.const 16)))))
      (local.set $m (i32.and (i8x16.bitmask (v128.or ${member(4)} (i8x16.lt_s (local.get $v) (v128.const i64x2 0 0)))) (local.get $keep)))
      (local.set $chars (i32.add (local.get $chars) (i32.popcnt (local.get $m))))
      (i32.store16 (i32.add (local.get $bits) (i32.shr_u (local.get $i) (i32.const 3))) (local.get $m))
      (v128.store (i32.add (local.get $low) (local.get $i))
        (i8x16.add (local.get $v) (v128.and (local.get $upper) (v128.const i8x16 ${Array(16).fill(32).join(" ")}))))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $block)))
    ;; no set bits past the last block, through the last 64-bit chunk read below
    (i64.store (i32.add (local.get $bits) (i32.shr_u (local.get $i) (i32.const 3))) (i64.const 0))
    (local.set $start (i32.const -1))
    (block $scanned (loop $chunk
      (br_if $scanned (i32.gt_u (i32.shl (local.get $k) (i32.const 6)) (local.get $len)))
      (local.set $c (i64.load (i32.add (local.get $bits) (i32.shl (local.get $k) (i32.const 3)))))
      ;; a bit where a byte's class differs from the one before it: a word starts or ends there
      (local.set $ev (i64.xor (local.get $c) (i64.or (i64.shl (local.get $c) (i64.const 1)) (local.get $carry))))
      (local.set $carry (i64.shr_u (local.get $c) (i64.const 63)))
      (block $events (loop $event
        (br_if $events (i64.eqz (local.get $ev)))
        (local.set $e (i32.add (i32.shl (local.get $k) (i32.const 6)) (i32.wrap_i64 (i64.ctz (local.get $ev)))))
        (local.set $ev (i64.and (local.get $ev) (i64.sub (local.get $ev) (i64.const 1))))
        (if (i32.lt_s (local.get $start) (i32.const 0)) (then (local.set $start (local.get $e)) (br $event)))
        ;; the word [start, e): its last 1 to 8 bytes first, then back eight at a time (h P^8 + next)
        (local.set $q (i32.shr_u (i32.sub (i32.sub (local.get $e) (local.get $start)) (i32.const 1)) (i32.const 3)))
        (local.set $at (i32.add (i32.add (local.get $low) (local.get $start)) (i32.shl (local.get $q) (i32.const 3))))
        (local.set $r (i32.sub (i32.add (local.get $low) (local.get $e)) (local.get $at)))
        (local.set $h ${hash8(`(i64.and (i64.load (local.get $at)) (i64.shr_u (i64.const -1)
          (i64.extend_i32_u (i32.and (i32.sub (i32.const 64) (i32.shl (local.get $r) (i32.const 3))) (i32.const 63)))))`)})
        (block $hashed (loop $back
          (br_if $hashed (i32.eqz (local.get $q)))
          (local.set $q (i32.sub (local.get $q) (i32.const 1)))
          (local.set $at (i32.sub (local.get $at) (i32.const 8)))
          (local.set $h (i64.add (i64.mul (local.get $h) (i64.const ${hex(POW[8])})) ${hash8("(i64.load (local.get $at))")}))
          (br $back)))
        (i32.store (i32.add (local.get $wh) (i32.shl (local.get $n) (i32.const 2))) (i32.wrap_i64 (i64.shr_u (local.get $h) (i64.const 32))))
        (i32.store (i32.add (local.get $wl) (i32.shl (local.get $n) (i32.const 2))) (i32.wrap_i64 (local.get $h)))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (local.set $start (i32.const -1))
        (br $event)))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $chunk)))
    (i32.store offset=${TABLES.out} (i32.const 0) (local.get $chars))
    (i32.store offset=${TABLES.out + 4} (i32.const 0) (local.get $du))
    (i32.store offset=${TABLES.out + 8} (i32.const 0) (local.get $pc))
    (i32.store offset=${TABLES.out + 12} (i32.const 0) (local.get $nq))
    (local.get $n))`;

/** The word key at index $w (hi at $wh, lo at $wl) as an i64 expression. */
const wordKey = (w) => `(i64.or (i64.shl (i64.extend_i32_u (i32.load (i32.add (local.get $wh) (i32.shl ${w} (i32.const 2))))) (i64.const 32))
        (i64.extend_i32_u (i32.load (i32.add (local.get $wl) (i32.shl ${w} (i32.const 2))))))`;

/** 4.4-4.5: every key's bucket counted in $counts, first touches listed in $touched; the char
 * n-gram lengths are $nGrams bytes at $grams. Returns the number of distinct buckets. */
const buckets = `(func $buckets (export "buckets") (param $nWords i32) (param $wh i32) (param $wl i32) (param $bigrams i32)
    (param $low i32) (param $len i32) (param $grams i32) (param $nGrams i32) (param $mask i32)
    (param $counts i32) (param $touched i32) (result i32)
    (local $w i32) (local $k i64) (local $b i32) (local $at i32) (local $c i32) (local $t i32)
    (local $g i32) (local $n i32) (local $i i32) (local $j i32) (local $key i64)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $w) (local.get $nWords)))
      ${count(bucket(`(i64.add ${wordKey("(local.get $w)")} (i64.const 1))`))}
      (local.set $w (i32.add (local.get $w) (i32.const 1)))
      (br $next)))
    (if (local.get $bigrams) (then
      (local.set $w (i32.const 1))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $w) (local.get $nWords)))
        ${count(bucket(`(i64.add (i64.add (i64.mul ${wordKey("(i32.sub (local.get $w) (i32.const 1))")} (i64.const ${P})) ${wordKey("(local.get $w)")}) (i64.const 2))`))}
        (local.set $w (i32.add (local.get $w) (i32.const 1)))
        (br $next)))))
    (block $gramsDone (loop $gram
      (br_if $gramsDone (i32.ge_u (local.get $g) (local.get $nGrams)))
      (local.set $n (i32.load8_u (i32.add (local.get $grams) (local.get $g))))
      (local.set $i (i32.const 0))
      (block $done (loop $next
        (br_if $done (i32.gt_u (i32.add (local.get $i) (local.get $n)) (local.get $len)))
        ;; the n bytes little-endian in the key's low bytes, n in its top byte's low bits (4.4)
        (local.set $key (i64.shl (i64.extend_i32_u (local.get $n)) (i64.const 56)))
        (local.set $j (i32.const 0))
        (block $read (loop $byte
          (br_if $read (i32.ge_u (local.get $j) (local.get $n)))
          (local.set $key (i64.or (local.get $key) (i64.shl
            (i64.extend_i32_u (i32.load8_u (i32.add (local.get $low) (i32.add (local.get $i) (local.get $j)))))
            (i64.extend_i32_u (i32.shl (local.get $j) (i32.const 3))))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br $byte)))
        ${count(bucket("(local.get $key)"))}
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (local.set $g (i32.add (local.get $g) (i32.const 1)))
      (br $gram)))
    (local.get $t))`;

/** 4.5-4.6 after `buckets`: the $nt touched buckets sorted ascending (an LSD radix sort, $bits
 * of the id per pass, as features.ts sorts), then each one's count read (and its counter
 * cleared) into $bc, its tf-idf value ln1p(count) (the table at $tf below 4096, the imported
 * ln1p above) times idf (at $idf, when not 0) into $vals with its id $nS + b into $ids, and the
 * values divided by their L2 norm. Returns 1 when the sorted ids ended in $sorted, else 0. */
const row = `(func $row (export "row") (param $nt i32) (param $counts i32) (param $touched i32) (param $sorted i32)
    (param $digits i32) (param $bits i32) (param $passes i32) (param $tf i32) (param $idf i32) (param $bc i32)
    (param $ids i32) (param $vals i32) (param $nS i32) (result i32)
    (local $from i32) (local $to i32) (local $swap i32) (local $pass i32) (local $shift i32) (local $mask i32)
    (local $nd i32) (local $i i32) (local $d i32) (local $at i32) (local $c i32) (local $b i32) (local $p i32)
    (local $x f64) (local $sq f64) (local $norm f64)
    (local.set $from (local.get $touched))
    (local.set $to (local.get $sorted))
    (local.set $nd (i32.shl (i32.const 1) (local.get $bits)))
    (local.set $mask (i32.sub (local.get $nd) (i32.const 1)))
    (block $sortedAll (loop $onePass
      (br_if $sortedAll (i32.ge_u (local.get $pass) (local.get $passes)))
      (memory.fill (local.get $digits) (i32.const 0) (i32.shl (local.get $nd) (i32.const 2)))
      (local.set $i (i32.const 0))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $nt)))
        (local.set $at (i32.add (local.get $digits) (i32.shl (i32.and (i32.shr_u
          (i32.load (i32.add (local.get $from) (i32.shl (local.get $i) (i32.const 2)))) (local.get $shift)) (local.get $mask)) (i32.const 2))))
        (i32.store (local.get $at) (i32.add (i32.load (local.get $at)) (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (local.set $d (i32.const 0))
      (local.set $p (i32.const 0))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $d) (local.get $nd)))
        (local.set $at (i32.add (local.get $digits) (i32.shl (local.get $d) (i32.const 2))))
        (local.set $c (i32.load (local.get $at)))
        (i32.store (local.get $at) (local.get $p))
        (local.set $p (i32.add (local.get $p) (local.get $c)))
        (local.set $d (i32.add (local.get $d) (i32.const 1)))
        (br $next)))
      (local.set $i (i32.const 0))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $nt)))
        (local.set $b (i32.load (i32.add (local.get $from) (i32.shl (local.get $i) (i32.const 2)))))
        (local.set $at (i32.add (local.get $digits) (i32.shl (i32.and (i32.shr_u (local.get $b) (local.get $shift)) (local.get $mask)) (i32.const 2))))
        (local.set $p (i32.load (local.get $at)))
        (i32.store (i32.add (local.get $to) (i32.shl (local.get $p) (i32.const 2))) (local.get $b))
        (i32.store (local.get $at) (i32.add (local.get $p) (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (local.set $swap (local.get $from))
      (local.set $from (local.get $to))
      (local.set $to (local.get $swap))
      (local.set $shift (i32.add (local.get $shift) (local.get $bits)))
      (local.set $pass (i32.add (local.get $pass) (i32.const 1)))
      (br $onePass)))
    (local.set $i (i32.const 0))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $nt)))
      (local.set $b (i32.load (i32.add (local.get $from) (i32.shl (local.get $i) (i32.const 2)))))
      (local.set $at (i32.add (local.get $counts) (i32.shl (local.get $b) (i32.const 2))))
      (local.set $c (i32.load (local.get $at)))
      (i32.store (local.get $at) (i32.const 0))
      (i32.store (i32.add (local.get $bc) (i32.shl (local.get $i) (i32.const 2))) (local.get $c))
      (local.set $x (if (result f64) (i32.lt_u (local.get $c) (i32.const 4096))
        (then (f64.load (i32.add (local.get $tf) (i32.shl (local.get $c) (i32.const 3)))))
        (else (call $ln1p (f64.convert_i32_u (local.get $c))))))
      (if (local.get $idf) (then
        (local.set $x (f64.mul (local.get $x) (f64.load (i32.add (local.get $idf) (i32.shl (local.get $b) (i32.const 3))))))))
      (i32.store (i32.add (local.get $ids) (i32.shl (local.get $i) (i32.const 2))) (i32.add (local.get $nS) (local.get $b)))
      (f64.store (i32.add (local.get $vals) (i32.shl (local.get $i) (i32.const 3))) (local.get $x))
      (local.set $sq (if (result f64) (i32.eqz (local.get $i))
        (then (f64.mul (local.get $x) (local.get $x)))
        (else (f64.add (local.get $sq) (f64.mul (local.get $x) (local.get $x))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (local.set $norm (f64.sqrt (local.get $sq)))
    (if (f64.gt (local.get $norm) (f64.const 0)) (then
      (local.set $i (i32.const 0))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $nt)))
        (local.set $at (i32.add (local.get $vals) (i32.shl (local.get $i) (i32.const 3))))
        (f64.store (local.get $at) (f64.div (f64.load (local.get $at)) (local.get $norm)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))))
    (i32.eq (local.get $from) (local.get $sorted)))`;

/** 5.1's row sums for f32 (bytes 4) or f64 (bytes 8) weights: r[j] for every column j of the
 * (F, c) weights at $w, over the n entries (ids at $ids, values at $vals), into $r. Columns go
 * in groups of 16, 8, 4 and 2 (one f64x2 accumulator per pair), then one at a time. */
function rowsums(name, bytes) {
  const load2 = (addr, off) => bytes === 4
    ? `(f64x2.promote_low_f32x4 (v128.load64_zero offset=${off} ${addr}))`
    : `(v128.load offset=${off} ${addr})`;
  const rowAt = (e) => `(i32.add (local.get $w) (i32.mul (i32.add (i32.mul (i32.load (i32.add (local.get $ids) (i32.shl ${e} (i32.const 2)))) (local.get $c)) (local.get $j)) (i32.const ${bytes})))`;
  const value = (e) => `(f64.load (i32.add (local.get $vals) (i32.shl ${e} (i32.const 3))))`;
  const groups = [16, 8, 4, 2].map((g) => {
    const acc = Array.from({ length: g / 2 }, (_, i) => i);
    return `(block $done${g} (loop $next${g}
      (br_if $done${g} (i32.gt_u (i32.add (local.get $j) (i32.const ${g})) (local.get $c)))
      (local.set $row ${rowAt("(i32.const 0)")})
      (local.set $v (f64x2.splat ${value("(i32.const 0)")}))
      ${acc.map((i) => `(local.set $a${i} (f64x2.mul (local.get $v) ${load2("(local.get $row)", i * 2 * bytes)}))`).join("\n      ")}
      (local.set $e (i32.const 1))
      (block $rowDone (loop $entry
        (br_if $rowDone (i32.ge_u (local.get $e) (local.get $n)))
        (local.set $row ${rowAt("(local.get $e)")})
        (local.set $v (f64x2.splat ${value("(local.get $e)")}))
        ${acc.map((i) => `(local.set $a${i} (f64x2.add (local.get $a${i}) (f64x2.mul (local.get $v) ${load2("(local.get $row)", i * 2 * bytes)})))`).join("\n        ")}
        (local.set $e (i32.add (local.get $e) (i32.const 1)))
        (br $entry)))
      (local.set $out (i32.add (local.get $r) (i32.shl (local.get $j) (i32.const 3))))
      ${acc.map((i) => `(v128.store offset=${i * 16} (local.get $out) (local.get $a${i}))`).join("\n      ")}
      (local.set $j (i32.add (local.get $j) (i32.const ${g})))
      (br $next${g})))`;
  });
  const loadOne = (addr) => bytes === 4 ? `(f64.promote_f32 (f32.load ${addr}))` : `(f64.load ${addr})`;
  const locals = Array.from({ length: 8 }, (_, i) => `(local $a${i} v128)`).join(" ");
  return `(func $${name} (export "${name}") (param $w i32) (param $c i32) (param $ids i32) (param $vals i32) (param $n i32) (param $r i32)
    (local $j i32) (local $e i32) (local $row i32) (local $out i32) (local $v v128) (local $s f64) ${locals}
    (if (i32.eqz (local.get $n)) (then
      (memory.fill (local.get $r) (i32.const 0) (i32.shl (local.get $c) (i32.const 3)))
      (return)))
    ${groups.join("\n    ")}
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $j) (local.get $c)))
      (local.set $s (f64.mul ${value("(i32.const 0)")} ${loadOne(rowAt("(i32.const 0)"))}))
      (local.set $e (i32.const 1))
      (block $rowDone (loop $entry
        (br_if $rowDone (i32.ge_u (local.get $e) (local.get $n)))
        (local.set $s (f64.add (local.get $s) (f64.mul ${value("(local.get $e)")} ${loadOne(rowAt("(local.get $e)"))})))
        (local.set $e (i32.add (local.get $e) (i32.const 1)))
        (br $entry)))
      (f64.store (i32.add (local.get $r) (i32.shl (local.get $j) (i32.const 3))) (local.get $s))
      (local.set $j (i32.add (local.get $j) (i32.const 1)))
      (br $next)))`
    + ")";
}

/** A double as an exact WebAssembly hexadecimal float literal. */
function f64(x) {
  if (x === 0) return "0.0";
  const bits = new DataView(new ArrayBuffer(8));
  bits.setFloat64(0, Math.abs(x));
  const word = bits.getBigUint64(0);
  const exponent = Number(word >> 52n) - 1023;
  const mantissa = (word & ((1n << 52n) - 1n)).toString(16).padStart(13, "0");
  return `${x < 0 ? "-" : ""}0x1.${mantissa}p${exponent}`;
}

/** E[j] = 1 / (13 - j)!, Horner order, as src/numbers.ts has them. */
const EXP_COEFS = Array.from({ length: 14 }, (_, j) => {
  let f = 1;
  for (let i = 2; i <= 13 - j; i++) f *= i;
  return 1 / f;
});

/** Section 1's sigmoid of one double: e = exp(-|t|) by the Taylor polynomial in
 * r = x - k ln 2 (0 below -700), then 1 / (1 + e) for t >= 0, else e / (1 + e). 2^k
 * (-1010 <= k <= 0) is built from its exponent bits: normal, so the product is exact, as the
 * other runtimes' ldexp and pow2. A NaN stays NaN. */
const sigmoid = `(func $sigmoid (param $v f64) (result f64)
    (local $x f64) (local $k f64) (local $r f64) (local $p f64) (local $e f64) (local $d f64)
    (local.set $x (f64.neg (f64.abs (local.get $v))))
    (if (f64.ge (local.get $x) (f64.const ${f64(-700)})) (then
      (local.set $k (f64.floor (f64.add (f64.mul (local.get $x) (f64.const ${f64(1.4426950408889634)})) (f64.const 0.5))))
      (local.set $r (f64.sub (f64.sub (local.get $x) (f64.mul (local.get $k) (f64.const ${f64(0.6931471803691238)})))
        (f64.mul (local.get $k) (f64.const ${f64(1.9082149292705877e-10)}))))
      (local.set $p (f64.const ${f64(EXP_COEFS[0])}))
      ${EXP_COEFS.slice(1).map((c) => `(local.set $p (f64.add (f64.mul (local.get $p) (local.get $r)) (f64.const ${f64(c)})))`).join("\n      ")}
      (local.set $e (f64.mul (local.get $p) (f64.reinterpret_i64 (i64.shl
        (i64.add (i64.trunc_f64_s (local.get $k)) (i64.const 1023)) (i64.const 52)))))))
    (if (f64.ne (local.get $x) (local.get $x)) (then (local.set $e (local.get $x))))
    (local.set $d (f64.add (f64.const 1) (local.get $e)))
    (select (f64.div (f64.const 1) (local.get $d)) (f64.div (local.get $e) (local.get $d))
      (f64.ge (local.get $v) (f64.const 0))))`;

/** The sigmoid of the n doubles at $t, in place. */
const sigmoids = `(func (export "sigmoids") (param $t i32) (param $n i32)
    (local $end i32)
    (local.set $end (i32.add (local.get $t) (i32.shl (local.get $n) (i32.const 3))))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $t) (local.get $end)))
      (f64.store (local.get $t) (call $sigmoid (f64.load (local.get $t))))
      (local.set $t (i32.add (local.get $t) (i32.const 8)))
      (br $next))))`;

const f64at = (base, index) => `(f64.load (i32.add (local.get $${base}) (i32.shl ${index} (i32.const 3))))`;
const J = "(local.get $j)";
const GK = "(i32.add (i32.mul (local.get $g) (local.get $k)) (local.get $j))";

/** Sections 5.1-5.4 and 6 from the row sums at $r (K logits' sums, the difficulty's, then the
 * topic projection's rank sums) for a linear scorer: the topic (the first nearest centroid, -1
 * without topics), the logits z, the calibrated probabilities p and the costs c, written as
 * z[K], p[K], c[K] at $out; returns the topic. The policy's numbers are laid out once per policy
 * (src/kernel.ts does not call this; the Python runtime's kernel.py plans the table): bias[K]
 * at $bias, the request's slope row at $slope, the difficulty's bias at $dbias, Platt's a[K]
 * then b[K] at $platt; with $nt topics of rank $rank at $topics: centroids[nt][rank],
 * half norms[nt], topic bias[nt][K], topic slopes[nt][K], topic difficulty[nt]; the cost model's
 * coef[0] (K) at $coef, coef[1] after it, the request's suite row at $suite (0: none), the
 * floor[K] at $floor, topic coef[nt][K] at $tcoef (0: none). Every sum, product and
 * comparison is the TypeScript's and Python's, in their order. */
const scores = `(func $scores (export "scores") (param $r i32) (param $k i32) (param $bias i32) (param $slope i32)
    (param $dbias i32) (param $platt i32) (param $topics i32) (param $nt i32) (param $rank i32) (param $coef i32)
    (param $suite i32) (param $floor i32) (param $tcoef i32) (param $chars i32) (param $out i32) (result i32)
    (local $j i32) (local $i i32) (local $g i32) (local $proj i32) (local $cent i32) (local $half i32)
    (local $tbias i32) (local $tslope i32) (local $tdiff i32)
    (local $d f64) (local $norm f64) (local $s f64) (local $u f64) (local $best f64) (local $o f64) (local $sl f64)
    (local $z f64) (local $c f64) (local $kchars f64)
    (local.set $d (f64.add ${f64at("r", "(local.get $k)")} (f64.load (local.get $dbias))))
    (local.set $g (i32.const -1))
    (if (i32.gt_s (local.get $nt) (i32.const 0)) (then
      (local.set $proj (i32.add (local.get $r) (i32.shl (i32.add (local.get $k) (i32.const 1)) (i32.const 3))))
      (local.set $cent (local.get $topics))
      (local.set $half (i32.add (local.get $cent) (i32.shl (i32.mul (local.get $nt) (local.get $rank)) (i32.const 3))))
      (local.set $tbias (i32.add (local.get $half) (i32.shl (local.get $nt) (i32.const 3))))
      (local.set $tslope (i32.add (local.get $tbias) (i32.shl (i32.mul (local.get $nt) (local.get $k)) (i32.const 3))))
      (local.set $tdiff (i32.add (local.get $tslope) (i32.shl (i32.mul (local.get $nt) (local.get $k)) (i32.const 3))))
      (local.set $norm (f64.const 0))
      (if (i32.gt_s (local.get $rank) (i32.const 0)) (then
        (local.set $norm (f64.mul ${f64at("proj", "(i32.const 0)")} ${f64at("proj", "(i32.const 0)")}))
        (local.set $i (i32.const 1))
        (block $done (loop $next
          (br_if $done (i32.ge_s (local.get $i) (local.get $rank)))
          (local.set $norm (f64.add (local.get $norm) (f64.mul ${f64at("proj", "(local.get $i)")} ${f64at("proj", "(local.get $i)")})))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $next)))))
      (local.set $norm (f64.sqrt (local.get $norm)))
      (local.set $j (i32.const 0))
      (block $done (loop $next
        (br_if $done (i32.ge_s (local.get $j) (local.get $nt)))
        (local.set $s (f64.const 0))
        (local.set $i (i32.const 0))
        (block $dotDone (loop $dot
          (br_if $dotDone (i32.ge_s (local.get $i) (local.get $rank)))
          (local.set $u ${f64at("proj", "(local.get $i)")})
          (if (f64.gt (local.get $norm) (f64.const 0)) (then (local.set $u (f64.div (local.get $u) (local.get $norm)))))
          (local.set $u (f64.mul ${f64at("cent", "(i32.add (i32.mul (local.get $j) (local.get $rank)) (local.get $i))")} (local.get $u)))
          (local.set $s (select (local.get $u) (f64.add (local.get $s) (local.get $u)) (i32.eqz (local.get $i))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $dot)))
        (local.set $s (f64.sub (local.get $s) ${f64at("half", J)}))
        (if (i32.or (i32.eqz (local.get $j)) (f64.gt (local.get $s) (local.get $best))) (then
          (local.set $best (local.get $s))
          (local.set $g (local.get $j))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $next)))
      (local.set $d (f64.add (local.get $d) ${f64at("tdiff", "(local.get $g)")}))))
    (local.set $kchars (f64.div (f64.convert_i32_s (local.get $chars)) (f64.const 1000)))
    (local.set $j (i32.const 0))
    (block $done (loop $next
      (br_if $done (i32.ge_s (local.get $j) (local.get $k)))
      (local.set $o (f64.add ${f64at("r", J)} ${f64at("bias", J)}))
      (local.set $sl ${f64at("slope", J)})
      (if (i32.ge_s (local.get $g) (i32.const 0)) (then
        (local.set $o (f64.add (local.get $o) ${f64at("tbias", GK)}))
        (local.set $sl (f64.add (local.get $sl) ${f64at("tslope", GK)}))))
      (local.set $z (f64.add (local.get $o) (f64.mul (local.get $d) (local.get $sl))))
      (f64.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 3))) (local.get $z))
      (f64.store (i32.add (local.get $out) (i32.shl (i32.add (local.get $k) (local.get $j)) (i32.const 3)))
        (call $sigmoid (f64.add (f64.mul ${f64at("platt", J)} (local.get $z)) ${f64at("platt", "(i32.add (local.get $k) (local.get $j))")})))
      (local.set $c (f64.add ${f64at("coef", J)} (f64.mul (local.get $kchars) ${f64at("coef", "(i32.add (local.get $k) (local.get $j))")})))
      (if (local.get $suite) (then (local.set $c (f64.add (local.get $c) ${f64at("suite", J)}))))
      (if (i32.and (i32.ne (local.get $tcoef) (i32.const 0)) (i32.ge_s (local.get $g) (i32.const 0))) (then
        (local.set $c (f64.add (local.get $c) ${f64at("tcoef", GK)}))))
      (if (f64.lt (local.get $c) ${f64at("floor", J)}) (then (local.set $c ${f64at("floor", J)})))
      (f64.store (i32.add (local.get $out) (i32.shl (i32.add (i32.shl (local.get $k) (i32.const 1)) (local.get $j)) (i32.const 3)))
        (local.get $c))
      (local.set $j (i32.add (local.get $j) (i32.const 1)))
      (br $next)))
    (local.get $g))`;

/** Argument i of a call, from the block of i32 arguments at $a. */
const arg = (i) => `(i32.load offset=${4 * i} (local.get $a))`;
const args = (from, to) => Array.from({ length: to - from }, (_, i) => arg(from + i)).join(" ");

/** `words`, `buckets` and `row` in one call, their arguments read from a block at $a (for
 * hosts whose calls into the module cost more than the work, as Python's do): words' six at
 * a[0..5], buckets' eleven at a[6..16], row's thirteen at a[17..29] (the counts each passes the
 * next are taken from the calls, not from a[6] and a[17]); the number of words and of buckets
 * are left at a[30] and a[31]; returns row's result. */
const features = `(func (export "features") (param $a i32) (result i32)
    (local $nw i32) (local $nt i32)
    (local.set $nw (call $words ${args(0, 6)}))
    (local.set $nt (call $buckets (local.get $nw) ${args(7, 17)}))
    (i32.store offset=120 (local.get $a) (local.get $nw))
    (i32.store offset=124 (local.get $a) (local.get $nt))
    (call $row (local.get $nt) ${args(18, 30)}))`;

/** The row sums and `scores` in one call: a[0] is 1 for f64 weights (0: f32), rowsums' six
 * arguments at a[1..6], scores' fifteen at a[7..21]; returns the topic. */
const scoreRow = `(func (export "score_row") (param $a i32) (result i32)
    (if ${arg(0)} (then (call $rowsums64 ${args(1, 7)})) (else (call $rowsums32 ${args(1, 7)})))
    (call $scores ${args(7, 22)}))`;

export const KERNEL_WAT = `(module
  (import "js" "ln1p" (func $ln1p (param f64) (result f64)))
  (memory (export "memory") 1)
  ${words}
  ${buckets}
  ${row}
  ${rowsums("rowsums32", 4)}
  ${rowsums("rowsums64", 8)}
  ${sigmoid}
  ${sigmoids}
  ${scores}
  ${features}
  ${scoreRow})
`;
