/**
 * Section 8.3, "Latency budgets" (format 4): each candidate's predicted latency, the tier that
 * serves a budget, its mask, and the decision under it. The budget step comes after scoring:
 * it reads p and c as 6 leaves them and never touches the features' or scorer's loops.
 */

import { FormatError, need, Tensor } from "./container.js";
import { Choice, decidePoint, sortedWithout } from "./decision.js";
import { Knob, parseKnob, pointFor } from "./knob.js";

export type LatencyKind = "ttft" | "latency";
export const KINDS: readonly LatencyKind[] = ["ttft", "latency"];
export const QUANTILES = ["p50", "p95"] as const;
export type Quantile = (typeof QUANTILES)[number];
/** a candidate meets a budget when its predicted p95 does */
export const BUDGET_QUANTILE: Quantile = "p95";

/** One (kind, quantile) model: 6's cost arrays without topics. */
export interface LatencyModel {
  kind: LatencyKind;
  quantile: Quantile;
  coef: Float64Array; // (2 + S, K)
  floor: Float64Array; // (K,)
}

/** A budget the policy certified, and the knob that serves targets under it. */
export interface BudgetTier {
  kind: LatencyKind;
  budgetS: number;
  /** the mask's seconds: the candidates whose predicted p95 is within them (8.3) */
  maskS: number;
  knob: Knob;
}

export interface Latency {
  /** in the vectors' order: ttft before latency, p50 before p95 */
  models: LatencyModel[];
  alpha: number;
  /** per kind, by rising budget */
  tiers: Record<LatencyKind, BudgetTier[]>;
  /** the budget a request naming none gets, by suite name, "*" for any suite */
  defaults: Map<string, Budget>;
}

/** A budget a request asks for. */
export interface Budget {
  kind: LatencyKind;
  budgetS: number;
}

/** 8.3's prediction: t_k = coef[0][k] + (n_chars / 1000) * coef[1][k] (+ suite offset), floored. */
export function predict(m: LatencyModel, nChars: number, suitePos: number, out: Float64Array): void {
  const k = out.length;
  const kchars = nChars / 1000;
  for (let j = 0; j < k; j++) {
    let v = m.coef[j] + kchars * m.coef[k + j];
    if (suitePos >= 0) v = v + m.coef[(2 + suitePos) * k + j];
    out[j] = v < m.floor[j] ? m.floor[j] : v;
  }
}

/** The kind's p95 model, or null where the policy has none. */
export function budgetModel(lat: Latency | null, kind: LatencyKind): LatencyModel | null {
  return lat?.models.find((m) => m.kind === kind && m.quantile === BUDGET_QUANTILE) ?? null;
}

/** The budget a request of `suite` gets when it names none: its suite's default, else "*"'s
 * (a missing or empty suite looks up "*" only); null with neither. */
export function defaultFor(lat: Latency | null, suite?: string | null): Budget | null {
  if (!lat) return null;
  return lat.defaults.get(suite || "*") ?? lat.defaults.get("*") ?? null;
}

/** The tier of the largest certified budget no larger than `budgetS`; null below every tier. */
export function tierFor(lat: Latency, kind: LatencyKind, budgetS: number): BudgetTier | null {
  let found: BudgetTier | null = null;
  for (const t of lat.tiers[kind]) {
    if (t.budgetS <= budgetS) found = t;
    else break;
  }
  return found;
}

/** 8.3's mask: pred_k <= bound; where none is, the first candidate predicted fastest. */
export function budgetMask(pred: Float64Array, bound: number, out: Uint8Array): void {
  let any = false, fastest = 0;
  for (let j = 0; j < pred.length; j++) {
    out[j] = pred[j] <= bound ? 1 : 0;
    if (out[j]) any = true;
    if (pred[j] < pred[fastest]) fastest = j;
  }
  if (!any) out[fastest] = 1;
}

export interface BudgetChoice extends Choice {
  tier: BudgetTier | null;
  /** the chosen model's predicted p95 is within the budget asked for */
  met: boolean;
}

