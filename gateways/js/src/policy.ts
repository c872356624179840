/**
 * Section 2, "Files": policy.json and arrays.safetensors read into a Policy, and the path of
 * one request through sections 3 to 8.
 */

import type { PromptBytes } from "./bytes.js";
import { costs, calibrate, CostArrays } from "./calibration.js";
import { FormatError, need, readContainer, Tensor } from "./container.js";
import { decidePoint } from "./decision.js";
import { FeatureLayers, FeatureSpec, N_STATS, STAT_NAMES, Scratch, featureKernel, featureLayers, fillRow } from "./features.js";
import type { Engine, Kernel } from "./kernel.js";
import { Knob, mixingDraw, parseKnob, pointFor } from "./knob.js";
import { askedBudget, Budget, budgetModel, decideBudget, defaultFor, Latency, LatencyKind, predict, readLatency } from "./latency.js";
import { LinearScorer, Scorer, TreeScorer } from "./scorer.js";

export const FORMAT_VERSION = 3;
/** format 3 and a latency section (8.3); a policy without one is still written as format 3 */
export const LATENCY_FORMAT_VERSION = 4;
export const READABLE_VERSIONS = [FORMAT_VERSION, LATENCY_FORMAT_VERSION];
export const ARRAYS = "arrays.safetensors";
export const VECTORS = "conformance.safetensors";

/** A policy's decision for one request (section 8), before any gateway exploration. */
export interface Decided {
  model: string;
  pick: number;
  fallbacks: string[];
  fallbackIndex: number[];
  propensity: number;
  p: Float64Array;
  c: Float64Array;
  promptRaw: Uint8Array;
  nChars: number;
  /** with a latency budget (8.3): what served it and whether it was met */
  budget: BudgetOutcome | null;
}

/** A decision's latency budget: `tierS` is the certified budget that served it (null below
 * every tier) and `maskS` its mask's seconds (null with no tier), `met` whether the chosen
 * model's predicted p95 is within `budgetS`, `predictedS` each candidate's predicted p95 (8.3).
 * Live latency (8.4) holds a slowed prediction to `maskS ?? budgetS`. */
export interface BudgetOutcome {
  kind: LatencyKind;
  budgetS: number;
  tierS: number | null;
  met: boolean;
  predictedS: Record<string, number>;
  maskS: number | null;
}

/** The budget a call may ask for, in seconds of p95: at most one of the two. `useDefaults`:
 * a call naming neither gets the policy's default for its suite, as a Router's does (without
 * it, the plain decision of section 8 has no budget). */
export interface BudgetOptions {
  ttftBudgetS?: number | null;
  latencyBudgetS?: number | null;
  useDefaults?: boolean;
}

/** One request after calibration and cost (sections 3 to 6). */
export interface Scored {
  layers: FeatureLayers;
  z: Float64Array;
  topic: number;
  p: Float64Array;
  c: Float64Array;
}

export class Policy {
  private readonly scratch: Scratch;
  private readonly z: Float64Array;
  private readonly p: Float64Array;
  private readonly c: Float64Array;
  private readonly pred: Float64Array;
  private readonly allowed: Uint8Array;

  constructor(
    readonly candidates: string[],
    readonly spec: FeatureSpec,
    readonly scorer: Scorer,
    readonly platt: Float64Array,
    readonly cost: CostArrays,
    readonly knob: Knob,
    readonly qualityTarget: number,
    readonly referenceModel: string,
    kernel: Kernel | null = null,
    readonly latency: Latency | null = null,
    readonly formatVersion: number = latency ? LATENCY_FORMAT_VERSION : FORMAT_VERSION,
  ) {
    this.scratch = new Scratch(spec.nBuckets, kernel);
    this.z = new Float64Array(candidates.length);
    this.p = new Float64Array(candidates.length);
    this.c = new Float64Array(candidates.length);
    this.pred = new Float64Array(candidates.length);
    this.allowed = new Uint8Array(candidates.length);
  }

