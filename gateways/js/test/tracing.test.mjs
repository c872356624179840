// The decision span (docs/tracing.md): the shared vectors, and spans recorded through the real
// OpenTelemetry SDK (a dev dependency only: the package itself imports none of it).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { ROOT_CONTEXT, SpanKind, trace } from "@opentelemetry/api";
import {
  AlwaysOffSampler, BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { attributesFor, Gateway, MemoryLog, parentContext, parseTraceparent, Router } from "../dist/index.js";
import { NO_FIXTURES, publicKey, versionFiles } from "./helpers.mjs";

const VECTORS = JSON.parse(readFileSync(new URL("../../../docs/tracing_vectors.json", import.meta.url), "utf8"));
const TRACE = "0af7651916cd43dd8448eb211c80319c";
const PARENT = "b7ad6b7169203331";
const HEADER = `00-${TRACE}-${PARENT}-01`;
const PROMPT = "secret prompt: invoice 4471 for ACME";

function sdk(sampler) {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)], sampler });
  return { tracer: provider.getTracer("routeopt"), spans: () => exporter.getFinishedSpans() };
}

const defaultRouter = (opts = {}) => Router.open({ files: {}, allowUnsigned: true, defaultModel: "gpt-4o-mini", ...opts });

for (const v of VECTORS.traceparent) {
  test(`traceparent vector: ${v.name}`, () => {
    assert.deepEqual(parseTraceparent(v.header), v.parsed);
  });
}

for (const v of VECTORS.decision_attributes) {
  test(`decision attribute vector: ${v.name}`, () => {
    const d = v.decision, c = v.context;
    const got = attributesFor({
      model: d.model, fallbacks: d.fallbacks, propensity: d.propensity ?? 1.0, policyVersion: d.policy_version,
      requestId: d.request_id, defaultReason: d.default_reason, channel: c.channel, explored: c.explored,
      knobTarget: c.knob_target, suite: c.suite,
    });
    assert.deepEqual(got, v.attributes);
    assert.deepEqual(Object.keys(got), Object.keys(v.attributes));
  });
}

test("the parent context built without the api is the one trace.setSpanContext builds", () => {
  const sc = { traceId: TRACE, spanId: PARENT, traceFlags: 1, isRemote: true };
  const ours = parentContext(sc);
  assert.deepEqual(trace.getSpanContext(ours), sc);
  assert.deepEqual(trace.getSpanContext(ours), trace.getSpanContext(trace.setSpanContext(ROOT_CONTEXT, sc)));
  assert.equal(trace.getSpan(ours).isRecording(), false);
});

test("a router's decision is a SERVER span, a child of the caller's traceparent, named in the answer", async () => {
  const { tracer, spans } = sdk();
  const router = await defaultRouter({ tracer });
  const before = Date.now();
  const d = router.route(PROMPT, { suite: "invoice-total", requestId: "req-1", traceparent: ` ${HEADER} ` });
  const [span] = spans();
  assert.equal(spans().length, 1);
  assert.equal(span.name, "routeopt.route");
  assert.equal(span.kind, SpanKind.SERVER);
  assert.equal(span.spanContext().traceId, TRACE);
  assert.equal(span.parentSpanContext.spanId, PARENT);
  assert.equal(span.parentSpanContext.isRemote, true);
  assert.equal(d.traceId, TRACE);
  assert.equal(d.traceparent, `00-${TRACE}-${span.spanContext().spanId}-01`);
  assert.deepEqual(span.attributes, {
    "routeopt.decision.model": "gpt-4o-mini", "routeopt.decision.fallbacks": [], "routeopt.decision.propensity": 1,
    "routeopt.policy.version": 0, "routeopt.decision.id": "req-1", "routeopt.suite": "invoice-total",
    "routeopt.decision.default_reason": d.defaultReason,
  });
  const startMs = span.startTime[0] * 1e3 + span.startTime[1] / 1e6, endMs = span.endTime[0] * 1e3 + span.endTime[1] / 1e6;
  assert.ok(startMs >= before - 1 && endMs >= startMs && endMs <= Date.now() + 1, `${before} ${startMs} ${endMs}`);
});

