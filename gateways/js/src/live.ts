/**
 * Section 8.4, "Live latency": what a gateway sees of each candidate's latency now, and when
 * that moves a decision under a budget. Evals run at night; a provider's latency moves with its
 * load during the day. The application feeds each call's measured TTFT and end-to-end latency
 * back (Router.observe); per (candidate, kind) the newest `maxObservations` in arrival order are
 * kept, and a live p95 is the nearest-rank 95th percentile of those of the last `windowS`
 * seconds once there are `minObservations` of them. Everything is a function of the
 * observations and the times given, so this runtime and Python's decide alike.
 */

import { KINDS, LatencyKind } from "./latency.js";

/** How much a router remembers: `windowS` seconds, at most `maxObservations` per candidate
 * and kind, and a live p95 only from `minObservations` on. */
export interface LiveSettings {
  windowS: number;
  maxObservations: number;
  minObservations: number;
}

export const DEFAULT_LIVE: LiveSettings = { windowS: 30, maxObservations: 256, minObservations: 20 };

/** One call of a model as the application measured it (seconds); `at` defaults to the router's clock. */
export interface Observation {
  ttftS?: number | null;
  latencyS?: number | null;
  at?: number | null;
}

/** A decision that live latency moved: the policy's own model, and every candidate over the
 * budget live, in candidate order. */
export interface LiveMove {
  from: string;
  over: string[];
}

/** Settings checked as Python's LiveSettings checks them; missing (or undefined) fields take the defaults. */
export function liveSettings(s: Partial<LiveSettings> = {}): LiveSettings {
  const given = Object.entries(s ?? {}).filter(([, v]) => v !== undefined);
  const out: LiveSettings = { ...DEFAULT_LIVE, ...Object.fromEntries(given) };
  if (!(typeof out.windowS === "number" && Number.isFinite(out.windowS) && out.windowS > 0)) {
    throw new RangeError(`windowS must be a positive number of seconds, got ${JSON.stringify(out.windowS)}`);
  }
  if (!(Number.isSafeInteger(out.maxObservations) && out.maxObservations >= 1)) {
    throw new RangeError(`maxObservations must be a positive integer, got ${JSON.stringify(out.maxObservations)}`);
  }
  if (!(Number.isSafeInteger(out.minObservations) && out.minObservations >= 1 && out.minObservations <= out.maxObservations)) {
    throw new RangeError(`minObservations must be an integer from 1 to maxObservations, got ${JSON.stringify(out.minObservations)}`);
  }
  return out;
}

/** The ceil(0.95 n)-th smallest of n values, the rank in integer arithmetic: (95 n + 99) div 100. */
export function nearestRankP95(values: ArrayLike<number>): number {
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.floor((95 * sorted.length + 99) / 100) - 1];
}

/** The (kind, seconds) an observation holds. A value that is not a non-negative finite number
 * is an error: a gateway must not learn from garbage. */
export function observation(model: unknown, at: unknown, ttftS: unknown, latencyS: unknown): [LatencyKind, number][] {
  if (typeof model !== "string" || !model) throw new TypeError(`model must be a non-empty string, got ${JSON.stringify(model)}`);
  if (typeof at !== "number" || !Number.isFinite(at)) throw new RangeError(`the observation time must be a finite number, got ${String(at)}`);
  const values: [LatencyKind, number][] = [];
  for (const [kind, v, what] of [["ttft", ttftS, "ttftS"], ["latency", latencyS, "latencyS"]] as const) {
    if (v === undefined || v === null) continue;
    if (typeof v !== "number" || !(Number.isFinite(v) && v >= 0)) {
      throw new RangeError(`${what} must be a non-negative number of seconds, got ${typeof v === "number" ? v : JSON.stringify(v)}`);
    }
    values.push([kind, v]);
  }
  return values;
}

/** Times and values of one (model, kind), oldest first. */
interface Series {
  t: number[];
  v: number[];
}

export class LiveLatency {
  private readonly series = new Map<string, Series>();

  constructor(readonly settings: LiveSettings = DEFAULT_LIVE) {}

  /** One call of `model` at time `at` (seconds, on the clock p95 is asked with); see observation(). */
  observe(model: string, at: number, ttftS?: number | null, latencyS?: number | null): void {
    for (const [kind, v] of observation(model, at, ttftS, latencyS)) {
      const key = model + "\u0000" + kind;
      let s = this.series.get(key);
      if (!s) this.series.set(key, (s = { t: [], v: [] }));
      s.t.push(at);
      s.v.push(v);
      if (s.t.length > this.settings.maxObservations) {
        s.t.shift();
        s.v.shift();
      }
    }
  }

  /** The live p95 of `kind` for `model` at `now` (never decreasing), or null with too few recent observations. */
  p95(model: string, kind: LatencyKind, now: number): number | null {
    const s = this.series.get(model + "\u0000" + kind);
    if (!s) return null;
    const cutoff = now - this.settings.windowS;
    while (s.t.length && s.t[0] <= cutoff) {  // arrival order: the oldest first
      s.t.shift();
      s.v.shift();
    }
    const recent: number[] = [];
    for (let i = 0; i < s.t.length; i++) if (s.t[i] > cutoff) recent.push(s.v[i]);
    return recent.length < this.settings.minObservations ? null : nearestRankP95(recent);
  }

  /** The models whose live p95 of `kind` exceeds the budget at `now`, in the order given. */
  over(models: readonly string[], kind: LatencyKind, budgetS: number, now: number): string[] {
    return models.filter((m) => {
      const p = this.p95(m, kind, now);
      return p !== null && p > budgetS;
    });
  }

  /** Every observed model's live p95 per kind at `now` (for status pages). */
  snapshot(now: number): Record<string, Record<LatencyKind, number | null>> {
    const models = [...new Set([...this.series.keys()].map((k) => k.split("\u0000")[0]))].sort();
    return Object.fromEntries(models.map((m) => [m, Object.fromEntries(KINDS.map((k) => [k, this.p95(m, k, now)]))])) as
      Record<string, Record<LatencyKind, number | null>>;
  }
}

/** Where a decision under a budget moves when its model is over the budget live: the first
 * fallback not over, predicted within the budget, and at least as likely to pass; the new
 * fallbacks are the old model and then the rest, in order. null: it stays. */
export function liveShift(model: string, fallbacks: readonly string[], p: Record<string, number>,
  predictedS: Record<string, number>, budgetS: number, over: readonly string[]): { model: string; fallbacks: string[] } | null {
  if (!over.includes(model)) return null;
  const floor = p[model];
  for (const f of fallbacks) {
    if (!over.includes(f) && predictedS[f] <= budgetS && p[f] >= floor) {
      return { model: f, fallbacks: [model, ...fallbacks.filter((g) => g !== f)] };
    }
  }
  return null;
}
