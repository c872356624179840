/**
 * @routeopt/gateway: routeopt's policy formats 3 and 4 (docs/policy-format.md) in JavaScript.
 *
 *     const router = await Router.open({ url: "https://policies.internal/", publicKeys: [pem], refreshS: 60 });
 *     const d = router.route(prompt, { suite: "invoice-total", requestId });
 *     d.model, d.fallbacks, d.propensity, d.policyVersion, d.decisionId
 *     const b = router.route(prompt, { suite, ttftBudgetS: 0.8 })  // format 4: b.budget is { kind, budgetS, tierS, met, predictedS, maskS }
 *     router.route(prompt, { suite }).budget  // the policy's default budget for the suite, if it has one
 *     router.observe(b.model, { ttftS: 0.42, predictedTtftS: b.budget.predictedS[b.model] })  // 8.4: what the call took,
 *     // against the p95 predicted for it: a decision under a budget moves off a candidate running slower than predicted
 *
 * Tracing: give `tracer` (any @opentelemetry/api Tracer) to Router.open or Gateway.create and
 * `traceparent` to route(); see tracing.ts.
 *
 * Modules follow the spec's sections: bytes, features, scorer, calibration, knob, decision,
 * verification, conformance. Node's file log is in "@routeopt/gateway/node".
 */

export { Router, PolicyLoadError, newRequestId } from "./registry.js";
export type { Decision, RouteOptions, RouterOptions, RouterStatus, StateStore } from "./registry.js";
export { Gateway, MemoryLog, isoTime } from "./gateway.js";
export type { GatewayOptions, GatewayStatus, LogSink } from "./gateway.js";
export type { ExplorationOptions } from "./decision.js";
export { DEFAULT_LIVE, LiveLatency, liveMove, nearestRankP95 } from "./live.js";
export type { LiveMove, LiveSettings, Observation } from "./live.js";
export { Policy, readPolicy, FORMAT_VERSION, LATENCY_FORMAT_VERSION } from "./policy.js";
export type { BudgetOptions, BudgetOutcome, Decided } from "./policy.js";
export type { Budget, LatencyKind } from "./latency.js";
export { checkVectors, summary as conformanceSummary } from "./conformance.js";
export type { ConformanceReport } from "./conformance.js";
export { VerificationError } from "./verification.js";
export { FormatError } from "./container.js";
export { blake2b, ENGINE as BLAKE2B_ENGINE } from "./blake2b.js";
export { ENGINE as KERNEL_ENGINE } from "./kernel.js";
export type { Engine } from "./kernel.js";
export { attributesFor, DECISION_SPAN, formatTraceparent, parentContext, parseTraceparent, recordDecision } from "./tracing.js";
export type { Attributes, DecisionFacts, Span, SpanContext, SpanOptions, Traced, Tracer, TracingOptions } from "./tracing.js";