/** The decision under a budget (8.3) for (p, c), the kind's p95 predictions and the mixing draw. */
export function decideBudget(lat: Latency, budget: Budget, target: number, p: Float64Array, c: Float64Array,
  pred: Float64Array, u: () => number, allowed: Uint8Array = new Uint8Array(p.length)): BudgetChoice {
  const tier = tierFor(lat, budget.kind, budget.budgetS);
  budgetMask(pred, tier === null ? -Infinity : tier.maskS, allowed);
  let ch: Choice;
  if (tier === null) {  // below every certified budget: the candidate predicted fastest
    const pick = allowed.indexOf(1);
    ch = { pick, propensity: 1.0, fallbacks: sortedWithout(pred, c, pick) };
  } else {
    ch = decidePoint(tier.knob, pointFor(tier.knob, target), p, c, u, allowed);
  }
  return { ...ch, tier, met: pred[ch.pick] <= budget.budgetS };
}

/** The budget a call asks for: at most one kind, a positive finite number of seconds, of a
 * kind the policy has a p95 model of; with `useDefaults`, a call naming none gets the
 * policy's default for its suite (Python's `RoutingPolicy._budget`). */
export function askedBudget(lat: Latency | null, ttftBudgetS: unknown, latencyBudgetS: unknown,
  suite?: string | null, useDefaults = false): Budget | null {
  const asked = requestedBudget(ttftBudgetS, latencyBudgetS) ?? (useDefaults ? defaultFor(lat, suite) : null);
  if (asked !== null && !budgetModel(lat, asked.kind)) {
    throw new RangeError(`this policy has no ${asked.kind} model: it was trained on outcomes without ${asked.kind} measurements, so it cannot serve a latency budget`);
  }
  return asked;
}

/** The budget a call asks for, checked as a value only: at most one kind, a positive finite
 * number of seconds (Python's `budget_request`). */
export function requestedBudget(ttftBudgetS: unknown, latencyBudgetS: unknown): Budget | null {
  const ttft = parseBudget(ttftBudgetS, "ttftBudgetS"), latency = parseBudget(latencyBudgetS, "latencyBudgetS");
  if (ttft !== null && latency !== null) throw new RangeError("give a TTFT budget or an end-to-end latency budget, not both");
  if (ttft === null && latency === null) return null;
  return ttft !== null ? { kind: "ttft", budgetS: ttft } : { kind: "latency", budgetS: latency! };
}

function parseBudget(v: unknown, what: string): number | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "number") throw new TypeError(`${what} must be a number of seconds, got ${JSON.stringify(v)}`);
  if (!(Number.isFinite(v) && v > 0)) throw new RangeError(`${what} must be a positive number of seconds, got ${v}`);
  return v;
}

// -- reading ---------------------------------------------------------------------------------

type Json = Record<string, unknown>;

/** Format 4's latency section of policy.json and its arrays, checked as Python's `files._latency`. */
export function readLatency(head: Json, t: Map<string, Tensor>, k: number, s: number, where: string): Latency {
  const d = head["latency"];
  if (typeof d !== "object" || d === null || Array.isArray(d)) {
    throw new FormatError("policy.json: a format 4 policy needs its latency section (latency: models, alpha, tiers)");
  }
  const sec = d as Json;
  if (!Array.isArray(sec["models"])) throw new FormatError(`policy.json: latency.models must be a list of [kind, quantile], got ${JSON.stringify(sec["models"])}`);
  const models: LatencyModel[] = [];
  for (const m of sec["models"] as unknown[]) {
    const [kind, quantile] = Array.isArray(m) && m.length === 2 ? m : [undefined, undefined];
    if (!KINDS.includes(kind) || !QUANTILES.includes(quantile)) {
      throw new FormatError(`policy.json: latency.models: unknown latency model ${JSON.stringify(m)}; this runtime reads kinds ${KINDS.join(", ")} and quantiles ${QUANTILES.join(", ")}`);
    }
    if (models.some((x) => x.kind === kind && x.quantile === quantile)) throw new FormatError(`policy.json: latency.models names ${kind} ${quantile} twice`);
    const name = `latency.${kind}.${quantile}`;
    const coef = need(t, `${name}.coef`, ["F64"], [2 + s, k], where) as Float64Array;
    const floor = need(t, `${name}.floor`, ["F64"], [k], where) as Float64Array;
    if (!coef.every(Number.isFinite) || !floor.every(Number.isFinite)) throw new FormatError(`${where}: ${name} holds a non-finite number`);
    models.push({ kind, quantile, coef, floor });
  }
  models.sort((a, b) => KINDS.indexOf(a.kind) - KINDS.indexOf(b.kind) || QUANTILES.indexOf(a.quantile) - QUANTILES.indexOf(b.quantile));
  const alpha = sec["alpha"];
  if (typeof alpha !== "number" || !Number.isFinite(alpha)) throw new FormatError(`policy.json: latency.alpha must be a number, got ${JSON.stringify(alpha)}`);
  if (!Array.isArray(sec["tiers"])) throw new FormatError(`policy.json: latency.tiers must be a list, got ${JSON.stringify(sec["tiers"])}`);
  const tiers: Record<LatencyKind, BudgetTier[]> = { ttft: [], latency: [] };
  const lat: Latency = { models, alpha, tiers, defaults: new Map() };
  (sec["tiers"] as unknown[]).forEach((raw, i) => {
    const tier = readTier(raw, k, `latency.tiers[${i}]`);
    if (!budgetModel(lat, tier.kind)) {
      throw new FormatError(`policy.json: latency tiers of kind ${JSON.stringify(tier.kind)} but no p95 model for it`);
    }
    tiers[tier.kind].push(tier);
  });
  for (const kind of KINDS) {
    const list = tiers[kind].sort((a, b) => a.budgetS - b.budgetS);
    for (let i = 1; i < list.length; i++) {
      if (list[i].budgetS <= list[i - 1].budgetS) throw new FormatError(`policy.json: the ${kind} tiers' budgets must be distinct`);
    }
  }
  readDefaults(sec["defaults"], lat);
  return lat;
}

