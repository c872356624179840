// Section 8.3 on a format 4 policy the Python pipeline trained on timed outcomes: decisions
// under TTFT and end-to-end budgets exactly as Python's RoutingPolicy.decide makes them, in both
// engines; the budget on the decision and on the log line; the errors; and what is refused.
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkVectors, conformanceSummary, FormatError, Gateway, MemoryLog, readPolicy, Router } from "../dist/index.js";
import { expected, NO_FIXTURES, patchMetadata, patchTensor, policyFiles, policyNames, publicKey, versionFiles } from "./helpers.mjs";

const NAME = "demo-latency";
const skip = NO_FIXTURES || (!policyNames().includes(NAME) && `${NAME} is not among the fixtures`);
const load = (files, engine) => readPolicy(files["policy.json"], files["arrays.safetensors"], engine);
const enc = (s) => new TextEncoder().encode(s);
const headOf = (files) => JSON.parse(new TextDecoder().decode(files["policy.json"]));
const budgetOption = (w) => (w.kind === "ttft" ? { ttftBudgetS: w.budget_s } : { latencyBudgetS: w.budget_s });

/** A Policy's decision, or a Router's (whose policyProbability is the policy's propensity). */
function sameAsPython(d, w, budget) {
  const where = `${w.id} ${w.kind} ${w.budget_s}`;
  assert.equal(d.model, w.model, where);
  assert.deepEqual(d.fallbacks, w.fallbacks, where);
  assert.equal(d.policyProbability ?? d.propensity, w.propensity, where);
  assert.deepEqual({ kind: budget.kind, budget_s: budget.budgetS, tier_s: budget.tierS, met: budget.met, predicted_s: budget.predictedS,
    mask_s: budget.maskS }, w.budget, where);
}

for (const engine of ["webassembly", "javascript"]) {
  test(`${engine} loops: every request under every budget decides as Python does`, { skip }, async (t) => {
    const policy = load(policyFiles(NAME), engine);
    assert.equal(policy.formatVersion, 4);
    const want = expected(NAME);
    const kinds = new Set(), tiers = new Set(), met = new Set();
    for (const w of want.requests) {
      const d = policy.decide(w.prompt, w.suite, w.quality_target, budgetOption(w));
      sameAsPython(d, w, d.budget);
      kinds.add(w.kind); tiers.add(w.budget.tier_s); met.add(w.budget.met);
    }
    // the cases reach every branch: both kinds, below every tier, several tiers, budgets missed
    assert.deepEqual([...kinds].sort(), ["latency", "ttft"]);
    assert.ok(tiers.has(null) && tiers.size >= 6 && met.has(false) && met.has(true));
    t.diagnostic(`${want.requests.length} requests x budgets agree (${want.budgets.length} budgets)`);
  });
}

test("the Router carries the budget (camelCase, as its other fields) and the Gateway logs it as Python's lines do", { skip }, async () => {
  const router = await Router.open({ files: versionFiles("registry-latency"), publicKeys: [publicKey()] });
  assert.match(router.status().conformance, /agree at every layer \(.*decision, latency, budget, live, gateway\)/);
  const want = expected(NAME).requests;
  for (const w of want) {
    const d = router.route(w.prompt, { suite: w.suite, qualityTarget: w.quality_target, ...budgetOption(w) });
    sameAsPython(d, w, d.budget);
    assert.deepEqual(d.passProbabilities, w.pass_probabilities);
    assert.deepEqual(d.expectedCostUsd, w.expected_cost_usd);
  }
  const log = new MemoryLog();
  const gw = await Gateway.create(router, { log });
  const w = want.find((r) => r.budget.tier_s === null);
  const d = gw.route(w.prompt, { suite: w.suite, qualityTarget: w.quality_target, ...budgetOption(w) });
  const [withBudget] = log.lines.map((l) => JSON.parse(l));
  assert.deepEqual(withBudget.budget, { kind: w.kind, budget_s: w.budget_s, tier_s: null, met: w.budget.met });
  assert.equal(d.budget.tierS, null);
  assert.equal(d.budget.maskS, null);
  // with a tier the decision carries its mask (8.3), and the log line still only {kind, budget_s, tier_s, met}
  const tiered = want.find((r) => r.budget.tier_s !== null && r.budget.mask_s > r.budget.tier_s);
  assert.ok(tiered, "the fixtures need a tier whose mask is past its budget");
  const e = gw.route(tiered.prompt, { suite: tiered.suite, qualityTarget: tiered.quality_target, ...budgetOption(tiered) });
  assert.equal(e.budget.maskS, tiered.budget.mask_s);
  assert.deepEqual(JSON.parse(log.lines.at(-1)).budget,
    { kind: tiered.kind, budget_s: tiered.budget_s, tier_s: tiered.budget.tier_s, met: tiered.budget.met });
});

