// Section 8.4 on the format 4 policy the Python pipeline trained: a Router fed a scripted
// observation sequence (each call against the p95 predicted for it, two candidates three times
// slower than predicted for 20 s) moves its decisions under a budget off the one whose slowed
// predictions leave the tier's mask, keeps the other's (past the budget, within the mask), and
// moves them back after the window, decision for decision as Python's Router did on the same
// clock; the Gateway's log line says so; the live factor, the slow threshold and liveMove's limit
// (the tier's mask, or the budget with no tier); the live conformance layer catches a changed
// sequence; bad observations are clear errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkVectors, DEFAULT_LIVE, Gateway, LiveLatency, liveMove, MemoryLog, nearestRankP95, readPolicy, Router } from "../dist/index.js";
import { expected, NO_FIXTURES, patchMetadata, patchTensor, policyFiles, policyNames, publicKey, versionFiles } from "./helpers.mjs";

const NAME = "demo-latency";
const skip = NO_FIXTURES || (!policyNames().includes(NAME) && `${NAME} is not among the fixtures`);

/** An observation of the replayed sequence as Router.observe takes it (Python's fields, camelCase). */
const observed = (o) => ({ ttftS: o.ttft_s, latencyS: o.latency_s, predictedTtftS: o.predicted_ttft_s,
  predictedLatencyS: o.predicted_latency_s, at: o.at });

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
  let decided = 0, moved = 0, lastMoved = -1, kept = 0;
  for (const e of want.events) {
    if (e.observe) {
      gateway.observe(e.observe.model, observed(e.observe));
      continue;
    }
    clock.now = e.now;
    const r = e.route, where = `${r.id} at ${e.now}`;
    const d = gateway.route(r.prompt, { suite: r.suite, qualityTarget: r.quality_target, requestId: r.id, ttftBudgetS: want.budget_s });
    assert.equal(d.model, e.model, where);
    assert.deepEqual(d.fallbacks, e.fallbacks, where);
    assert.equal(d.policyProbability, e.policy_probability, where);
    assert.equal(d.budget.met, e.met, where);
    assert.equal(d.budget.met, d.budget.predictedS[d.model] <= want.budget_s, where);  // the new model's, against the budget asked
    assert.equal(d.budget.maskS, want.mask_s, where);  // the limit: past the budget
    if (d.model === want.steady && e.now > want.slow_from + 5 && e.now < want.slow_to) kept++;  // slow too, but within the mask
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
  assert.ok(want.mask_s > want.budget_s && kept >= 10, `${kept} decisions kept on ${want.steady}`);
  assert.ok(lastMoved < want.slow_to + DEFAULT_LIVE.windowS && clock.now > lastMoved + 10);
  assert.deepEqual(candidate.live.snapshot(clock.now), router.live.snapshot(clock.now));  // the Gateway fed both channels
  const seen = router.live.snapshot(clock.now)[want.slow];
  assert.deepEqual(Object.keys(seen), ["ttft", "latency", "ttft_factor", "latency_factor"]);  // Python's keys
  assert.ok(seen.ttft_factor <= DEFAULT_LIVE.slowFactor && seen.latency_factor <= DEFAULT_LIVE.slowFactor, JSON.stringify(seen));
  t.diagnostic(`${decided} decisions agree with Python's Router, ${moved} of them moved off ${want.slow}, ${kept} kept on ${want.steady}`);
});

