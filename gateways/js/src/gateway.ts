/**
 * Section 8.1-8.2: a gateway around the champion Router (and, for a canary, the candidate's):
 * exploration with exact propensities, a sticky canary share, and decision-log lines in the
 * JSON Lines format of Python's `routeopt.artifacts.serving.gateway`, so `routeopt import decisions`,
 * `routeopt import feedback --log` and `routeopt policies evaluate` read them unchanged.
 *
 * Logging never blocks or fails a routing call: a line is built from values already at hand
 * and handed to the sink; a sink that throws is counted, and the decision still returns.
 *
 * Tracing (docs/tracing.md): the gateway, not its routers, records the decision's span, with
 * the served model, the channel and whether it explored; the log line keeps its trace and span ids.
 */

import { blake2b } from "./blake2b.js";
import { textBytes } from "./bytes.js";
import { checkExploration, deriveKey, explore, ExplorationOptions, unitDraw } from "./decision.js";
import { hex } from "./verification.js";
import type { Observation } from "./live.js";
import { Decision, newRequestId, RouteOptions, Router, RouterStatus } from "./registry.js";
import { attributesFor, clock, recordDecision, Traced, TracingOptions, UNTRACED } from "./tracing.js";

export const LOG_FORMAT_VERSION = 1;

/** Where decision-log lines go: one JSON object per call, without the newline. */
export interface LogSink {
  write(line: string): void;
  flush?(): Promise<void>;
  close?(): Promise<void>;
}

/** `tracer` and `contextFor` default to the champion router's. */
export interface GatewayOptions extends TracingOptions {
  exploration?: ExplorationOptions | null;
  candidate?: Router | null;
  canaryShare?: number;
  canarySeed?: number | string;
  log?: LogSink | null;
  /** the only way prompt text is logged: its return value (null keeps none) */
  redact?: ((prompt: string) => string | null) | null;
  /** key of the logged prompt hash (default: none) */
  hashKey?: Uint8Array;
}

export interface GatewayStatus {
  champion: RouterStatus;
  candidate: RouterStatus | null;
  logged: number;
  logErrors: number;
  errors: number;
  lastError: string | null;
}

/** UTC ISO-8601 with microseconds and a Z, as Python's iso_time writes it. */
export function isoTime(ms: number): string {
  return new Date(ms).toISOString().slice(0, 19) + "." + String(Math.floor(ms % 1000) * 1000).padStart(6, "0") + "Z";
}

export class Gateway {
  private logged = 0;
  private logErrors = 0;
  private errors = 0;
  private lastError: string | null = null;

  private readonly tracing: TracingOptions;

  private constructor(readonly champion: Router, private readonly opts: GatewayOptions,
    private readonly exploreKey: Uint8Array, private readonly canaryKey: Uint8Array) {
    this.tracing = opts.tracer !== undefined ? opts : champion.tracing;
  }

  static async create(champion: Router, opts: GatewayOptions = {}): Promise<Gateway> {
    const share = opts.canaryShare ?? 0;
    if (!(share >= 0 && share <= 1)) throw new RangeError(`canaryShare must be in [0, 1], got ${share}`);
    if (opts.exploration) checkExploration(opts.exploration);
    const exploreKey = await deriveKey("explore", opts.exploration?.seed);
    const canaryKey = await deriveKey("canary", opts.canarySeed ?? "routeopt");
    return new Gateway(champion, opts, exploreKey, canaryKey);
  }

  /** Route one request: the canary arm, the policy's decision, exploration, the decision's
   * span (a child of `opts.traceparent`; `decision.traceparent` names it) and the log line. */
  route(prompt: string, opts: RouteOptions = {}): Decision {
    const traced = Boolean(this.tracing.tracer || opts.traceparent);
    const start = traced ? clock() : 0;
    const rid = opts.requestId ?? newRequestId();
    const candidate = this.opts.candidate;
    const canary = Boolean(candidate) && (this.opts.canaryShare ?? 0) > 0
      && unitDraw(this.canaryKey, rid)[0] < (this.opts.canaryShare ?? 0);
    const router = canary ? candidate! : this.champion;
    const d = router.decide(prompt, { suite: opts.suite, qualityTarget: opts.qualityTarget, requestId: rid,
      ttftBudgetS: opts.ttftBudgetS, latencyBudgetS: opts.latencyBudgetS });
    const channel = canary ? "candidate" : "champion";
    try {
      const x = this.opts.exploration && this.opts.exploration.rate > 0 ? this.opts.exploration : null;
      const names = Object.keys(d.passProbabilities);
      const [u, v] = x ? unitDraw(this.exploreKey, rid) : [1, 0];
      const limits = d.budget && "predictedS" in d.budget ? { predictedS: d.budget.predictedS, budgetS: d.budget.budgetS } : null;
      const e = explore(d.model, names, d.expectedCostUsd, x, u, v, limits);
      const fallbacks = e.model === d.model ? d.fallbacks : [d.model, ...d.fallbacks.filter((f) => f !== e.model)];
      const t = traced ? recordDecision(this.tracing, opts.traceparent, start, attributesFor({
        model: e.model, fallbacks, propensity: e.propensity, policyVersion: d.policyVersion, requestId: rid,
        defaultReason: d.defaultReason, channel, explored: e.explored, knobTarget: router.knobTarget(d, opts.qualityTarget),
        suite: opts.suite,
      }), (err) => this.failed(err)) : UNTRACED;
      const out: Decision = { ...d, model: e.model, fallbacks, propensity: e.propensity, decisionId: rid,
        traceparent: t.traceparent, traceId: t.traceId };
      if (this.opts.log) this.write(this.record(prompt, opts, rid, channel, d, e.model, e.propensity, e.explored, e.eligible, x, t));
      return out;
    } catch (err) {
      this.failed(err);
      return { ...d, decisionId: rid };
    }
  }