/** latency.defaults (optional): {suite or "*": [kind, seconds]}, each of a kind with a p95 model. */
function readDefaults(raw: unknown, lat: Latency): void {
  if (raw === undefined || raw === null) return;
  if (typeof raw !== "object" || Array.isArray(raw)) {
    throw new FormatError(`policy.json: latency.defaults must be an object of suite: [kind, seconds], got ${JSON.stringify(raw)}`);
  }
  for (const [suite, value] of Object.entries(raw as Json)) {
    const name = `latency.defaults[${JSON.stringify(suite)}]`;
    if (!Array.isArray(value) || value.length !== 2 || !KINDS.includes(value[0])) {
      throw new FormatError(`policy.json: ${name} must be [kind, seconds] with kind one of ${KINDS.join(", ")}, got ${JSON.stringify(value)}`);
    }
    const [kind, seconds] = value as [LatencyKind, unknown];
    if (typeof seconds !== "number" || !(Number.isFinite(seconds) && seconds > 0)) {
      throw new FormatError(`policy.json: ${name} must be a positive number of seconds, got ${JSON.stringify(seconds)}`);
    }
    if (!budgetModel(lat, kind)) throw new FormatError(`policy.json: ${name} is a ${kind} budget, and the policy has no p95 ${kind} model`);
    lat.defaults.set(suite, { kind, budgetS: seconds });
  }
}

function readTier(raw: unknown, k: number, name: string): BudgetTier {
  if (typeof raw !== "object" || raw === null) throw new FormatError(`policy.json: ${name} must be an object`);
  const d = raw as Json;
  const kind = d["kind"];
  if (!KINDS.includes(kind as LatencyKind)) {
    throw new FormatError(`policy.json: ${name}.kind: unknown budget kind ${JSON.stringify(kind)}; this runtime reads ${KINDS.join(", ")}`);
  }
  const budgetS = d["budget_s"];
  if (typeof budgetS !== "number" || !(Number.isFinite(budgetS) && budgetS > 0)) {
    throw new FormatError(`policy.json: ${name}.budget_s must be a positive number, got ${JSON.stringify(budgetS)}`);
  }
  const maskS = d["mask_s"] ?? budgetS;
  if (typeof maskS !== "number" || !(Number.isFinite(maskS) && maskS > 0)) {
    throw new FormatError(`policy.json: ${name}.mask_s must be a positive number, got ${JSON.stringify(maskS)}`);
  }
  const knob = parseKnob(d["knob"], k, `${name}.knob`);
  const violation = d["violation"];
  if (!Array.isArray(violation) || violation.length !== knob.points.length || !violation.every((v) => v === null || typeof v === "number")) {
    throw new FormatError(`policy.json: ${name}.violation must hold one rate (or null) per knob point (${knob.points.length})`);
  }
  return { kind: kind as LatencyKind, budgetS, maskS, knob };
}
