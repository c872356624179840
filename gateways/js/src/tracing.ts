/**
 * The decision span (docs/tracing.md, "The decision span's contract"): the caller's W3C
 * `traceparent`, one SERVER span named `routeopt.route` per decision, its attributes (never the
 * prompt), and the header that makes the application's model call a child of the decision.
 *
 * No OpenTelemetry dependency: the host passes any `@opentelemetry/api` Tracer (typed here by
 * shape) or none. The parent is handed to `startSpan` as an OpenTelemetry Context built here:
 * the api keys a context's span by `Symbol.for("OpenTelemetry Context Key SPAN")` (global on
 * purpose, so that several copies of the api agree), which is what `trace.setSpanContext(
 * ROOT_CONTEXT, sc)` writes. A host whose tracer wants another context gives `contextFor`.
 *
 * Tracing never fails a decision: a tracer that throws is reported through `onError` and the
 * decision goes back as if no tracer had been given.
 */

export const DECISION_SPAN = "routeopt.route";
/** `SpanKind.SERVER` of `@opentelemetry/api` (a numeric enum: INTERNAL 0, SERVER 1, CLIENT 2). */
export const SPAN_KIND_SERVER = 1;
/** The key `@opentelemetry/api` stores a context's span under (its `createContextKey` uses Symbol.for). */
export const SPAN_KEY = Symbol.for("OpenTelemetry Context Key SPAN");

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-\S*)?$/;
const ZERO_TRACE = "0".repeat(32);
const ZERO_SPAN = "0".repeat(16);

export type AttributeValue = string | number | boolean | string[];
export type Attributes = Record<string, AttributeValue>;

/** `@opentelemetry/api`'s SpanContext, as far as this package reads or builds one. */
export interface SpanContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  isRemote?: boolean;
}

export interface Span {
  spanContext(): SpanContext;
  end(endTime?: number): void;
}

export interface SpanOptions {
  kind?: number;
  attributes?: Attributes;
  /** milliseconds since the epoch */
  startTime?: number;
}

/** Any `@opentelemetry/api` Tracer: `provider.getTracer("routeopt")`. */
export interface Tracer {
  startSpan(name: string, options?: SpanOptions, context?: any): Span;
}

/** What the host gives a Router or a Gateway to trace its decisions. */
export interface TracingOptions {
  tracer?: Tracer | null;
  /** the context to start a decision span in, given the caller's remote parent (default: `parentContext`) */
  contextFor?: ((parent: SpanContext) => unknown) | null;
}

/** The trace a decision belongs to: the header to send back, its trace id, and the span's id. */
export interface Traced {
  traceparent: string | null;
  traceId: string | null;
  spanId: string | null;
}

export const UNTRACED: Traced = Object.freeze({ traceparent: null, traceId: null, spanId: null });

/** [trace id, parent span id, flags] of a W3C `traceparent`, or null when it is absent or
 * invalid (W3C: the receiver then starts a new trace). Version 00 has exactly four fields. */
export function parseTraceparent(header: string | null | undefined): [string, string, string] | null {
  if (!header) return null;
  const m = TRACEPARENT.exec(header.trim());
  if (!m) return null;
  const [, version, traceId, spanId, flags, rest] = m;
  if (version === "ff" || (version === "00" && rest) || traceId === ZERO_TRACE || spanId === ZERO_SPAN) return null;
  return [traceId, spanId, flags];
}

/** The W3C header naming a span as the parent of what the caller does next. */
export function formatTraceparent(traceId: string, spanId: string, sampled: boolean): string {
  return `00-${traceId}-${spanId}-${sampled ? "01" : "00"}`;
}

export interface DecisionFacts {
  model: string;
  fallbacks: readonly string[];
  propensity: number;
  policyVersion: number;
  requestId?: string | null;
  defaultReason?: string | null;
  channel?: string | null;
  explored?: boolean | null;
  knobTarget?: number | null;
  suite?: string | null;
}

/** The decision span's attributes: the contract every runtime follows. Never the prompt. */
export function attributesFor(d: DecisionFacts): Attributes {
  const attrs: Attributes = {
    "routeopt.decision.model": d.model,
    "routeopt.decision.fallbacks": [...d.fallbacks],
    "routeopt.decision.propensity": d.propensity,
    "routeopt.policy.version": d.policyVersion,
  };
  const optional: [string, AttributeValue | null | undefined][] = [
    ["routeopt.decision.id", d.requestId], ["routeopt.policy.channel", d.channel],
    ["routeopt.decision.explored", d.explored], ["routeopt.knob.target", d.knobTarget],
    ["routeopt.suite", d.suite], ["routeopt.decision.default_reason", d.defaultReason],
  ];
  for (const [key, value] of optional) if (value !== null && value !== undefined) attrs[key] = value;
  return attrs;
}

/** A span that only carries the caller's remote span context (the api's NonRecordingSpan). */
function remoteSpan(sc: SpanContext): object {
  const span = {
    spanContext: () => sc, isRecording: () => false, end: () => {}, recordException: () => {},
    setAttribute: () => span, setAttributes: () => span, addEvent: () => span, addLink: () => span,
    addLinks: () => span, setStatus: () => span, updateName: () => span,
  };
  return span;
}

/** An immutable OpenTelemetry Context (the api's BaseContext: getValue, setValue, deleteValue). */
class Context {
  constructor(private readonly values: ReadonlyMap<symbol, unknown>) {}

  getValue(key: symbol): unknown {
    return this.values.get(key);
  }

  setValue(key: symbol, value: unknown): Context {
    return new Context(new Map(this.values).set(key, value));
  }

  deleteValue(key: symbol): Context {
    const values = new Map(this.values);
    values.delete(key);
    return new Context(values);
  }
}

/** What `trace.setSpanContext(ROOT_CONTEXT, parent)` of `@opentelemetry/api` gives, without it. */
export function parentContext(parent: SpanContext): unknown {
  return new Context(new Map([[SPAN_KEY, remoteSpan(parent)]]));
}

/** Milliseconds since the epoch, below the millisecond where the platform allows it. */
export function clock(): number {
  const p = globalThis.performance;
  return p && typeof p.timeOrigin === "number" ? p.timeOrigin + p.now() : Date.now();
}

/** Record one finished decision as a span that started at `startMs` and ends now; its parent
 * is the caller's `traceparent` (invalid or absent: the tracer's active context, else a new
 * trace). Without a tracer nothing is recorded and the caller's valid header comes back. */
export function recordDecision(tracing: TracingOptions, traceparent: string | null | undefined, startMs: number,
  attributes: Attributes, onError?: (error: unknown) => void): Traced {
  const parsed = parseTraceparent(traceparent);
  const untraced: Traced = parsed ? { traceparent: traceparent!.trim(), traceId: parsed[0], spanId: null } : UNTRACED;
  const tracer = tracing.tracer;
  if (!tracer) return untraced;
  try {
    let context: unknown;
    if (parsed) {
      const parent: SpanContext = { traceId: parsed[0], spanId: parsed[1], traceFlags: parseInt(parsed[2], 16), isRemote: true };
      context = (tracing.contextFor ?? parentContext)(parent);
    }
    const span = tracer.startSpan(DECISION_SPAN, { kind: SPAN_KIND_SERVER, attributes, startTime: startMs }, context);
    span.end(Math.max(startMs, clock()));
    const sc = span.spanContext();
    return { traceparent: formatTraceparent(sc.traceId, sc.spanId, (sc.traceFlags & 1) === 1), traceId: sc.traceId, spanId: sc.spanId };
  } catch (error) {
    onError?.(error);
    return untraced;
  }
}
