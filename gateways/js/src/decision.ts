/**
 * Section 8, "Decision": the model a point chooses, its propensity and the fallback order;
 * 8.1 exploration and canary draws.
 */

import { Blake2b, unitAt } from "./blake2b.js";
import { ByteScratch, textBytes } from "./bytes.js";
import { Knob, Point, memberChoice } from "./knob.js";

export interface Choice {
  pick: number;
  propensity: number;
  fallbacks: number[];
}

/** The point's choice for (p, c) and mixing draw u (section 8); with `allowed` (8.3: a
 * latency budget's mask) both members choose among the allowed candidates, and they come
 * first in the fallbacks. */
export function decidePoint(knob: Knob, point: Point, p: Float64Array, c: Float64Array, u: () => number,
  allowed: Uint8Array | null = null): Choice {
  const a = memberChoice(knob.members[point.a], p, c, allowed);
  let pick = a;
  let propensity = 1.0;
  if (point.weight < 1) {
    const w = point.weight;
    const b = memberChoice(knob.members[point.b], p, c, allowed);
    pick = a === b || u() < w ? a : b; // the draw only matters (and is only hashed) when the members differ
    propensity = w * (a === pick ? 1 : 0) + (1 - w) * (b === pick ? 1 : 0);
  }
  return { pick, propensity, fallbacks: fallbackOrder(p, c, fallbackLambda(knob, point), pick, allowed) };
}

/** The first lambda member's parameter among (a, b), else 0. */
export function fallbackLambda(knob: Knob, point: Point): number {
  for (const i of [point.a, point.b]) if (knob.members[i].rule === "lambda") return knob.members[i].param;
  return 0;
}

const SCORE = new Float64Array(256);

/** Candidates by p - lambda c descending, then cost, then index (with `allowed`, the allowed
 * candidates first); without the pick. */
export function fallbackOrder(p: Float64Array, c: Float64Array, lam: number, pick: number, allowed: Uint8Array | null = null): number[] {
  const k = p.length;
  const score = k <= SCORE.length ? SCORE : new Float64Array(k);
  for (let j = 0; j < k; j++) score[j] = -(p[j] - lam * c[j]);
  return sortedWithout(score, c, pick, allowed);
}

/** Every candidate but `pick` by (allowed first, key ascending, cost ascending, index): an
 * insertion sort, as K is small and a decision should not allocate a comparator. */
export function sortedWithout(key: Float64Array, c: Float64Array, pick: number, allowed: Uint8Array | null = null): number[] {
  const k = c.length;
  const order: number[] = new Array(pick >= 0 && pick < k ? k - 1 : k);
  const out = (j: number) => (allowed !== null && !allowed[j] ? 1 : 0);
  let filled = 0;
  for (let j = 0; j < k; j++) {
    if (j === pick) continue;
    let at = filled++;
    while (at > 0) {
      const o = order[at - 1];
      const oo = out(o), oj = out(j);
      if (oo < oj || (oo === oj && (key[o] < key[j] || (key[o] === key[j] && c[o] <= c[j])))) break; // o stays first (ties: lower index)
      order[at] = o;
      at--;
    }
    order[at] = j;
  }
  return order;
}

// -- 8.1 exploration and canary ------------------------------------------------------------

/** Two numbers in [0, 1] from BLAKE2b-128 of the request id keyed with `key`. */
export function unitDraw(key: Uint8Array, requestId: string): [number, number] {
  const h = hasher.start(16, key).update(idBytes.encode(requestId)).finish();
  return [unitAt(h, 0), unitAt(h, 1)];
}

const hasher = new Blake2b();
const idBytes = new ByteScratch(256);

/** SHA-256("routeopt-<label>:<seed>") (WebCrypto), or 32 random bytes without a seed. */
export async function deriveKey(label: string, seed: number | string | null | undefined): Promise<Uint8Array> {
  if (seed === null || seed === undefined) return crypto.getRandomValues(new Uint8Array(32));
  return new Uint8Array(await crypto.subtle.digest("SHA-256", textBytes(`routeopt-${label}:${seed}`)));
}

export interface ExplorationOptions {
  rate: number;
  exclude?: string[];
  maxCostUsd?: number | null;
  maxCostRatio?: number | null;
  seed?: number | string | null;
}

export interface Explored {
  model: string;
  propensity: number;
  explored: boolean;
  eligible: string[];
}

/** Check an exploration's settings the way Python's `Exploration` does. */
export function checkExploration(x: ExplorationOptions): void {
  if (!(typeof x.rate === "number" && x.rate >= 0 && x.rate <= 1)) throw new RangeError(`exploration rate must be in [0, 1], got ${x.rate}`);
  for (const name of ["maxCostUsd", "maxCostRatio"] as const) {
    const v = x[name];
    if (v !== undefined && v !== null && !(Number.isFinite(v) && v > 0)) throw new RangeError(`exploration ${name} must be a positive number, got ${v}`);
  }
}

/** A latency budget the decision was made under: each candidate's predicted p95, and the budget asked for (8.3). */
export interface BudgetLimits {
  predictedS: Record<string, number>;
  budgetS: number;
}

/** Exploration of a decision (model m, costs by name) for draws u, v (8.1); under a latency
 * budget, only candidates predicted to meet it are eligible. */
export function explore(model: string, names: string[], cost: Record<string, number>, x: ExplorationOptions | null,
  u: number, v: number, limits: BudgetLimits | null = null): Explored {
  if (!x || x.rate <= 0) return { model, propensity: 1, explored: false, eligible: [] };
  let cap = x.maxCostUsd ?? Infinity;
  if (x.maxCostRatio !== undefined && x.maxCostRatio !== null) cap = Math.min(cap, x.maxCostRatio * (cost[model] ?? Infinity));
  const exclude = new Set(x.exclude ?? []);
  const eligible = names.filter((n) => !exclude.has(n) && (cost[n] ?? Infinity) <= cap
    && (limits === null || (limits.predictedS[n] ?? Infinity) <= limits.budgetS));
  if (eligible.length === 0) return { model, propensity: 1, explored: false, eligible: [] };
  const n = eligible.length;
  const explored = u < x.rate;
  const served = explored ? eligible[Math.min(Math.floor(v * n), n - 1)] : model;
  const share = eligible.includes(served) ? x.rate / n : 0;
  return { model: served, propensity: (1 - x.rate) * (served === model ? 1 : 0) + share, explored, eligible };
}