test("exploration under a budget sends requests only to candidates predicted to meet it, exactly as Python's Gateway does", { skip }, async () => {
  const router = await Router.open({ files: versionFiles("registry-latency"), publicKeys: [publicKey()] });
  const want = expected(`${NAME}-explored`);
  const log = new MemoryLog();
  const gw = await Gateway.create(router, { log, exploration: want.exploration });
  for (const w of want.requests) {
    gw.route(w.prompt, { suite: w.suite, qualityTarget: w.quality_target, requestId: w.request_id, ...budgetOption(w) });
  }
  const lines = new Map(log.lines.map((l) => JSON.parse(l)).map((r) => [r.request_id, r]));
  let explored = 0, narrowed = 0;
  for (const w of want.requests) {
    const r = lines.get(w.request_id);
    assert.deepEqual([r.model, r.policy_model, r.explored, r.exploration.eligible], [w.model, w.policy_model, w.explored, w.eligible], w.request_id);
    assert.ok(Math.abs(r.propensity - w.propensity) <= 1e-12, w.request_id);
    explored += r.explored ? 1 : 0;
    narrowed += r.exploration.eligible.length < Object.keys(r.pass_probabilities).length ? 1 : 0;
  }
  assert.ok(explored > 0 && narrowed > 0);
});

test("a request naming no budget is decided under its suite's default (else \"*\"'s) exactly as Python's Router does; one it names wins", { skip }, async (t) => {
  const { defaults, default_requests: want } = expected(NAME);
  const router = await Router.open({ files: versionFiles("registry-latency"), publicKeys: [publicKey()] });
  const policy = load(policyFiles(NAME));
  const asBudget = ([kind, budgetS]) => ({ kind, budgetS });
  assert.deepEqual(policy.defaultFor("add"), asBudget(defaults.add));
  for (const suite of ["reverse", "no-such-suite", "", null, undefined]) assert.deepEqual(policy.defaultFor(suite), asBudget(defaults["*"]));
  const kinds = new Set(), log = new MemoryLog(), gw = await Gateway.create(router, { log });
  for (const w of want) {
    assert.equal(policy.decide(w.prompt, w.suite, w.quality_target).budget, null, w.id);  // the plain decision has none
    const own = policy.decide(w.prompt, w.suite, w.quality_target, { useDefaults: true });
    sameAsPython(own, w, own.budget);
    const d = router.route(w.prompt, { suite: w.suite, qualityTarget: w.quality_target });
    sameAsPython(d, w, d.budget);
    assert.deepEqual(d.passProbabilities, w.pass_probabilities);
    kinds.add(`${w.suite === "add" ? "add" : "other"} ${w.kind} ${w.budget.tier_s}`);
  }
  assert.deepEqual([...kinds].sort(), ["add latency null", `other ttft ${defaults["*"][1]}`]);
  const w = want.find((r) => r.suite === "add");
  gw.route(w.prompt, { suite: "add", qualityTarget: w.quality_target });
  assert.deepEqual(JSON.parse(log.lines[0]).budget, { kind: "latency", budget_s: w.budget_s, tier_s: null, met: w.budget.met });
  // a budget the request names wins over the default: Python's decisions under explicit budgets
  const named = expected(NAME).requests.filter((r) => r.suite === "add" && r.kind === "ttft");
  assert.ok(named.length > 0);
  for (const r of named) {
    const d = router.route(r.prompt, { suite: r.suite, qualityTarget: r.quality_target, ttftBudgetS: r.budget_s });
    sameAsPython(d, r, d.budget);
    const p = policy.decide(r.prompt, r.suite, r.quality_target, { ttftBudgetS: r.budget_s, useDefaults: true });
    sameAsPython(p, r, p.budget);
  }
  t.diagnostic(`${want.length} requests without a budget and ${named.length} naming one agree with Python's`);
});