  /** Features, scores, probabilities and costs of one request (`keep`: copy every layer out;
   * without it the layers are views of the policy's scratch, good until its next request). */
  scoreRequest(prompt: string, suite?: string | null, keep = false): Scored {
    checkInput(prompt, suite);
    const k = this.candidates.length;
    const layers = featureLayers(prompt, suite, this.spec, this.scratch, keep);
    const z = new Float64Array(k), p = new Float64Array(k), c = new Float64Array(k);
    const topic = this.scoreRow(layers.text, z, p, c);
    return { layers, z, topic, p, c };
  }

  /** Sections 5 and 6 on the row in the scratch: z, p and c filled; returns the topic. */
  private scoreRow(text: PromptBytes, z: Float64Array, p: Float64Array, c: Float64Array): number {
    const s = this.scratch;
    const topic = this.scorer.score(s.ids, s.vals, s.rowLength, s.suitePos, z);
    calibrate(this.platt, z, p);
    costs(this.cost, text.nChars, s.suitePos, topic, c);
    return topic;
  }

  /** The budget a request of `suite` naming none gets (8.3's defaults): its suite's, else "*"'s. */
  defaultFor(suite?: string | null): Budget | null {
    return defaultFor(this.latency, suite);
  }

  /** The decision for one request at a quality target (the policy's own by default), under
   * a latency budget where one is given, or with `useDefaults` the suite's default (8.3). */
  decide(prompt: string, suite?: string | null, qualityTarget?: number | null, budget: BudgetOptions = {}): Decided {
    const d = this.choose(prompt, suite, qualityTarget, budget);
    return { ...d, p: d.p.slice(), c: d.c.slice(), promptRaw: d.promptRaw.slice() };
  }

  /** `decide` without copies: p, c and promptRaw are the policy's scratch, good until its next
   * request (a Router reads them at once). */
  choose(prompt: string, suite?: string | null, qualityTarget?: number | null, budget: BudgetOptions = {}): Decided {
    const target = qualityTarget ?? this.qualityTarget;
    if (typeof target !== "number" || !Number.isFinite(target)) throw new RangeError(`quality target must be a finite number, got ${target}`);
    const asked = askedBudget(this.latency, budget.ttftBudgetS, budget.latencyBudgetS, suite, budget.useDefaults === true);
    checkInput(prompt, suite);
    const text = fillRow(prompt, suite, this.spec, this.scratch);
    this.scoreRow(text, this.z, this.p, this.c);
    const draw = () => mixingDraw(text.cut, suite);
    const names = this.candidates;
    let ch, outcome: BudgetOutcome | null = null;
    if (asked === null) {
      ch = decidePoint(this.knob, pointFor(this.knob, target), this.p, this.c, draw);
    } else {
      predict(budgetModel(this.latency, asked.kind)!, text.nChars, this.scratch.suitePos, this.pred);
      ch = decideBudget(this.latency!, asked, target, this.p, this.c, this.pred, draw, this.allowed);
      const predictedS: Record<string, number> = {};
      for (let j = 0; j < names.length; j++) predictedS[names[j]] = this.pred[j];
      outcome = { kind: asked.kind, budgetS: asked.budgetS, tierS: ch.tier?.budgetS ?? null, met: ch.met, predictedS,
        maskS: ch.tier?.maskS ?? null };
    }
    const fallbacks = new Array<string>(ch.fallbacks.length);
    for (let i = 0; i < fallbacks.length; i++) fallbacks[i] = names[ch.fallbacks[i]];
    return {
      model: names[ch.pick], pick: ch.pick, fallbacks, fallbackIndex: ch.fallbacks,
      propensity: ch.propensity, p: this.p, c: this.c, promptRaw: text.raw, nChars: text.nChars, budget: outcome,
    };
  }
}

function checkInput(prompt: unknown, suite: unknown): void {
  if (typeof prompt !== "string") throw new TypeError(`prompt must be a string, got ${prompt === null ? "null" : typeof prompt}`);
  if (suite !== undefined && suite !== null && typeof suite !== "string") throw new TypeError(`suite must be a string, got ${typeof suite}`);
}

// -- reading ---------------------------------------------------------------------------------

type Json = Record<string, unknown>;

function field<T>(obj: Json, name: string, check: (v: unknown) => boolean, what: string): T {
  const v = obj[name];
  if (!check(v)) throw new FormatError(`policy.json: ${name} must be ${what}, got ${JSON.stringify(v)}`);
  return v as T;
}

