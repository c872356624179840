// Section 8.4 on the format 4 policy the Python pipeline trained: a Router fed a scripted
// observation sequence (one candidate three times slower for 20 s) moves its decisions under a
// budget off that candidate and back after the window, decision for decision as Python's Router
// did on the same clock; the Gateway's log line says so; the live conformance layer catches a
// changed sequence; bad observations are clear errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkVectors, DEFAULT_LIVE, Gateway, LiveLatency, liveShift, MemoryLog, nearestRankP95, readPolicy, Router } from "../dist/index.js";
import { expected, NO_FIXTURES, patchMetadata, patchTensor, policyFiles, policyNames, publicKey, versionFiles } from "./helpers.mjs";

const NAME = "demo-latency";
const skip = NO_FIXTURES || (!policyNames().includes(NAME) && `${NAME} is not among the fixtures`);

/** A Router and a Gateway on the published version, on a clock the test moves. */
async function replaying(extra = {}) {
  const clock = { now: 0 };
  const open = () => Router.open({ files: versionFiles("registry-latency"), publicKeys: [publicKey()], clock: () => clock.now, ...extra });
  const router = await open(), candidate = await open(), log = new MemoryLog();
  const gateway = await Gateway.create(router, { log, candidate, canaryShare: 0 });
  return { clock, router, candidate, gateway, log };
}

test("a candidate slowed for a stretch loses its decisions under a budget and gets them back, as Python's Router decides", { skip }, async (t) => {
  const want = expected(`${NAME}-live`);
  const { clock, router, candidate, gateway, log } = await replaying();
  let decided = 0, moved = 0, lastMoved = -1;
  for (const e of want.events) {
    if (e.observe) {
      const o = e.observe;
      gateway.observe(o.model, { ttftS: o.ttft_s, latencyS: o.latency_s, at: o.at });
      continue;
    }
    clock.now = e.now;
    const r = e.route, where = `${r.id} at ${e.now}`;
    const d = gateway.route(r.prompt, { suite: r.suite, qualityTarget: r.quality_target, requestId: r.id, ttftBudgetS: want.budget_s });
    assert.equal(d.model, e.model, where);
    assert.deepEqual(d.fallbacks, e.fallbacks, where);
    assert.equal(d.policyProbability, e.policy_probability, where);
    assert.equal(d.budget.met, e.met, where);
    assert.deepEqual(d.live, e.live, where);
    assert.deepEqual(JSON.parse(log.lines.at(-1)).live, e.live ?? undefined, where);  // the log line's field, as Python writes it
    decided++;
    if (e.live) {
      moved++;
      lastMoved = e.now;
      assert.equal(d.live.from, want.slow);
      assert.ok(e.now > want.slow_from && e.now <= want.slow_to + DEFAULT_LIVE.windowS, where);
    }
  }
  // the sequence reaches every case: moved during the slowdown, back to the policy's own after the window
  assert.ok(moved >= 10 && decided - moved >= 400, `${moved} of ${decided} moved`);
  assert.ok(lastMoved < want.slow_to + DEFAULT_LIVE.windowS && clock.now > lastMoved + 10);
  assert.deepEqual(candidate.live.snapshot(clock.now), router.live.snapshot(clock.now));  // the Gateway fed both channels
  t.diagnostic(`${decided} decisions agree with Python's Router, ${moved} of them moved off ${want.slow}`);
});

test("without live latency (live: null) the same sequence moves nothing", { skip }, async () => {
  const want = expected(`${NAME}-live`);
  const { clock, router } = await replaying({ live: null });
  assert.equal(router.live, null);
  for (const e of want.events) {
    if (e.observe) { router.observe(e.observe.model, { ttftS: e.observe.ttft_s, at: e.observe.at }); continue; }
    clock.now = e.now;
    const d = router.route(e.route.prompt, { suite: e.route.suite, qualityTarget: e.route.quality_target, ttftBudgetS: want.budget_s });
    assert.equal(d.live, null);
    if (e.live) assert.equal(d.model, e.live.from);
  }
});

test("the live p95: nearest rank, the newest observations of the window, none below the minimum", () => {
  const ranks = (n) => nearestRankP95(Array.from({ length: n }, (_, i) => n - i));  // values n..1, unsorted
  assert.deepEqual([1, 2, 19, 20, 21, 100, 101].map(ranks), [1, 2, 19, 19, 20, 95, 96]);
  const live = new LiveLatency({ windowS: 10, maxObservations: 5, minObservations: 3 });
  live.observe("a", 0, 1, null);
  live.observe("a", 1, 2, 9);
  assert.equal(live.p95("a", "ttft", 1), null);  // two: below the minimum
  live.observe("a", 2, 3, null);
  assert.equal(live.p95("a", "ttft", 2), 3);
  assert.equal(live.p95("a", "latency", 2), null);
  for (let i = 3; i < 8; i++) live.observe("a", i, 0.5, null);
  assert.equal(live.p95("a", "ttft", 8), 0.5);  // only the newest five are kept
  assert.equal(live.p95("a", "ttft", 13), 0.5);  // t in (3, 13]: four of them
  assert.equal(live.p95("a", "ttft", 15), null);  // t in (5, 15]: two
  for (const [m, v] of [["b", 5], ["a", 5], ["c", 1]]) for (let i = 0; i < 3; i++) live.observe(m, 40, v, null);
  assert.deepEqual(live.over(["c", "b", "a", "d"], "ttft", 2, 40), ["b", "a"]);  // in the order given
});