test("a budget the policy cannot serve, two at once, or not a positive number of seconds, is a clear error", { skip }, async () => {
  const policy = load(policyFiles(NAME));
  const ask = (budget) => () => policy.decide("Task: add 2 and 3", "add", null, budget);
  assert.throws(ask({ ttftBudgetS: 1, latencyBudgetS: 5 }), /give a TTFT budget or an end-to-end latency budget, not both/);
  for (const bad of [0, -1, NaN, Infinity]) {
    assert.throws(ask({ ttftBudgetS: bad }), (e) => e instanceof RangeError && /ttftBudgetS must be a positive number of seconds/.test(e.message));
    assert.throws(ask({ latencyBudgetS: bad }), /latencyBudgetS must be a positive number of seconds/);
  }
  assert.throws(ask({ ttftBudgetS: "0.5" }), (e) => e instanceof TypeError && /ttftBudgetS must be a number of seconds/.test(e.message));
  assert.equal(policy.decide("Task: add 2 and 3", "add", null, { ttftBudgetS: null }).budget, null);
  // a format 3 policy has no latency model at all; a format 4 one may lack a kind
  const plain = load(policyFiles("demo-linear"));
  assert.throws(() => plain.decide("hi", null, null, { ttftBudgetS: 1 }), /this policy has no ttft model: it was trained on outcomes without ttft measurements/);
  const files = policyFiles(NAME), head = headOf(files);
  head.latency.models = head.latency.models.filter(([kind]) => kind === "ttft");
  head.latency.tiers = head.latency.tiers.filter((t) => t.kind === "ttft");
  delete head.latency.defaults.add;
  const ttftOnly = readPolicy(enc(JSON.stringify(head)), files["arrays.safetensors"]);
  assert.throws(() => ttftOnly.decide("hi", null, null, { latencyBudgetS: 5 }), /this policy has no latency model/);
  assert.equal(ttftOnly.decide("hi", null, null, { ttftBudgetS: 5 }).budget.kind, "ttft");
});

test("a Router whose policy cannot serve a budget decides without it, says so and warns once, as Python's Router does", { skip }, async () => {
  const events = [];
  const router = await Router.open({ files: versionFiles("registry"), publicKeys: [publicKey()], onEvent: (kind, message) => events.push([kind, message]) });
  const prompt = "Task: add the input. difficulty: 2. Input: stone river";
  const plain = router.route(prompt, { suite: "add" });
  assert.equal(plain.budget, null);  // a format 3 policy: no default budget either
  const a = router.route(prompt, { suite: "add", ttftBudgetS: 0.5 });
  router.route(prompt, { suite: "add", ttftBudgetS: 0.7 });
  assert.equal(a.model, plain.model);
  assert.deepEqual(a.budget, { kind: "ttft", budgetS: 0.5, met: null, unserved: "policy version 1 has no ttft model" });
  assert.equal(events.filter(([kind]) => kind === "budget").length, 1);
  assert.throws(() => router.route(prompt, { ttftBudgetS: -1 }), /ttftBudgetS must be a positive number of seconds/);
  const log = new MemoryLog();
  const gw = await Gateway.create(router, { log });
  gw.route(prompt, { suite: "add", latencyBudgetS: 2 });
  assert.deepEqual(JSON.parse(log.lines[0]).budget, { kind: "latency", budget_s: 2, met: null, unserved: "policy version 1 has no latency model" });
});