test("without live latency (live: null) the same sequence moves nothing", { skip }, async () => {
  const want = expected(`${NAME}-live`);
  const { clock, router } = await replaying({ live: null });
  assert.equal(router.live, null);
  for (const e of want.events) {
    if (e.observe) { router.observe(e.observe.model, observed(e.observe)); continue; }
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
  assert.equal(live.factor("a", "ttft", 15), null);  // no call carried a prediction
});

test("the live factor judges each call against its own prediction; observations without one have no say", () => {
  const live = new LiveLatency({ ...DEFAULT_LIVE, minObservations: 4 });
  // "a" serves short and long requests as predicted: its seconds spread, its factor is 1
  [[0.2, 0.25], [3.0, 3.0], [0.5, 0.5], [2.0, 2.5]].forEach(([took, predicted], t) => live.observe("a", t, took, null, predicted));
  // "b" takes twice what was predicted of each call; "c" is never given a prediction
  [0.1, 0.2, 0.3, 0.4].forEach((predicted, t) => {
    live.observe("b", t, 2 * predicted, 9, predicted, null);
    live.observe("c", t, 9);
  });
  assert.equal(live.p95("a", "ttft", 4), 3);
  assert.equal(live.factor("a", "ttft", 4), 1);
  assert.equal(live.factor("b", "ttft", 4), 2);
  assert.equal(live.factor("b", "latency", 4), null);  // four latencies, none with a prediction
  assert.equal(live.p95("c", "ttft", 4), 9);
  assert.equal(live.factor("c", "ttft", 4), null);
  assert.deepEqual([...live.slow(["c", "b", "a", "d"], "ttft", 4)], [["b", 2]]);
  assert.deepEqual(live.snapshot(4).b, { ttft: 0.8, latency: 9, ttft_factor: 2, latency_factor: null });
  // slow ones without a prediction among them change neither the factor nor who is slow
  for (let i = 0; i < 50; i++) live.observe("a", 4, 100);
  assert.equal(live.p95("a", "ttft", 4), 100);
  assert.equal(live.factor("a", "ttft", 4), 1);
  live.observe("b", 4.5, 0, null, 1);  // a free call counts too
  assert.equal(live.factor("b", "ttft", 5), 2);
  // the ratio is IEEE double division, as Python's
  const odd = new LiveLatency({ ...DEFAULT_LIVE, minObservations: 1 });
  odd.observe("x", 0, 0.3, null, 0.1);
  assert.equal(odd.factor("x", "ttft", 0), 0.3 / 0.1);
});

test("a candidate is slow only when its factor is past slowFactor", () => {
  const live = new LiveLatency({ ...DEFAULT_LIVE, minObservations: 1, slowFactor: 2 });
  live.observe("at", 0, 2, null, 1);  // factor 2: not past 2
  live.observe("past", 0, 2.5, null, 1);
  live.observe("under", 0, 1, null, 1);
  assert.deepEqual([...live.slow(["under", "past", "at"], "ttft", 0)], [["past", 2.5]]);
  assert.deepEqual([...new LiveLatency({ ...DEFAULT_LIVE, minObservations: 1 }).slow(["x"], "ttft", 0)], []);  // never observed
  const byDefault = new LiveLatency({ ...DEFAULT_LIVE, minObservations: 1 });
  byDefault.observe("a", 0, 1.5, null, 1);
  byDefault.observe("b", 0, 1.6, null, 1);
  assert.equal(DEFAULT_LIVE.slowFactor, 1.5);
  assert.deepEqual([...byDefault.slow(["a", "b"], "ttft", 0)], [["b", 1.6]]);
});

test("liveMove: a decision moves only where its slowed prediction leaves the limit (the tier's mask)", () => {
  const names = ["cheap", "mid", "big", "slow"];
  const p = { cheap: 0.6, mid: 0.8, big: 0.9, slow: 0.95 }, pred = { cheap: 0.5, mid: 0.7, big: 0.9, slow: 2.0 };
  const fallbacks = ["cheap", "slow", "big"];
  const move = (limit, slow) => liveMove("mid", fallbacks, names, p, pred, limit, new Map(Object.entries(slow)));
  assert.equal(move(1.0, {}), null);  // nothing slow
  assert.equal(move(1.0, { cheap: 3.0 }), null);  // mid itself is fine
  assert.equal(move(1.0, { mid: 1.4 }), null);  // 0.98: still within
  // cheap is less likely to pass, slow is predicted past the limit: big
  assert.deepEqual(move(1.0, { mid: 2.0 }), { model: "big", fallbacks: ["mid", "cheap", "slow"], over: ["mid"] });
  // the limit is the tier's mask, not the budget: a mask of 2.0 takes slow, first in order
  assert.deepEqual(move(2.0, { mid: 3.0 }), { model: "slow", fallbacks: ["mid", "cheap", "big"], over: ["mid"] });
  // big slowed too: nowhere to go
  assert.equal(move(1.0, { mid: 2.0, big: 1.2 }), null);
  // big slowed a little still fits; the candidates over are listed in candidate order
  assert.deepEqual(move(1.0, { slow: 1.6, mid: 2.0, big: 1.1 }), { model: "big", fallbacks: ["mid", "cheap", "slow"], over: ["mid", "slow"] });
  // the live prediction is the IEEE double product, compared with <= to the limit
  const close = { ...pred, mid: 0.1, big: 0.2 };  // 0.1 * 3 is 0.30000000000000004
  assert.equal(liveMove("mid", ["big"], names, p, close, 0.30000000000000004, new Map([["mid", 3]])), null);
  assert.deepEqual(liveMove("mid", ["big"], names, p, close, 0.3, new Map([["mid", 3]])), { model: "big", fallbacks: ["mid"], over: ["mid"] });
});

test("a Router holds a slowed prediction to the tier's mask, or to the budget with no tier", { skip }, async (t) => {
  const want = expected(NAME).requests;
  // every factor past 1 is slow here, and one observation makes a factor
  const clock = { now: 0 };
  const router = await Router.open({ files: versionFiles("registry-latency"), publicKeys: [publicKey()], clock: () => clock.now,
    live: { minObservations: 1, slowFactor: 1 } });
  const fields = (w) => (w.kind === "ttft" ? ["ttftS", "predictedTtftS", "ttftBudgetS"] : ["latencyS", "predictedLatencyS", "latencyBudgetS"]);
  /** Python's decision `w` by the Router once it saw only its model run `factor` times slower than predicted. */
  const slowed = (w, factor) => {
    clock.now += DEFAULT_LIVE.windowS + 1;  // what it saw before is out of the window
    const [took, predicted, budget] = fields(w);
    router.observe(w.model, { [took]: factor, [predicted]: 1 });
    return router.route(w.prompt, { suite: w.suite, qualityTarget: w.quality_target, [budget]: w.budget_s });
  };
  const expectedMove = (w, limit, factor) => liveMove(w.model, w.fallbacks, Object.keys(w.pass_probabilities), w.pass_probabilities,
    w.budget.predicted_s, limit, new Map([[w.model, factor]]));
  // slowed past its budget but not past its tier's mask: it stays, though the budget as the limit would move it
  const between = (w) => {
    const b = w.budget, pm = b.predicted_s[w.model];
    return (Math.max(b.budget_s, pm) + b.mask_s) / 2 / pm;
  };
  const within = want.filter((w) => w.budget.tier_s !== null && w.budget.mask_s > w.budget_s && w.budget.predicted_s[w.model] < w.budget.mask_s
    && expectedMove(w, w.budget_s, between(w)) !== null);
  assert.ok(within.length > 0, "the fixtures need a decision its mask keeps that its budget would move");
  for (const w of within.slice(0, 20)) {
    const f = between(w);
    assert.ok(w.budget.predicted_s[w.model] * f > w.budget_s && f > 1);
    const d = slowed(w, f);
    assert.equal(d.live, null, w.id);
    assert.equal(d.model, w.model, w.id);
    assert.equal(d.budget.maskS, w.budget.mask_s, w.id);
  }
  // slowed past the mask: it moves where liveMove says with the mask as the limit
  let moves = 0;
  for (const w of want.filter((x) => x.budget.tier_s !== null).slice(0, 200)) {
    const g = (2 * w.budget.mask_s) / w.budget.predicted_s[w.model];
    const d = slowed(w, g), e = expectedMove(w, w.budget.mask_s, g);
    assert.deepEqual([d.model, d.fallbacks, d.live], e ? [e.model, e.fallbacks, { from: w.model, over: e.over }] : [w.model, w.fallbacks, null], w.id);
    if (e) assert.equal(d.budget.met, w.budget.predicted_s[e.model] <= w.budget_s, w.id);
    moves += e ? 1 : 0;
  }
  // with no tier the limit is the budget itself
  for (const w of want.filter((x) => x.budget.tier_s === null).slice(0, 100)) {
    const h = Math.max(1.01, (1.5 * w.budget_s) / w.budget.predicted_s[w.model]);
    const d = slowed(w, h), e = expectedMove(w, w.budget_s, h);
    assert.equal(d.budget.maskS, null);
    assert.deepEqual([d.model, d.live], e ? [e.model, { from: w.model, over: e.over }] : [w.model, null], w.id);
    moves += e ? 1 : 0;
  }
  assert.ok(moves > 0, "some of them should move");
  t.diagnostic(`${Math.min(20, within.length)} decisions kept by their mask, ${moves} moved past it or past a budget without a tier`);
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
    [() => router.observe("large", { ttftS: 1, predictedTtftS: 0 }), RangeError, /predictedTtftS must be a positive number of seconds, got 0/],
    [() => router.observe("large", { ttftS: 1, predictedTtftS: -1 }), RangeError, /predictedTtftS must be a non-negative number of seconds, got -1/],
    [() => router.observe("large", { latencyS: 1, predictedLatencyS: NaN }), RangeError, /predictedLatencyS must be a non-negative number of seconds, got NaN/],
    [() => router.observe("large", { latencyS: 1, predictedLatencyS: Infinity }), RangeError, /predictedLatencyS must be/],
    [() => router.observe("large", { latencyS: 1, predictedLatencyS: "2" }), RangeError, /predictedLatencyS must be a non-negative number of seconds, got "2"/],
    [() => router.observe("large", { ttftS: 1, predictedLatencyS: 1 }), TypeError, /predictedLatencyS was given without latencyS/],
    [() => router.observe("large", { latencyS: 1, predictedTtftS: 1 }), TypeError, /predictedTtftS was given without ttftS/],
    [() => router.observe("large", { predictedTtftS: 1 }), TypeError, /give ttftS or latencyS \(seconds\), or both/],
    [() => router.observe("large", { ttftS: 1, predicted_ttft_s: 1 }), TypeError, /unknown field "predicted_ttft_s"/],
    [() => gateway.observe("large", { ttftS: 1, predictedTtftS: 0 }), RangeError, /predictedTtftS must be a positive number/],
  ];
  for (const [call, type, pattern] of bad) assert.throws(call, (e) => e instanceof type && pattern.test(e.message));
  const before = router.live.snapshot(0).large;
  router.observe("large", { ttftS: 0, latencyS: 1.5 });
  router.observe("large", { ttftS: 0.5, latencyS: 1.5, predictedTtftS: 0.25, predictedLatencyS: 3 });
  assert.equal(before, undefined);  // the rejected ones left nothing behind
  const files = versionFiles("registry-latency");
  for (const [live, pattern] of [[{ windowS: 0 }, /windowS must be a positive number of seconds, got 0/],
    [{ maxObservations: 1.5 }, /maxObservations must be a positive integer/],
    [{ minObservations: 300 }, /minObservations must be an integer from 1 to maxObservations, got 300/],
    [{ slowFactor: 0.5 }, /slowFactor must be a finite number >= 1, got 0.5/],
    [{ slowFactor: Infinity }, /slowFactor must be a finite number >= 1, got Infinity/],
    [{ slowFactor: true }, /slowFactor must be a finite number >= 1, got true/]]) {
    await assert.rejects(Router.open({ files, publicKeys: [publicKey()], live }), pattern);
  }
  assert.equal((await Router.open({ files, publicKeys: [publicKey()], live: { windowS: 10, minObservations: undefined } })).live.settings.minObservations, 20);
  assert.equal((await Router.open({ files, publicKeys: [publicKey()], live: { slowFactor: 1 } })).live.settings.slowFactor, 1);
  assert.equal((await Router.open({ files, publicKeys: [publicKey()] })).live.settings.slowFactor, 1.5);
  const off = await Router.open({ files, publicKeys: [publicKey()], live: null });
  assert.throws(() => off.observe("large", { ttftS: -1 }), /ttftS must be a non-negative number/);  // checked all the same
});