const isInt = (v: unknown) => typeof v === "number" && Number.isInteger(v) && v >= 0;
const isNum = (v: unknown) => typeof v === "number" && Number.isFinite(v);
const isBool = (v: unknown) => typeof v === "boolean";
const isStrings = (v: unknown) => Array.isArray(v) && v.every((x) => typeof x === "string");

function finite(a: ArrayLike<number>, name: string): void {
  for (let i = 0; i < a.length; i++) if (!Number.isFinite(a[i])) throw new FormatError(`arrays.safetensors: ${name} holds a non-finite number`);
}

function readSpec(head: Json, t: Map<string, Tensor>): FeatureSpec {
  const f = field<Json>(head, "features", (v) => typeof v === "object" && v !== null, "an object");
  const nBuckets = field<number>(f, "n_buckets", (v) => isInt(v) && (v as number) >= 1 && (v as number) <= 1 << 24 && ((v as number) & ((v as number) - 1)) === 0, "a power of two up to 2^24");
  const charNgrams = field<number[]>(f, "char_ngrams", (v) => Array.isArray(v) && v.every((n) => isInt(n) && n >= 1 && n <= 7), "lengths 1 to 7");
  if (f["max_bytes"] !== 8192 || JSON.stringify(f["stats"]) !== JSON.stringify(STAT_NAMES)) {
    throw new FormatError("policy.json: features.max_bytes / stats differ from this runtime's (8192, the nine statistics of 4.7)");
  }
  if (f["embeddings"] !== false) throw new FormatError("policy.json: features.embeddings must be false in a portable policy");
  const suites = field<string[]>(f, "suites", isStrings, "a list of strings");
  const where = ARRAYS;
  const idf = f["idf"] ? (need(t, "features.idf", ["F64"], [nBuckets], where) as Float64Array) : null;
  const scaling = Boolean(f["stat_scaling"]);
  const statMean = scaling ? (need(t, "features.stat_mean", ["F64"], [N_STATS], where) as Float64Array) : null;
  const statStd = scaling ? (need(t, "features.stat_std", ["F64"], [N_STATS], where) as Float64Array) : null;
  if (statStd && statStd.some((v) => !Number.isFinite(v) || v === 0)) throw new FormatError(`${where}: features.stat_std must be finite and non-zero`);
  return {
    suites, suiteIndex: new Map(suites.map((s, i) => [s, i])), nBuckets, charNgrams,
    wordBigrams: field<boolean>(f, "word_bigrams", isBool, "true or false"), idf, statMean, statStd,
  };
}

/** The scorer, its topics, and the kernel that runs the policy's hot loops (null where
 * WebAssembly is not compiled or `engine` is "javascript"). */
function readScorer(head: Json, t: Map<string, Tensor>, spec: FeatureSpec, k: number, nFeatures: number,
  engine?: Engine): [Scorer, number, Kernel | null] {
  const s = spec.suites.length;
  const sc = field<Json>(head, "scorer", (v) => typeof v === "object" && v !== null, "an object");
  const where = ARRAYS;
  if (sc["kind"] === "difficulty-linear") {
    const g = field<number>(sc, "topics", isInt, "a count");
    const rank = field<number>(sc, "rank", isInt, "a count");
    const f64 = (name: string, shape: number[]) => need(t, name, ["F64"], shape, where) as Float64Array;
    const weights = need(t, "scorer.weights", ["F32", "F64"], [nFeatures, k + 1 + rank], where) as Float32Array | Float64Array;
    finite(weights, "scorer.weights");
    const kernel = featureKernel(spec, weights, k + 1 + rank, engine);
    const scorer = new LinearScorer({
      weights, bias: f64("scorer.bias", [k]), slopes: f64("scorer.slopes", [s + 1, k]),
      difficultyBias: field<number>(sc, "difficulty_bias", isNum, "a number"),
      centroids: g ? f64("scorer.centroids", [g, rank]) : null, topicBias: g ? f64("scorer.topic_bias", [g, k]) : null,
      topicSlopes: g ? f64("scorer.topic_slopes", [g, k]) : null, topicDifficulty: g ? f64("scorer.topic_difficulty", [g]) : null,
    }, k, s, rank, g, kernel);
    return [scorer, g, kernel];
  }
  if (sc["kind"] === "trees") {
    if (sc["n_features"] !== nFeatures) throw new FormatError(`policy.json: scorer.n_features ${sc["n_features"]} != ${nFeatures}`);
    const any = [-1];
    const i32 = (name: string) => need(t, `scorer.trees.${name}`, ["I32"], any, where) as Int32Array;
    const u8 = (name: string) => need(t, `scorer.trees.${name}`, ["U8"], any, where) as Uint8Array;
    const f64 = (name: string) => need(t, `scorer.trees.${name}`, ["F64"], any, where) as Float64Array;
    return [new TreeScorer({
      feature: i32("feature"), threshold: f64("threshold"), defaultLeft: u8("default_left"), missing: u8("missing"),
      left: i32("left"), right: i32("right"), leafValue: f64("leaf_value"), nodeStart: i32("node_start"),
      leafStart: i32("leaf_start"), treeStart: i32("tree_start"),
      constant: need(t, "scorer.constant", ["F64"], [k], where) as Float64Array,
      hasTrees: need(t, "scorer.has_trees", ["U8"], [k], where) as Uint8Array,
    }, k, nFeatures), 0, featureKernel(spec, null, 0, engine)];
  }
  throw new FormatError(`policy.json: unknown scorer kind ${JSON.stringify(sc["kind"])}; this runtime reads "difficulty-linear" and "trees"`);
}

