/**
 * Section 8.4, "Live latency": what a gateway sees of each candidate's latency now, and when
 * that moves a decision under a budget. Evals run at night; a provider's latency moves with its
 * load during the day. The application feeds each call's measured TTFT and end-to-end latency
 * back (Router.observe), each with the p95 the policy predicted for that call where it has one
 * (the decision's budget.predictedS of the model called); per (candidate, kind) the newest
 * `maxObservations` in arrival order are kept. Over those of the last `windowS` seconds, once
 * there are `minObservations` of them, a candidate's live p95 is the nearest-rank 95th
 * percentile of the seconds (for status pages) and its live factor that of measured / predicted
 * over the calls that carried a prediction: about 1 when it runs as the evals measured it,
 * whatever mix of short and long requests it serves. It is slow when the factor exceeds
 * `slowFactor`; a decision whose candidate, slowed by its factor, no longer fits the tier's mask
 * moves (liveMove). Everything is a function of the observations and the times given, so this
 * runtime and Python's decide alike.
 */

import { KINDS, LatencyKind } from "./latency.js";

/** How much a router remembers: `windowS` seconds, at most `maxObservations` per candidate
 * and kind, and a live figure only from `minObservations` on; a candidate is slow when its live
 * factor (measured / predicted p95) exceeds `slowFactor`. */
export interface LiveSettings {
  windowS: number;
  maxObservations: number;
  minObservations: number;
  slowFactor: number;
}

export const DEFAULT_LIVE: LiveSettings = { windowS: 30, maxObservations: 256, minObservations: 20, slowFactor: 1.5 };

/** One call of a model as the application measured it (seconds), each measurement with the p95
 * the decision predicted for the call where known (its budget.predictedS of the model called);
 * `at` defaults to the router's clock. */
export interface Observation {
  ttftS?: number | null;
  latencyS?: number | null;
  predictedTtftS?: number | null;
  predictedLatencyS?: number | null;
  at?: number | null;
}

/** A decision that live latency moved: the policy's own model, and every candidate over the
 * limit live (slow, and its prediction slowed by its factor past the tier's mask), in candidate
 * order. */
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
  if (!(typeof out.slowFactor === "number" && Number.isFinite(out.slowFactor) && out.slowFactor >= 1)) {
    throw new RangeError(`slowFactor must be a finite number >= 1, got ${shown(out.slowFactor)}`);
  }
  return out;
}

/** A value as an error message shows it: numbers as they are (NaN, Infinity), the rest as JSON. */
function shown(v: unknown): string {
  return typeof v === "number" ? String(v) : JSON.stringify(v);
}

/** The ceil(0.95 n)-th smallest of n values, the rank in integer arithmetic: (95 n + 99) div 100. */
export function nearestRankP95(values: ArrayLike<number>): number {
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.floor((95 * sorted.length + 99) / 100) - 1];
}

/** Seconds as an observation gives them: a non-negative finite number (positive for a prediction). */
function seconds(what: string, v: unknown, positive = false): number {
  if (typeof v !== "number" || !(Number.isFinite(v) && v >= 0)) {
    throw new RangeError(`${what} must be a non-negative number of seconds, got ${shown(v)}`);
  }
  if (positive && v === 0) throw new RangeError(`${what} must be a positive number of seconds, got ${v}`);
  return v;
}

/** The (kind, seconds, seconds / predicted or NaN without a prediction) an observation holds. A
 * value that is not a non-negative finite number, a prediction that is not a positive one, or a
 * prediction without its measurement is an error: a gateway must not learn from garbage. */
export function observation(model: unknown, at: unknown, ttftS: unknown, latencyS: unknown,
  predictedTtftS: unknown = null, predictedLatencyS: unknown = null): [LatencyKind, number, number][] {
  if (typeof model !== "string" || !model) throw new TypeError(`model must be a non-empty string, got ${JSON.stringify(model)}`);
  if (typeof at !== "number" || !Number.isFinite(at)) throw new RangeError(`the observation time must be a finite number, got ${String(at)}`);
  const rows: [LatencyKind, number, number][] = [];
  for (const [kind, v, pred, what, predWhat] of [["ttft", ttftS, predictedTtftS, "ttftS", "predictedTtftS"],
    ["latency", latencyS, predictedLatencyS, "latencyS", "predictedLatencyS"]] as const) {
    const predicted = pred !== undefined && pred !== null;
    if (v === undefined || v === null) {
      if (predicted) throw new TypeError(`${predWhat} was given without ${what}`);
      continue;
    }
    const value = seconds(what, v);
    rows.push([kind, value, predicted ? value / seconds(predWhat, pred, true) : NaN]);
  }
  return rows;
}