test("format 4's policy.json errors name the field", { skip }, () => {
  const files = policyFiles(NAME), head = headOf(files);
  const variant = (change) => { const h = structuredClone(head); change(h); return enc(JSON.stringify(h)); };
  const bad = [
    [(h) => { delete h.latency; }, /policy.json: a format 4 policy needs its latency section/],
    [(h) => { h.latency = []; }, /needs its latency section/],
    [(h) => { h.latency.models.push(["tpot", "p95"]); }, /latency.models: unknown latency model \["tpot","p95"\]/],
    [(h) => { h.latency.models.push(["ttft", "p99"]); }, /unknown latency model/],
    [(h) => { h.latency.alpha = "x"; }, /latency.alpha must be a number/],
    [(h) => { h.latency.tiers[0].kind = "tpot"; }, /latency.tiers\[0\].kind: unknown budget kind "tpot"/],
    [(h) => { h.latency.tiers[0].budget_s = -1; }, /latency.tiers\[0\].budget_s must be a positive number, got -1/],
    [(h) => { h.latency.tiers[1].budget_s = h.latency.tiers[0].budget_s; }, /the ttft tiers' budgets must be distinct/],
    [(h) => { h.latency.tiers[0].knob.members = [["magic", 1]]; }, /latency.tiers\[0\].knob.members\[0\]: unknown knob member rule "magic"/],
    [(h) => { h.latency.tiers[0].violation = []; }, /latency.tiers\[0\].violation must hold one rate/],
    [(h) => { h.latency.models = h.latency.models.filter(([k]) => k !== "latency"); }, /latency tiers of kind "latency" but no p95 model for it/],
    [(h) => { h.latency.defaults = ["ttft", 1]; }, /policy.json: latency.defaults must be an object of suite: \[kind, seconds\]/],
    [(h) => { h.latency.defaults["*"] = ["tpot", 1]; }, /policy.json: latency.defaults\["\*"\] must be \[kind, seconds\] with kind one of ttft, latency, got \["tpot",1\]/],
    [(h) => { h.latency.defaults.add = ["latency"]; }, /latency.defaults\["add"\] must be \[kind, seconds\]/],
    [(h) => { h.latency.defaults.add = { latency_s: 3 }; }, /latency.defaults\["add"\] must be \[kind, seconds\]/],
    [(h) => { h.latency.defaults.sort = ["ttft", 0]; }, /latency.defaults\["sort"\] must be a positive number of seconds, got 0/],
    [(h) => { h.latency.defaults.sort = ["ttft", "1.3"]; }, /latency.defaults\["sort"\] must be a positive number of seconds, got "1.3"/],
    [(h) => { h.latency.defaults.sort = ["ttft", null]; }, /latency.defaults\["sort"\] must be a positive number of seconds, got null/],
    [(h) => {
      h.latency.models = h.latency.models.filter(([k]) => k !== "latency");
      h.latency.tiers = h.latency.tiers.filter((t) => t.kind !== "latency");
    }, /policy.json: latency.defaults\["add"\] is a latency budget, and the policy has no p95 latency model/],
  ];
  for (const [change, pattern] of bad) {
    assert.throws(() => readPolicy(variant(change), files["arrays.safetensors"]), (e) => e instanceof FormatError && pattern.test(e.message));
  }
  for (const none of [(h) => { delete h.latency.defaults; }, (h) => { h.latency.defaults = null; }, (h) => { h.latency.defaults = {}; }]) {
    const policy = readPolicy(variant(none), files["arrays.safetensors"]);
    assert.equal(policy.defaultFor("add"), null);
    assert.equal(policy.decide("Task: add 2 and 3", "add", null, { useDefaults: true }).budget, null);
  }
  const arrays = patchTensor(files["arrays.safetensors"], "latency.ttft.p95.coef", (a) => { a[0] = NaN; });
  assert.throws(() => readPolicy(files["policy.json"], arrays), /arrays.safetensors: latency.ttft.p95 holds a non-finite number/);
});

test("changed latency arrays or tiers are caught at the latency and budget steps", { skip }, async () => {
  const files = policyFiles(NAME), vectors = files["conformance.safetensors"];
  for (const engine of ["webassembly", "javascript"]) {
    const report = await checkVectors(load(files, engine), vectors);
    assert.ok(report.ok && report.layers.includes("latency") && report.layers.includes("budget"), conformanceSummary(report));
  }
  const slower = patchTensor(files["arrays.safetensors"], "latency.ttft.p50.coef", (a) => { a[0] += 1e-3; });
  let report = await checkVectors(readPolicy(files["policy.json"], slower), vectors);
  assert.ok(!report.ok && report.first.startsWith("step latency (latency.pred)"), report.first);
  const head = headOf(files);
  for (const t of head.latency.tiers) t.budget_s *= 1.0001;  // the same tiers, certified a little looser
  report = await checkVectors(readPolicy(enc(JSON.stringify(head)), files["arrays.safetensors"]), vectors);
  assert.ok(!report.ok && report.first.startsWith("step budget"), report.first);
});

test("the vectors' default cases decide each request under its suite's default: a changed default is caught at the budget step", { skip }, async () => {
  const files = policyFiles(NAME), vectors = files["conformance.safetensors"];
  let meta;
  patchMetadata(vectors, "routeopt", (m) => { meta = m; return m; });
  const cases = meta.budgets.filter(([kind]) => kind === "default");
  assert.deepEqual(cases.map(([, b]) => b), [null, null]);
  const recheck = async (change) => {
    const head = headOf(files);
    change(head.latency.defaults);
    return checkVectors(readPolicy(enc(JSON.stringify(head)), files["arrays.safetensors"]), vectors);
  };
  assert.ok((await recheck(() => {})).ok);
  const tiers = headOf(files).latency.tiers.filter((x) => x.kind === "ttft").map((x) => x.budget_s);
  for (const change of [(d) => { d["*"] = ["ttft", tiers[0]]; }, (d) => { delete d.add; }, (d) => { d.reverse = ["latency", 3.0]; }]) {
    const report = await recheck(change);
    assert.ok(!report.ok && /^step budget \(budget\.(model|fallbacks|met|propensity)\)/.test(report.first), report.first);
  }
  const report = await recheck((d) => { delete d["*"]; });
  assert.match(report.first, /budget case \d+ decides each request under its suite's default budget, and the policy has none for suite (null|"[^"]*") \(nor for "\*"\)/);
  // and a default case must not carry a budget
  const odd = patchMetadata(vectors, "routeopt", (m) => ({ ...m, budgets: m.budgets.map((c) => (c[0] === "default" ? ["default", 1.3, c[2]] : c)) }));
  assert.match((await checkVectors(load(files), odd)).first, /budget case \d+ \["default",1.3,0.9\] is not one this policy can decide/);
});

test("vectors naming a layer this runtime does not implement are refused before anything is compared", { skip }, async () => {
  const files = policyFiles(NAME), policy = load(files);
  const vectors = patchMetadata(files["conformance.safetensors"], "routeopt", (m) => ({ ...m, layers: [...m.layers, "tpot"] }));
  const report = await checkVectors(policy, vectors);
  assert.equal(report.ok, false);
  assert.match(report.first, /conformance\.safetensors: layer "tpot" is not one this runtime implements: the policy needs a newer runtime/);
  assert.deepEqual(report.mismatches, {});
  // and a policy without its latency section does not pass vectors that check budgets, nor the reverse
  const head = headOf(files);
  delete head.latency;
  head.format_version = 3;
  const stripped = readPolicy(enc(JSON.stringify(head)), files["arrays.safetensors"]);
  const mixed = await checkVectors(stripped, files["conformance.safetensors"]);
  assert.match(mixed.first, /the vectors do check latency budgets and the policy has no latency section/);
  const other = await checkVectors(policy, policyFiles("demo-linear")["conformance.safetensors"]);
  assert.equal(other.ok, false);
});

test("a signed version whose manifest and policy.json disagree on the format is refused", { skip }, async () => {
  const k = await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"]);
  const spki = new Uint8Array(await crypto.subtle.exportKey("spki", k.publicKey));
  const pem = `-----BEGIN PUBLIC KEY-----\n${Buffer.from(spki).toString("base64")}\n-----END PUBLIC KEY-----\n`;
  const hex = (b) => Buffer.from(b).toString("hex");
  const keyId = hex(new Uint8Array(await crypto.subtle.digest("SHA-256", spki.slice(12)))).slice(0, 16);
  const resign = async (files, change) => {
    const manifest = JSON.parse(new TextDecoder().decode(files["manifest.json"]));
    change(manifest);
    const out = { ...files, "manifest.json": enc(JSON.stringify(manifest, null, 2)) };
    const sig = new Uint8Array(await crypto.subtle.sign("Ed25519", k.privateKey, out["manifest.json"]));
    out["manifest.sig"] = enc(JSON.stringify({ alg: "ed25519", key_id: keyId, signature: Buffer.from(sig).toString("base64") }));
    return out;
  };
  const files = versionFiles("registry-latency");
  assert.equal((await Router.open({ files: await resign(files, () => {}), publicKeys: [pem] })).version, 1);
  await assert.rejects(Router.open({ files: await resign(files, (m) => { m.policy_format.version = 3; }), publicKeys: [pem] }),
    /policy_format.version 3 but policy.json's format_version is 4/);
  await assert.rejects(Router.open({ files: await resign(files, (m) => { m.policy_format.version = 5; }), publicKeys: [pem] }),
    /policy format 5 is not supported by this runtime \(reads 3 and 4/);
});