test("an invalid or absent header starts a new trace; never the prompt on a span", async () => {
  const { tracer, spans } = sdk();
  const router = await defaultRouter({ tracer });
  for (const v of VECTORS.traceparent.filter((x) => x.parsed === null)) {
    const d = router.route(PROMPT, { traceparent: v.header });
    const span = spans().at(-1);
    assert.equal(span.parentSpanContext, undefined, v.name);
    assert.notEqual(d.traceId, TRACE);
    assert.deepEqual(parseTraceparent(d.traceparent), [span.spanContext().traceId, span.spanContext().spanId, "01"]);
  }
  const text = JSON.stringify(spans().map((s) => [s.attributes, s.events, s.name]));
  assert.ok(!text.includes("secret") && !text.includes("4471"), text);
});

test("an unsampled parent gives an unsampled decision: nothing exported, flags 00 sent on", async () => {
  const { tracer, spans } = sdk();
  const router = await defaultRouter({ tracer });
  const d = router.route(PROMPT, { traceparent: `00-${TRACE}-${PARENT}-00` });
  assert.equal(spans().length, 0);
  const [traceId, spanId, flags] = parseTraceparent(d.traceparent);
  assert.deepEqual([traceId, flags], [TRACE, "00"]);
  assert.notEqual(spanId, PARENT);
  const off = sdk(new AlwaysOffSampler());
  const d2 = (await defaultRouter({ tracer: off.tracer })).route(PROMPT, { traceparent: HEADER });
  assert.equal(off.spans().length, 0);
  assert.match(d2.traceparent, new RegExp(`^00-${TRACE}-[0-9a-f]{16}-00$`));
});

test("without a tracer the caller's valid header comes back, an invalid one does not", async () => {
  const router = await defaultRouter();
  assert.deepEqual([router.route(PROMPT).traceparent, router.route(PROMPT).traceId], [null, null]);
  const d = router.route(PROMPT, { traceparent: `  ${HEADER}\t` });
  assert.deepEqual([d.traceparent, d.traceId], [HEADER, TRACE]);
  for (const v of VECTORS.traceparent) {
    const got = router.route(PROMPT, { traceparent: v.header });
    assert.deepEqual([got.traceparent, got.traceId], v.parsed ? [v.header.trim(), v.parsed[0]] : [null, null], v.name);
  }
});

test("a gateway records one span with its channel and exploration, and logs its ids", async () => {
  const { tracer, spans } = sdk();
  const log = new MemoryLog();
  const gateway = await Gateway.create(await defaultRouter({ tracer }), { log });
  const d = gateway.route(PROMPT, { suite: "s", requestId: "g-1", qualityTarget: 0.9, traceparent: HEADER });
  assert.equal(spans().length, 1);  // the router the gateway asks records none of its own
  const [span] = spans();
  assert.equal(span.parentSpanContext.spanId, PARENT);
  assert.deepEqual(span.attributes, {
    "routeopt.decision.model": "gpt-4o-mini", "routeopt.decision.fallbacks": [], "routeopt.decision.propensity": 1,
    "routeopt.policy.version": 0, "routeopt.decision.id": "g-1", "routeopt.policy.channel": "champion",
    "routeopt.decision.explored": false, "routeopt.knob.target": 0.9, "routeopt.suite": "s",
    "routeopt.decision.default_reason": d.defaultReason,
  });
  const line = JSON.parse(log.lines[0]);
  assert.equal(line.trace_id, TRACE);
  assert.equal(line.span_id, span.spanContext().spanId);
  assert.equal(d.traceparent, `00-${TRACE}-${line.span_id}-01`);
  assert.equal(d.traceId, TRACE);
  assert.ok(!log.lines[0].includes("secret"));
});