/** Times, seconds and ratios (NaN: no prediction) of one (model, kind), oldest first. */
interface Series {
  t: number[];
  v: number[];
  r: number[];
}

export class LiveLatency {
  private readonly series = new Map<string, Series>();

  constructor(readonly settings: LiveSettings = DEFAULT_LIVE) {}

  /** One call of `model` at time `at` (seconds, on the clock the figures are asked with), each
   * measurement with its predicted p95 where known; see observation(). */
  observe(model: string, at: number, ttftS?: number | null, latencyS?: number | null,
    predictedTtftS?: number | null, predictedLatencyS?: number | null): void {
    for (const [kind, v, ratio] of observation(model, at, ttftS, latencyS, predictedTtftS, predictedLatencyS)) {
      const key = model + "\u0000" + kind;
      let s = this.series.get(key);
      if (!s) this.series.set(key, (s = { t: [], v: [], r: [] }));
      s.t.push(at);
      s.v.push(v);
      s.r.push(ratio);
      if (s.t.length > this.settings.maxObservations) {
        s.t.shift();
        s.v.shift();
        s.r.shift();
      }
    }
  }

  /** The nearest-rank p95 of one column (seconds, or ratios with NaNs left out) of the
   * observations after `now - windowS`, or null with fewer than `minObservations`. */
  private recent(model: string, kind: LatencyKind, now: number, column: "v" | "r"): number | null {
    const s = this.series.get(model + "\u0000" + kind);
    if (!s) return null;
    const cutoff = now - this.settings.windowS;
    while (s.t.length && s.t[0] <= cutoff) {  // arrival order: the oldest first
      s.t.shift();
      s.v.shift();
      s.r.shift();
    }
    const values = s[column], recent: number[] = [];
    for (let i = 0; i < s.t.length; i++) if (s.t[i] > cutoff && !Number.isNaN(values[i])) recent.push(values[i]);
    return recent.length < this.settings.minObservations ? null : nearestRankP95(recent);
  }

  /** The live p95 of `kind` for `model` at `now` (never decreasing) in seconds, for status
   * pages; null with too few recent observations. */
  p95(model: string, kind: LatencyKind, now: number): number | null {
    return this.recent(model, kind, now, "v");
  }

  /** The live factor: the p95 of measured / predicted over the recent calls that carried a
   * prediction, or null with too few of them. */
  factor(model: string, kind: LatencyKind, now: number): number | null {
    return this.recent(model, kind, now, "r");
  }

  /** The models slow at `now` (live factor over `slowFactor`), each with its factor, in the order given. */
  slow(models: readonly string[], kind: LatencyKind, now: number): Map<string, number> {
    const out = new Map<string, number>();
    for (const m of models) {
      const f = this.factor(m, kind, now);
      if (f !== null && f > this.settings.slowFactor) out.set(m, f);
    }
    return out;
  }

  /** Every observed model's live p95 and live factor per kind at `now` (for status pages), with
   * Python's keys: ttft, latency, ttft_factor, latency_factor. */
  snapshot(now: number): Record<string, Record<LatencyKind | `${LatencyKind}_factor`, number | null>> {
    const models = [...new Set([...this.series.keys()].map((k) => k.split("\u0000")[0]))].sort();
    return Object.fromEntries(models.map((m) => [m, Object.fromEntries([
      ...KINDS.map((k) => [k, this.p95(m, k, now)]),
      ...KINDS.map((k) => [`${k}_factor`, this.factor(m, k, now)]),
    ])])) as Record<string, Record<LatencyKind | `${LatencyKind}_factor`, number | null>>;
  }
}

/** Where a decision under a budget moves when its model, slowed by its live factor, is
 * predicted past `limitS` (the tier's mask, or the budget with no tier): the first fallback
 * whose prediction, slowed likewise where it is slow, is within the limit and which is at least
 * as likely to pass. The new model, the new fallbacks (the old model, then the rest in order)
 * and the candidates over the limit live, in candidate order; null: it stays. */
export function liveMove(model: string, fallbacks: readonly string[], candidates: readonly string[],
  p: Record<string, number>, predictedS: Record<string, number>, limitS: number,
  slow: ReadonlyMap<string, number>): { model: string; fallbacks: string[]; over: string[] } | null {
  const live = (k: string): number => {
    const f = slow.get(k);
    return f === undefined ? predictedS[k] : predictedS[k] * f;
  };
  if (!slow.has(model) || live(model) <= limitS) return null;
  const floor = p[model];
  for (const f of fallbacks) {
    if (live(f) <= limitS && p[f] >= floor) {
      const over = candidates.filter((k) => slow.has(k) && live(k) > limitS);
      return { model: f, fallbacks: [model, ...fallbacks.filter((g) => g !== f)], over };
    }
  }
  return null;
}
