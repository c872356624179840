/**
 * Section 9, "Conformance vectors": run every request of a policy's vectors through this
 * runtime and compare each layer, in the spec's order, so a mismatch names the first step
 * that differs. A runtime that disagrees refuses the policy.
 */

import { blake2b } from "./blake2b.js";
import { FormatError, readContainer, Tensor, Typed } from "./container.js";
import { decidePoint, deriveKey, explore, ExplorationOptions, unitDraw } from "./decision.js";
import { mix } from "./features.js";
import { mixingDraw, pointFor } from "./knob.js";
import { Budget, budgetModel, decideBudget, defaultFor, KINDS, Latency, LatencyKind, predict } from "./latency.js";
import { LiveLatency, liveMove, liveSettings } from "./live.js";
import { Policy, VECTORS } from "./policy.js";

export const FORMAT = "routeopt.conformance/1";
const EXACT = 0, CLOSE = 1;

/** layer -> [tensor, comparison], in the spec's order. */
const LAYERS: [string, [string, number][]][] = [
  ["bytes", [["bytes.utf8_len", EXACT], ["bytes.n_chars", EXACT], ["bytes.newlines", EXACT], ["bytes.questions", EXACT], ["bytes.cut_digest", EXACT]]],
  ["words", [["words.count", EXACT], ["words.chars", EXACT], ["words.digest", EXACT]]],
  ["buckets", [["buckets.distinct", EXACT], ["buckets.total", EXACT], ["buckets.digest", EXACT]]],
  ["features", [["features.suite", EXACT], ["features.stats", CLOSE]]],
  ["scores", [["scores.logits", CLOSE], ["scores.topic", EXACT]]],
  ["calibration", [["calibration.p", CLOSE]]],
  ["cost", [["cost.c", CLOSE]]],
  ["knob", [["knob.point", EXACT], ["knob.unit", EXACT]]],
  ["decision", [["decision.model", EXACT], ["decision.fallbacks", EXACT], ["decision.propensity", CLOSE]]],
  ["latency", [["latency.pred", CLOSE]]],
  ["budget", [["budget.model", EXACT], ["budget.fallbacks", EXACT], ["budget.met", EXACT], ["budget.propensity", CLOSE]]],
  ["live", [["live.model", EXACT], ["live.moved", EXACT]]],
  ["gateway", [["gateway.draws", EXACT], ["gateway.arm", EXACT], ["gateway.model", EXACT], ["gateway.explored", EXACT],
    ["gateway.eligible", EXACT], ["gateway.propensity", CLOSE]]],
];

const LAYER_NAMES = new Set(LAYERS.map(([name]) => name));
/** requests decided at each time of the live case */
const LIVE_REQUESTS = 64;
/** live.obs's columns: t, candidate, ttft, latency, predicted ttft, predicted latency (NaN: none) */
const OBS_COLUMNS = 6;

export interface ConformanceReport {
  ok: boolean;
  requests: number;
  layers: string[];
  mismatches: Record<string, number>;
  /** the first step that differs, and where */
  first: string | null;
  maxRelativeError: number;
  ms: number;
}

export interface VectorInput { text: string; suite: string | null; requestId: string }

interface Meta {
  format: string; requests: number; candidates: string[]; targets: number[]; detail: number; tolerance: number;
  layers: string[]; suites: (string | null)[];
  /** (format 4) the [kind, budget_s, target] cases of the budget layer; ["default", null,
   * target] decides each request under its suite's default budget */
  budgets?: [string, number | null, number][];
  /** (format 4) the live layer's case: observations are the input tensor live.obs */
  live?: { settings: { window_s: number; max_observations: number; min_observations: number; slow_factor?: number }; kind: string;
    budget_s: number; target: number; times: number[] };
  gateway: { exploration: { rate: number; exclude: string[]; max_cost_usd: number | null; max_cost_ratio: number | null; seed: string };
    canary: { share: number; seed: string } };
}