test("a gateway without a tracer logs the caller's trace id and no span id", async () => {
  const log = new MemoryLog();
  const gateway = await Gateway.create(await defaultRouter(), { log });
  const d = gateway.route(PROMPT, { requestId: "g-2", traceparent: HEADER });
  assert.deepEqual([d.traceparent, d.traceId], [HEADER, TRACE]);
  const line = JSON.parse(log.lines[0]);
  assert.equal(line.trace_id, TRACE);
  assert.ok(!("span_id" in line));
  gateway.route(PROMPT, { requestId: "g-3", traceparent: "00-garbage" });
  gateway.route(PROMPT, { requestId: "g-4" });
  for (const l of log.lines.slice(1)) assert.ok(!("trace_id" in JSON.parse(l)) && !("span_id" in JSON.parse(l)));
});

test("a gateway's own tracer overrides its router's; null turns tracing off", async () => {
  const routers = sdk(), own = sdk();
  const router = await defaultRouter({ tracer: routers.tracer });
  (await Gateway.create(router, { tracer: own.tracer })).route(PROMPT);
  (await Gateway.create(router, { tracer: null })).route(PROMPT);
  assert.deepEqual([routers.spans().length, own.spans().length], [0, 1]);
});

test("a tracer that throws never fails a decision: it is counted and the caller's header comes back", async () => {
  const broken = { startSpan() { throw new Error("exporter exploded"); } };
  const events = [];
  const router = await defaultRouter({ tracer: broken, onEvent: (kind, message) => events.push([kind, message]) });
  const d = router.route(PROMPT, { traceparent: HEADER });
  assert.deepEqual([d.model, d.traceparent, d.traceId], ["gpt-4o-mini", HEADER, TRACE]);
  assert.equal(events.at(-1)[0], "tracing");
  assert.match(events.at(-1)[1], /exporter exploded/);
  const log = new MemoryLog();
  const gateway = await Gateway.create(router, { log });
  const g = gateway.route(PROMPT, { requestId: "g-5" });
  assert.deepEqual([g.model, g.traceparent], ["gpt-4o-mini", null]);
  assert.equal(gateway.status().errors, 1);
  assert.match(gateway.status().lastError, /exporter exploded/);
  assert.equal(log.lines.length, 1);
});

test("contextFor gives the host's own context to its tracer", async () => {
  const seen = [];
  const tracer = { startSpan(name, options, context) {
    seen.push([name, options.kind, context]);
    return { spanContext: () => ({ traceId: TRACE, spanId: "1111111111111111", traceFlags: 1 }), end() {} };
  } };
  const router = await defaultRouter({ tracer, contextFor: (sc) => ({ host: sc }) });
  const d = router.route(PROMPT, { traceparent: `00-${TRACE}-${PARENT}-03` });
  assert.deepEqual(seen[0], ["routeopt.route", 1, { host: { traceId: TRACE, spanId: PARENT, traceFlags: 3, isRemote: true } }]);
  assert.equal(d.traceparent, `00-${TRACE}-1111111111111111-01`);
  router.route(PROMPT);
  assert.equal(seen[1][2], undefined);  // no header: the tracer's own active context
});

test("a policy's decision carries its version and the policy's own quality target", { skip: NO_FIXTURES }, async () => {
  const { tracer, spans } = sdk();
  const router = await Router.open({ files: versionFiles("registry"), publicKeys: [publicKey()], tracer });
  const d = router.route("Task: add the input. Input: 2 3", { suite: "add", traceparent: HEADER });
  const [span] = spans();
  assert.deepEqual(span.attributes, {
    "routeopt.decision.model": d.model, "routeopt.decision.fallbacks": d.fallbacks,
    "routeopt.decision.propensity": d.propensity, "routeopt.policy.version": 1,
    "routeopt.knob.target": router.policy.qualityTarget, "routeopt.suite": "add",
  });
  const log = new MemoryLog();
  const gateway = await Gateway.create(router, { log, exploration: { rate: 1, seed: 1 } });
  const g = gateway.route("Task: add the input. Input: 2 3", { suite: "add", requestId: "p-1", traceparent: HEADER });
  const last = spans().at(-1);
  assert.equal(last.attributes["routeopt.decision.model"], g.model);
  assert.equal(last.attributes["routeopt.decision.propensity"], g.propensity);
  assert.equal(last.attributes["routeopt.decision.explored"], JSON.parse(log.lines[0]).explored);
  assert.equal(JSON.parse(log.lines[0]).span_id, last.spanContext().spanId);
});