  private failed(err: unknown): void {
    this.errors++;
    this.lastError = String((err as Error)?.message ?? err);
  }

  private record(prompt: string, opts: { suite?: string | null; qualityTarget?: number | null }, rid: string, channel: string,
    d: Decision, model: string, propensity: number, explored: boolean, eligible: string[], x: ExplorationOptions | null,
    t: Traced): Record<string, unknown> {
    const rec: Record<string, unknown> = {
      v: LOG_FORMAT_VERSION, kind: "decision", time: isoTime(Date.now()), request_id: rid, suite: opts.suite ?? null,
      quality_target: opts.qualityTarget ?? null, ...this.promptFields(prompt), channel, policy_version: d.policyVersion,
      model, propensity, policy_model: d.model, policy_probability: d.policyProbability, explored,
      pass_probabilities: d.passProbabilities, expected_cost_usd: d.expectedCostUsd,
    };
    if (d.budget) {
      rec.budget = "unserved" in d.budget
        ? { kind: d.budget.kind, budget_s: d.budget.budgetS, met: null, unserved: d.budget.unserved }
        : { kind: d.budget.kind, budget_s: d.budget.budgetS, tier_s: d.budget.tierS, met: d.budget.met };
    }
    if (d.live) rec.live = { from: d.live.from, over: d.live.over };
    if (d.unknownSuite) rec.unknown_suite = true;
    if (t.traceId !== null) {  // feedback, decisions and traces join on it
      rec.trace_id = t.traceId;
      if (t.spanId !== null) rec.span_id = t.spanId;
    }
    if (x) rec.exploration = { rate: x.rate, eligible };
    if ((this.opts.canaryShare ?? 0) > 0 && this.opts.candidate) rec.canary_share = this.opts.canaryShare;
    return rec;
  }

  private promptFields(prompt: string): Record<string, unknown> {
    const raw = textBytes(prompt);
    let continuation = 0;
    for (let i = 0; i < raw.length; i++) if ((raw[i] & 0xc0) === 0x80) continuation++;
    const out: Record<string, unknown> = { prompt_hash: hex(blake2b(raw, 16, this.opts.hashKey)), prompt_chars: raw.length - continuation };
    if (this.opts.redact) {
      try {
        const text = this.opts.redact(prompt);
        if (typeof text === "string") out.text = text;
      } catch {
        // a failing hook must never let the raw text through
      }
    }
    return out;
  }

  /** One call of `model` as measured (TTFT and end-to-end seconds, each with the p95 the
   * decision predicted for it where known): both channels' routers learn from it
   * (Router.observe; 8.4). */
  observe(model: string, obs: Observation): void {
    this.champion.observe(model, obs);
    this.opts.candidate?.observe(model, obs);
  }

  /** Log what the call cost once it is done (tokens from the API's usage fields). */
  recordUsage(requestId: string, model: string, usage: { inputTokens?: number; outputTokens?: number; costUsd?: number } = {}): boolean {
    if (!this.opts.log) return false;
    this.write({ v: LOG_FORMAT_VERSION, kind: "usage", time: isoTime(Date.now()), request_id: requestId, model,
      input_tokens: usage.inputTokens ?? null, output_tokens: usage.outputTokens ?? null, cost_usd: usage.costUsd ?? null });
    return true;
  }

  private write(rec: Record<string, unknown>): void {
    try {
      this.opts.log!.write(JSON.stringify(rec));
      this.logged++;
    } catch {
      this.logErrors++;
    }
  }

  status(): GatewayStatus {
    return { champion: this.champion.status(), candidate: this.opts.candidate?.status() ?? null, logged: this.logged,
      logErrors: this.logErrors, errors: this.errors, lastError: this.lastError };
  }

  async close(): Promise<void> {
    this.champion.close();
    this.opts.candidate?.close();
    await this.opts.log?.close?.();
  }
}

/** A sink that keeps lines in memory (tests, or a worker that ships them itself). */
export class MemoryLog implements LogSink {
  readonly lines: string[] = [];
  write(line: string): void {
    this.lines.push(line);
  }
}