test("liveShift: the first fallback not over, within the budget and at least as likely to pass", () => {
  const p = { a: 0.8, b: 0.9, c: 0.7, d: 0.85 }, pred = { a: 1, b: 3, c: 1, d: 1 };
  assert.equal(liveShift("a", ["b", "c", "d"], p, pred, 2, []), null);
  assert.deepEqual(liveShift("a", ["b", "c", "d"], p, pred, 2, ["a"]), { model: "d", fallbacks: ["a", "b", "c"] });
  assert.equal(liveShift("a", ["b", "c", "d"], p, pred, 2, ["a", "d"]), null);
  assert.deepEqual(liveShift("a", ["b", "d"], { ...p, d: 0.8 }, pred, 2, ["a"]), { model: "d", fallbacks: ["a", "b"] });
});

test("a bad observation, or bad settings, is a clear error", { skip }, async () => {
  const { router, gateway } = await replaying();
  const bad = [
    [() => router.observe("large", { ttftS: -1 }), RangeError, /ttftS must be a non-negative number of seconds, got -1/],
    [() => router.observe("large", { latencyS: NaN }), RangeError, /latencyS must be a non-negative number of seconds, got NaN/],
    [() => router.observe("large", { ttftS: Infinity }), RangeError, /ttftS must be a non-negative number of seconds/],
    [() => router.observe("large", { ttftS: "0.5" }), RangeError, /ttftS must be a non-negative number of seconds, got "0.5"/],
    [() => router.observe("large", {}), TypeError, /give ttftS or latencyS \(seconds\), or both/],
    [() => router.observe("large", { ttft: 0.5 }), TypeError, /unknown field "ttft"/],
    [() => router.observe("large", 0.5), TypeError, /the observation must be an object/],
    [() => router.observe("", { ttftS: 0.5 }), TypeError, /model must be a non-empty string/],
    [() => router.observe("large", { ttftS: 0.5, at: NaN }), RangeError, /the observation time must be a finite number, got NaN/],
    [() => gateway.observe("large", { ttftS: -0.1 }), RangeError, /ttftS must be a non-negative number of seconds/],
  ];
  for (const [call, type, pattern] of bad) assert.throws(call, (e) => e instanceof type && pattern.test(e.message));
  router.observe("large", { ttftS: 0, latencyS: 1.5 });
  const files = versionFiles("registry-latency");
  for (const [live, pattern] of [[{ windowS: 0 }, /windowS must be a positive number of seconds, got 0/],
    [{ maxObservations: 1.5 }, /maxObservations must be a positive integer/],
    [{ minObservations: 300 }, /minObservations must be an integer from 1 to maxObservations, got 300/]]) {
    await assert.rejects(Router.open({ files, publicKeys: [publicKey()], live }), pattern);
  }
  assert.equal((await Router.open({ files, publicKeys: [publicKey()], live: { windowS: 10, minObservations: undefined } })).live.settings.minObservations, 20);
  const off = await Router.open({ files, publicKeys: [publicKey()], live: null });
  assert.throws(() => off.observe("large", { ttftS: -1 }), /ttftS must be a non-negative number/);  // checked all the same
});

test("a changed observation sequence or live case is caught at the live step", { skip }, async () => {
  const files = policyFiles(NAME), vectors = files["conformance.safetensors"];
  const policy = readPolicy(files["policy.json"], files["arrays.safetensors"]);
  assert.ok((await checkVectors(policy, vectors)).ok);
  const fast = patchTensor(vectors, "live.obs", (a) => { for (let r = 0; r < a.length; r += 4) a[r + 2] = Math.min(a[r + 2], 1e-3); });
  let report = await checkVectors(policy, fast);
  assert.ok(!report.ok && report.first.startsWith("step live (live.model) differs first at request"), report.first);
  assert.ok(report.mismatches.live > 0 && report.mismatches.budget === 0);
  const longer = patchMetadata(vectors, "routeopt", (m) => ({ ...m, live: { ...m.live, settings: { ...m.live.settings, window_s: 5 } } }));
  report = await checkVectors(policy, longer);
  assert.ok(!report.ok && report.first.startsWith("step live"), report.first);
  const stranger = patchTensor(vectors, "live.obs", (a) => { a[1] = 99; });
  report = await checkVectors(policy, stranger);
  assert.match(report.first, /the live case observation 0 names candidate 99, not one of 4/);
  const none = patchMetadata(vectors, "routeopt", (m) => ({ ...m, live: undefined }));
  assert.match((await checkVectors(policy, none)).first, /the live case is missing from the metadata/);
  const badSettings = patchMetadata(vectors, "routeopt", (m) => ({ ...m, live: { ...m.live, settings: { ...m.live.settings, min_observations: 0 } } }));
  assert.match((await checkVectors(policy, badSettings)).first, /the live case has bad settings: minObservations must be an integer/);
});