test("a changed observation sequence or live case is caught at the live step", { skip }, async () => {
  const files = policyFiles(NAME), vectors = files["conformance.safetensors"];
  const policy = readPolicy(files["policy.json"], files["arrays.safetensors"]);
  assert.ok((await checkVectors(policy, vectors)).ok);
  const fast = patchTensor(vectors, "live.obs", (a) => { for (let r = 0; r < a.length; r += 6) a[r + 2] = Math.min(a[r + 2], 1e-3); });
  let report = await checkVectors(policy, fast);
  assert.ok(!report.ok && report.first.startsWith("step live (live.model) differs first at request"), report.first);
  assert.ok(report.mismatches.live > 0 && report.mismatches.budget === 0);
  // no prediction with any call: no factor, nothing slow, nothing moves
  const unpredicted = patchTensor(vectors, "live.obs", (a) => { for (let r = 0; r < a.length; r += 6) a[r + 4] = a[r + 5] = NaN; });
  report = await checkVectors(policy, unpredicted);
  assert.ok(!report.ok && report.first.startsWith("step live (live.model)"), report.first);
  // the slowdown judged against a threshold past it: nothing is slow
  const lenient = patchMetadata(vectors, "routeopt", (m) => ({ ...m, live: { ...m.live, settings: { ...m.live.settings, slow_factor: 100 } } }));
  report = await checkVectors(policy, lenient);
  assert.ok(!report.ok && report.first.startsWith("step live"), report.first);
  // slow_factor absent: 1.5, the vectors' own
  const absent = patchMetadata(vectors, "routeopt", (m) => {
    const { slow_factor, ...settings } = m.live.settings;
    assert.equal(slow_factor, 1.5);
    return { ...m, live: { ...m.live, settings } };
  });
  assert.ok((await checkVectors(policy, absent)).ok);
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
  const badFactor = patchMetadata(vectors, "routeopt", (m) => ({ ...m, live: { ...m.live, settings: { ...m.live.settings, slow_factor: 0.9 } } }));
  assert.match((await checkVectors(policy, badFactor)).first, /the live case has bad settings: slowFactor must be a finite number >= 1/);
});