/** Parse policy.json (bytes) and arrays.safetensors into a Policy; errors name file and field.
 * `engine` picks the hot loops' engine (kernel.ts; both give the same bits): WebAssembly where
 * it compiles, unless told "javascript". */
export function readPolicy(policyJson: Uint8Array, arrays: Uint8Array, engine?: Engine): Policy {
  let head: Json;
  try {
    head = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(policyJson));
  } catch (e) {
    throw new FormatError(`policy.json: not valid JSON (${(e as Error).message})`);
  }
  if (typeof head !== "object" || head === null) throw new FormatError("policy.json: expected a JSON object");
  const version = head["format_version"];
  if (!READABLE_VERSIONS.includes(version as number)) {
    throw new FormatError(`policy.json: format_version ${JSON.stringify(version)} is not supported by this runtime (reads ${READABLE_VERSIONS.join(" and ")})`);
  }
  if (head["portable"] !== true) {
    throw new FormatError(`policy.json: not portable: ${head["not_portable"] ?? "the policy says so"}`);
  }
  const files = head["files"] as Json | undefined;
  if (!files || files["arrays"] !== ARRAYS || files["conformance"] !== VECTORS) {
    throw new FormatError(`policy.json: files must be ${ARRAYS} and ${VECTORS}`);
  }
  const candidates = field<string[]>(head, "candidates", (v) => isStrings(v) && (v as string[]).length > 0, "a non-empty list of names");
  const { tensors } = readContainer(arrays, ARRAYS);
  const spec = readSpec(head, tensors);
  const k = candidates.length, s = spec.suites.length;
  const nFeatures = s + spec.nBuckets + N_STATS;
  const [scorer, topics, kernel] = readScorer(head, tensors, spec, k, nFeatures, engine);
  const costHead = field<Json>(head, "cost", (v) => typeof v === "object" && v !== null, "an object");
  const f64 = (name: string, shape: number[]) => need(tensors, name, ["F64"], shape, ARRAYS) as Float64Array;
  const cost: CostArrays = {
    coef: f64("cost.coef", [2 + s, k]), floor: f64("cost.floor", [k]),
    topicCoef: costHead["topics"] ? f64("cost.topic_coef", [topics, k]) : null,
  };
  const platt = f64("calibration.platt", [2, k]);
  for (const [name, a] of [["calibration.platt", platt], ["cost.coef", cost.coef], ["cost.floor", cost.floor]] as const) finite(a, name);
  const latency = version === LATENCY_FORMAT_VERSION ? readLatency(head, tensors, k, s, ARRAYS) : null;
  return new Policy(candidates, spec, scorer, platt, cost, parseKnob(head["knob"], k),
    field<number>(head, "quality_target", isNum, "a number"), String(head["reference_model"] ?? ""), kernel,
    latency, version as number);
}