/** Generalised UTF-8 -> a string of UTF-16 code units (a surrogate's 3-byte form is that unit). */
export function decodeWtf8(b: Uint8Array): string {
  const units: number[] = [];
  let out = "";
  for (let i = 0; i < b.length;) {
    const x = b[i];
    let cp: number;
    if (x < 0x80) { cp = x; i += 1; }
    else if (x < 0xe0) { cp = ((x & 0x1f) << 6) | (b[i + 1] & 0x3f); i += 2; }
    else if (x < 0xf0) { cp = ((x & 0x0f) << 12) | ((b[i + 1] & 0x3f) << 6) | (b[i + 2] & 0x3f); i += 3; }
    else { cp = ((x & 0x07) << 18) | ((b[i + 1] & 0x3f) << 12) | ((b[i + 2] & 0x3f) << 6) | (b[i + 3] & 0x3f); i += 4; }
    if (cp >= 0x10000) units.push(0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
    else units.push(cp);
    if (units.length > 8192) { out += String.fromCharCode(...units); units.length = 0; }
  }
  return out + String.fromCharCode(...units);
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** decodeWtf8, by the platform's decoder when the bytes are plain UTF-8 (no surrogates): the
 * same string, faster. */
function decodeText(b: Uint8Array): string {
  try {
    return utf8.decode(b);
  } catch {
    return decodeWtf8(b);
  }
}

function readInputs(t: Map<string, Tensor>, meta: Meta): VectorInput[] {
  const get = (name: string) => {
    const x = t.get(name);
    if (!x) throw new FormatError(`${VECTORS}: tensor ${JSON.stringify(name)} is missing`);
    return x.data;
  };
  const text = get("input.text") as Uint8Array, spans = get("input.spans") as Uint32Array;
  const suite = get("input.suite") as Int32Array, rid = get("input.request_id") as Uint8Array;
  const ridOff = get("input.request_id_offsets") as Uint32Array;
  const out: VectorInput[] = [];
  for (let i = 0; i < meta.requests; i++) {
    const [at, a, b, rep, c] = spans.subarray(i * 5, i * 5 + 5);
    if (at + a + b + c > text.length || suite[i] < 0 || suite[i] >= meta.suites.length) throw new FormatError(`${VECTORS}: request ${i} points outside the inputs`);
    const part = (s: number, n: number) => decodeText(text.subarray(s, s + n));
    out.push({ text: part(at, a) + part(at + a, b).repeat(rep) + part(at + a + b, c), suite: meta.suites[suite[i]],
      requestId: decodeText(rid.subarray(ridOff[i], ridOff[i + 1])) });
  }
  return out;
}

function digestInto(out: Uint8Array, i: number, data: Uint8Array): void {
  out.set(blake2b(data, 8), i * 8);
}

const G_HI = 0x9e3779b9, G_LO = 0x7f4a7c15, SALT11_HI = 0xcc623af8, SALT11_LO = 0x783354e7;
const m = new Float64Array(2);

/** Section 9's sequence digest of u64 values (hi, lo), as 8 little-endian bytes at out[i*8]
 * (64-bit sums in int32 halves: a low half carries when it wraps below an addend). */
function sequenceDigest(hi: ArrayLike<number>, lo: ArrayLike<number>, out: Uint8Array, i: number): void {
  let accHi = 0, accLo = 0, posHi = 0, posLo = 0;
  for (let j = 0; j < hi.length; j++) {
    posLo = (posLo + G_LO) | 0;
    posHi = (posHi + G_HI + ((posLo >>> 0) < G_LO ? 1 : 0)) | 0;
    const xLo = (lo[j] + posLo) | 0;
    mix((hi[j] + posHi + ((xLo >>> 0) < (posLo >>> 0) ? 1 : 0)) | 0, xLo, SALT11_HI, SALT11_LO, m);
    const sum = (accLo + m[1]) | 0;
    accHi = (accHi + m[0] + ((sum >>> 0) < m[1] ? 1 : 0)) | 0;
    accLo = sum;
  }
  const dv = new DataView(out.buffer, out.byteOffset + i * 8, 8);
  dv.setInt32(0, accLo, true);
  dv.setInt32(4, accHi, true);
}

/** Every layer's values for the inputs, as this runtime computes them. */
async function compute(policy: Policy, inputs: VectorInput[], meta: Meta, want: Map<string, Tensor>): Promise<Map<string, Typed>> {
  const n = inputs.length, k = policy.candidates.length, T = meta.targets.length;
  const got = new Map<string, Typed>();
  const mk = <A extends Typed>(name: string, a: A): A => (got.set(name, a), a);
  const u32 = (name: string, w = 1) => mk(name, new Uint32Array(n * w));
  const f64 = (name: string, w = 1) => mk(name, new Float64Array(n * w));
  const [utf8, chars, nl, qs, words, wchars, distinct, total] = ["bytes.utf8_len", "bytes.n_chars", "bytes.newlines", "bytes.questions",
    "words.count", "words.chars", "buckets.distinct", "buckets.total"].map((x) => u32(x));
  const cutD = mk("bytes.cut_digest", new Uint8Array(n * 8)), wordD = mk("words.digest", new Uint8Array(n * 8));
  const bucketD = mk("buckets.digest", new Uint8Array(n * 8));
  const suitePos = mk("features.suite", new Int32Array(n)), stats = f64("features.stats", 9);
  const logits = f64("scores.logits", k), topic = mk("scores.topic", new Int32Array(n));
  const P = f64("calibration.p", k), C = f64("cost.c", k), unit = f64("knob.unit");
  const model = mk("decision.model", new Uint16Array(n * T)), props = f64("decision.propensity", T);
  const fb = mk("decision.fallbacks", new Uint16Array(n * T * (k - 1)));
  const detail: number[][] = [[], [], []];
  const detailOffsets = [0];
  const points = meta.targets.map((x) => pointFor(policy.knob, x));
  for (let i = 0; i < n; i++) {
    const { text, suite } = inputs[i];
    const s = policy.scoreRequest(text, suite); // the layers are views, read before the next request
    const L = s.layers;
    utf8[i] = L.text.utf8Len; chars[i] = L.text.nChars; nl[i] = L.text.newlines; qs[i] = L.text.questions;
    digestInto(cutD, i, L.text.cut);
    words[i] = L.wordHi.length; wchars[i] = L.wordChars;
    sequenceDigest(L.wordHi, L.wordLo, wordD, i);
    let tot = 0;
    for (let j = 0; j < L.buckets.length; j++) tot += L.counts[j];
    distinct[i] = L.buckets.length; total[i] = tot;
    sequenceDigest(L.buckets, L.counts, bucketD, i);
    if (i < meta.detail) {
      for (let j = 0; j < L.buckets.length; j++) { detail[0].push(L.buckets[j]); detail[1].push(L.counts[j]); detail[2].push(L.textValues[j]); }
      detailOffsets.push(detail[0].length);
    }
    suitePos[i] = L.suitePos; stats.set(L.stats, i * 9);
    logits.set(s.z, i * k); topic[i] = s.topic; P.set(s.p, i * k); C.set(s.c, i * k);
    const u = (unit[i] = mixingDraw(L.text.cut, suite));
    const draw = () => u;
    for (let t = 0; t < T; t++) {
      const ch = decidePoint(policy.knob, points[t], s.p, s.c, draw);
      model[i * T + t] = ch.pick; props[i * T + t] = ch.propensity;
      fb.set(ch.fallbacks, (i * T + t) * (k - 1));
    }
  }
  got.set("detail.offsets", Uint32Array.from(detailOffsets));
  got.set("detail.buckets", Uint32Array.from(detail[0]));
  got.set("detail.counts", Uint32Array.from(detail[1]));
  got.set("detail.values", Float64Array.from(detail[2]));
  got.set("knob.point", Int32Array.from(meta.targets, (x) => policy.knob.points.findIndex((p) => p.certified >= x - 1e-12)));
  await gateway(policy, inputs, meta, got);
  if (policy.latency) budgets(policy, inputs, meta, got);
  if (meta.layers.includes("live")) live(policy, meta, want, got);
  return got;
}

/** 8.4 for the first requests: decided under the live case's budget, then moved at each of its
 * times after observing every row of live.obs up to that time (t, candidate, ttft, latency,
 * predicted ttft, predicted latency; NaN: no prediction), each decision held to its limit (the
 * serving tier's mask, or the budget with no tier). */
function live(policy: Policy, meta: Meta, want: Map<string, Tensor>, got: Map<string, Typed>): void {
  const lat = policy.latency!, names = policy.candidates, k = names.length;
  const c = meta.live, obs = want.get("live.obs");
  const bad = (why: string) => new FormatError(`${VECTORS}: the live case ${why}`);
  if (!c || typeof c !== "object") throw bad("is missing from the metadata");
  const model = KINDS.includes(c.kind as LatencyKind) ? budgetModel(lat, c.kind as LatencyKind) : null;
  if (!model || !(c.budget_s > 0) || !Number.isFinite(c.target) || !Array.isArray(c.times) || !c.times.every(Number.isFinite)) {
    throw bad(`${JSON.stringify({ kind: c.kind, budget_s: c.budget_s, target: c.target })} is not one this policy can decide`);
  }
  let settings;
  try {
    const s = c.settings ?? {};
    settings = liveSettings({ windowS: s.window_s, maxObservations: s.max_observations, minObservations: s.min_observations,
      slowFactor: s.slow_factor });
  } catch (e) {
    throw bad(`has bad settings: ${(e as Error).message}`);
  }
  if (!obs || obs.dtype !== "F64" || obs.shape.length !== 2 || obs.shape[1] !== OBS_COLUMNS) {
    throw bad(`needs live.obs, F64 (M x ${OBS_COLUMNS})`);
  }
  const rows = obs.data as Float64Array;
  for (let r = 0; r < obs.shape[0]; r++) {
    const j = rows[r * OBS_COLUMNS + 1];
    if (!(Number.isInteger(j) && j >= 0 && j < k)) throw bad(`observation ${r} names candidate ${j}, not one of ${k}`);
  }
  const kind = c.kind as LatencyKind, budget = { kind, budgetS: c.budget_s };
  const n = Math.min(LIVE_REQUESTS, meta.requests), M = lat.models.length, at = lat.models.indexOf(model);
  const P = got.get("calibration.p") as Float64Array, C = got.get("cost.c") as Float64Array, U = got.get("knob.unit") as Float64Array;
  const pred = got.get("latency.pred") as Float64Array;
  const byName = (a: Float64Array) => Object.fromEntries(names.map((x, j) => [x, a[j]]));
  const decided = Array.from({ length: n }, (_, i) => {
    const pi = pred.subarray((i * M + at) * k, (i * M + at + 1) * k), p = P.subarray(i * k, i * k + k);
    const ch = decideBudget(lat, budget, c.target, p, C.subarray(i * k, i * k + k), pi, () => U[i]);
    return { model: names[ch.pick], fallbacks: Array.from(ch.fallbacks, (j) => names[j]), p: byName(p), predictedS: byName(pi),
      limitS: ch.tier?.maskS ?? budget.budgetS };
  });
  const T = c.times.length, models = new Uint16Array(T * n), moved = new Uint8Array(T * n);
  const seen = new LiveLatency(settings);
  const optional = (v: number) => (Number.isNaN(v) ? null : v);
  let r = 0;
  c.times.forEach((now, t) => {
    for (; r < obs.shape[0] && rows[r * OBS_COLUMNS] <= now; r++) {
      const o = rows.subarray(r * OBS_COLUMNS, (r + 1) * OBS_COLUMNS);
      seen.observe(names[o[1]], o[0], o[2], o[3], optional(o[4]), optional(o[5]));
    }
    const slow = seen.slow(names, kind, now);
    decided.forEach((d, i) => {
      const move = liveMove(d.model, d.fallbacks, names, d.p, d.predictedS, d.limitS, slow);
      models[t * n + i] = names.indexOf(move ? move.model : d.model);
      moved[t * n + i] = move ? 1 : 0;
    });
  });
  got.set("live.model", models);
  got.set("live.moved", moved);
}

/** 8.3 for every request: each latency model's predictions, and the decision at each of the
 * metadata's budget cases (the draw is the knob layer's). */
function budgets(policy: Policy, inputs: VectorInput[], meta: Meta, got: Map<string, Typed>): void {
  const lat = policy.latency!, n = inputs.length, k = policy.candidates.length, M = lat.models.length;
  const cases = (meta.budgets ?? []).map((c, j) => budgetCase(lat, c, j));
  const B = cases.length;
  const predAll = new Float64Array(n * M * k), model = new Uint16Array(n * B), met = new Uint8Array(n * B);
  const fb = new Uint16Array(n * B * (k - 1)), props = new Float64Array(n * B);
  const P = got.get("calibration.p") as Float64Array, C = got.get("cost.c") as Float64Array, U = got.get("knob.unit") as Float64Array;
  const chars = got.get("bytes.n_chars") as Uint32Array, suitePos = got.get("features.suite") as Int32Array;
  for (let i = 0; i < n; i++) {
    for (let m = 0; m < M; m++) predict(lat.models[m], chars[i], suitePos[i], predAll.subarray((i * M + m) * k, (i * M + m + 1) * k));
    const p = P.subarray(i * k, i * k + k), c = C.subarray(i * k, i * k + k);
    for (let j = 0; j < B; j++) {
      const { target } = cases[j];
      const budget = cases[j].budget ?? requestDefault(lat, inputs[i].suite, j);
      const at = lat.models.indexOf(budgetModel(lat, budget.kind)!);
      const ch = decideBudget(lat, budget, target, p, c, predAll.subarray((i * M + at) * k, (i * M + at + 1) * k), () => U[i]);
      model[i * B + j] = ch.pick; met[i * B + j] = ch.met ? 1 : 0; props[i * B + j] = ch.propensity;
      fb.set(ch.fallbacks, (i * B + j) * (k - 1));
    }
  }
  for (const [name, a] of [["latency.pred", predAll], ["budget.model", model], ["budget.fallbacks", fb], ["budget.met", met],
    ["budget.propensity", props]] as const) got.set(name, a);
}

/** A budget case of the metadata, checked: its budget, or null for "default" (each request's
 * suite's default budget). */
function budgetCase(lat: Latency, [kind, budgetS, target]: [string, number | null, number], j: number): { budget: Budget | null; target: number } {
  const ok = kind === "default"
    ? budgetS === null
    : KINDS.includes(kind as LatencyKind) && budgetModel(lat, kind as LatencyKind) !== null && (budgetS as number) > 0;
  if (!ok || !Number.isFinite(target)) {
    throw new FormatError(`${VECTORS}: budget case ${j} ${JSON.stringify([kind, budgetS, target])} is not one this policy can decide`);
  }
  return { budget: kind === "default" ? null : { kind: kind as LatencyKind, budgetS: budgetS as number }, target };
}

function requestDefault(lat: Latency, suite: string | null, j: number): Budget {
  const budget = defaultFor(lat, suite);
  if (!budget) {
    throw new FormatError(`${VECTORS}: budget case ${j} decides each request under its suite's default budget, and the policy has none for suite ${JSON.stringify(suite)} (nor for "*")`);
  }
  return budget;
}

/** 8.1 with the vectors' settings; the policy is both champion and candidate. */
async function gateway(policy: Policy, inputs: VectorInput[], meta: Meta, got: Map<string, Typed>): Promise<void> {
  const x = meta.gateway.exploration;
  const opts: ExplorationOptions = { rate: x.rate, exclude: x.exclude, maxCostUsd: x.max_cost_usd, maxCostRatio: x.max_cost_ratio, seed: x.seed };
  const exploreKey = await deriveKey("explore", x.seed), canaryKey = await deriveKey("canary", meta.gateway.canary.seed);
  const n = inputs.length, k = policy.candidates.length, names = policy.candidates;
  const draws = new Float64Array(n * 3), arm = new Uint8Array(n), model = new Uint16Array(n), explored = new Uint8Array(n);
  const eligible = new Uint16Array(n), prop = new Float64Array(n);
  const P = got.get("calibration.p") as Float64Array, C = got.get("cost.c") as Float64Array, U = got.get("knob.unit") as Float64Array;
  const point = pointFor(policy.knob, policy.qualityTarget);
  for (let i = 0; i < n; i++) {
    const [u, v] = unitDraw(exploreKey, inputs[i].requestId);
    const a = unitDraw(canaryKey, inputs[i].requestId)[0];
    const p = P.subarray(i * k, i * k + k), c = C.subarray(i * k, i * k + k);
    const pick = decidePoint(policy.knob, point, p, c, () => U[i]).pick;
    const cost: Record<string, number> = {};
    for (let j = 0; j < k; j++) cost[names[j]] = c[j];
    const e = explore(names[pick], names, cost, opts, u, v);
    draws[i * 3] = u; draws[i * 3 + 1] = v; draws[i * 3 + 2] = a;
    arm[i] = a < meta.gateway.canary.share ? 1 : 0;
    model[i] = names.indexOf(e.model); explored[i] = e.explored ? 1 : 0; eligible[i] = e.eligible.length; prop[i] = e.propensity;
  }
  for (const [name, a] of [["gateway.draws", draws], ["gateway.arm", arm], ["gateway.model", model], ["gateway.explored", explored],
    ["gateway.eligible", eligible], ["gateway.propensity", prop]] as const) got.set(name, a);
}

/** Which of `rows` rows differ, and the largest relative float difference. */
function differs(want: Typed, got: Typed, rows: number, mode: number, tol: number): [Uint8Array, number] {
  const bad = new Uint8Array(rows);
  if (want.length !== got.length) return [bad.fill(1), Infinity];
  const w = want.length / Math.max(rows, 1);
  let worst = 0;
  for (let i = 0; i < want.length; i++) {
    const a = Number(want[i]), b = Number(got[i]);
    let off: boolean;
    if (mode === EXACT) off = !Object.is(a, b);
    else {
      const scale = Math.max(Math.abs(a), Math.abs(b));
      const diff = Math.abs(a - b);
      off = !(diff <= tol * scale);
      if (scale > 0 && diff / scale > worst) worst = diff / scale;
    }
    if (off) bad[Math.floor(i / w)] = 1;
  }
  return [bad, worst];
}

function show(a: Typed, i: number, rows: number): string {
  const w = a.length / rows;
  return JSON.stringify(Array.from(a.subarray(i * w, (i + 1) * w), Number));
}

function describe(inp: VectorInput): string {
  const t = inp.text.length > 40 ? JSON.stringify(inp.text.slice(0, 40)) + "..." : JSON.stringify(inp.text);
  return `text ${t} (${inp.text.length} code units), suite ${JSON.stringify(inp.suite)}, request id ${JSON.stringify(inp.requestId.slice(0, 40))}`;
}

function compareDetail(want: Map<string, Tensor>, got: Map<string, Typed>, tol: number): [Uint8Array, Uint8Array, number] {
  const ow = want.get("detail.offsets")!.data as Uint32Array, og = got.get("detail.offsets") as Uint32Array;
  const d = ow.length - 1;
  const ids = new Uint8Array(d), vals = new Uint8Array(d);
  let worst = 0;
  const [wb, wc, wv] = ["detail.buckets", "detail.counts", "detail.values"].map((x) => want.get(x)!.data);
  const [gb, gc, gv] = ["detail.buckets", "detail.counts", "detail.values"].map((x) => got.get(x)!);
  for (let i = 0; i < d; i++) {
    const [a0, a1, b0, b1] = [ow[i], ow[i + 1], og[i] ?? 0, og[i + 1] ?? 0];
    const same = a1 - a0 === b1 - b0 && Array.from({ length: a1 - a0 }, (_, j) => wb[a0 + j] === gb[b0 + j] && wc[a0 + j] === gc[b0 + j]).every(Boolean);
    if (!same) { ids[i] = 1; continue; }
    const [bad, rel] = differs(wv.subarray(a0, a1) as Float64Array, gv.subarray(b0, b1) as Float64Array, 1, CLOSE, tol);
    vals[i] = bad[0]; worst = Math.max(worst, rel);
  }
  return [ids, vals, worst];
}

/** Check this runtime against a policy's conformance vectors (section 9). */
export async function checkVectors(policy: Policy, bytes: Uint8Array): Promise<ConformanceReport> {
  const start = Date.now();
  const fail = (first: string, requests = 0): ConformanceReport => ({ ok: false, requests, layers: [], mismatches: {}, first, maxRelativeError: 0, ms: Date.now() - start });
  let meta: Meta, want: Map<string, Tensor>, inputs: VectorInput[];
  try {
    const c = readContainer(bytes, VECTORS);
    want = c.tensors;
    meta = JSON.parse(c.metadata["routeopt"] ?? "null");
    if (!meta || meta.format !== FORMAT) throw new FormatError(`${VECTORS}: format ${JSON.stringify(meta?.format)} is not ${FORMAT}`);
    inputs = readInputs(want, meta);
  } catch (e) {
    return fail(e instanceof FormatError ? e.message : `${VECTORS}: malformed conformance vectors (${(e as Error).message})`);
  }
  if (JSON.stringify(meta.candidates) !== JSON.stringify(policy.candidates)) {
    return fail(`${VECTORS}: the vectors are for candidates ${JSON.stringify(meta.candidates)}, the policy has ${JSON.stringify(policy.candidates)} (swapped files?)`, inputs.length);
  }
  const unknown = (Array.isArray(meta.layers) ? meta.layers : [null]).find((l) => !LAYER_NAMES.has(l as string));
  if (unknown !== undefined) {
    return fail(`${VECTORS}: layer ${JSON.stringify(unknown)} is not one this runtime implements: the policy needs a newer runtime`, inputs.length);
  }
  if (meta.layers.includes("budget") !== (policy.latency !== null)) {
    return fail(`${VECTORS}: the vectors ${meta.layers.includes("budget") ? "do" : "do not"} check latency budgets and the policy ${policy.latency ? "has a" : "has no"} latency section`, inputs.length);
  }
  let got: Map<string, Typed>;
  try {
    got = await compute(policy, inputs, meta, want);
  } catch (e) {
    if (e instanceof FormatError) return fail(e.message, inputs.length);
    throw e;
  }
  const n = inputs.length, tol = meta.tolerance;
  const [idsBad, valsBad, detailWorst] = compareDetail(want, got, tol);
  const mismatches: Record<string, number> = {};
  let first: string | null = null, worst = detailWorst;
  for (const [layer, tensors] of LAYERS) {
    if (!meta.layers.includes(layer)) continue;
    const any = new Uint8Array(n);
    for (const [name, mode] of tensors) {
      const w = want.get(name);
      if (!w) return fail(`${VECTORS}: layer ${layer} lacks tensor ${JSON.stringify(name)}`, n);
      const g = got.get(name)!;
      if (name === "knob.point") {
        const [bad] = differs(w.data, g, 1, EXACT, tol);
        if (bad[0] && !first) first = `step knob: the points serving targets ${JSON.stringify(meta.targets)} are ${show(g, 0, 1)}, expected ${show(w.data, 0, 1)}`;
        continue;
      }
      if (layer === "live") {  // (times x requests): each one its own row
        const [bad] = differs(w.data, g, g.length, mode, tol);
        const at = bad.indexOf(1), r = g.length / meta.live!.times.length;
        if (at >= 0 && !first) {
          const i = at % r;
          first = `step live (${name}) differs first at request ${i} (${describe(inputs[i])}) at time ${meta.live!.times[Math.floor(at / r)]}: expected ${Number(w.data[at])}, got ${g[at]}`;
        }
        bad.forEach((b, j) => (any[j % r] |= b));
        continue;
      }
      const [bad, rel] = differs(w.data, g, n, mode, tol);
      worst = Math.max(worst, rel);
      const i = bad.indexOf(1);
      if (i >= 0 && !first) first = `step ${layer} (${name}) differs first at request ${i} (${describe(inputs[i])}): expected ${show(w.data, i, n)}, got ${show(g, i, n)}`;
      bad.forEach((b, j) => (any[j] |= b));
    }
    const extra = layer === "buckets" ? idsBad : layer === "features" ? valsBad : null;
    if (extra) {
      const i = extra.indexOf(1);
      if (i >= 0 && !first) first = `step ${layer} (detail.${layer === "buckets" ? "buckets" : "values"}) differs first at request ${i} (${describe(inputs[i])})`;
      extra.forEach((b, j) => (any[j] |= b));
    }
    mismatches[layer] = any.reduce((s, b) => s + b, 0);
  }
  return { ok: first === null, requests: n, layers: meta.layers, mismatches, first, maxRelativeError: worst, ms: Date.now() - start };
}

export function summary(r: ConformanceReport): string {
  if (r.ok) return `${r.requests} conformance requests agree at every layer (${r.layers.join(", ")}); largest relative float difference ${r.maxRelativeError.toExponential(1)}`;
  const bad = Object.entries(r.mismatches).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ");
  return `conformance vectors disagree (${bad || "file"} of ${r.requests} requests): ${r.first}`;
}
