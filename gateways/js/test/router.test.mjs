// Loading from bytes: every check of section 10, the self-check, and routing exactly as Python.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Gateway, MemoryLog, PolicyLoadError, Router } from "../dist/index.js";
import { expected, NO_FIXTURES, patchTensor, publicKey, versionFiles } from "./helpers.mjs";

const enc = (s) => new TextEncoder().encode(s);
const dec = (b) => new TextDecoder().decode(b);
const hex = (b) => Buffer.from(b).toString("hex");

/** A key of this test's own, to re-sign manifests it changes (an attacker with a signing key). */
async function signer() {
  const k = await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"]);
  const spki = new Uint8Array(await crypto.subtle.exportKey("spki", k.publicKey));
  const pem = `-----BEGIN PUBLIC KEY-----\n${Buffer.from(spki).toString("base64")}\n-----END PUBLIC KEY-----\n`;
  const keyId = hex(new Uint8Array(await crypto.subtle.digest("SHA-256", spki.slice(12)))).slice(0, 16);
  return { pem, async resign(files, change = () => {}) {
    const out = { ...files };
    const manifest = JSON.parse(dec(files["manifest.json"]));
    change(manifest, out);
    for (const f of manifest.files) {
      if (!out[f.path]) continue;
      f.size = out[f.path].length;
      f.sha256 = hex(new Uint8Array(await crypto.subtle.digest("SHA-256", out[f.path])));
    }
    out["manifest.json"] = enc(JSON.stringify(manifest, null, 2));
    const sig = new Uint8Array(await crypto.subtle.sign("Ed25519", k.privateKey, out["manifest.json"]));
    out["manifest.sig"] = enc(JSON.stringify({ alg: "ed25519", key_id: keyId, signature: Buffer.from(sig).toString("base64") }));
    return out;
  } };
}

test("routes every request exactly as the Python runtime does", { skip: NO_FIXTURES }, async () => {
  const router = await Router.open({ files: versionFiles("registry"), publicKeys: [publicKey()] });
  assert.equal(router.version, 1);
  assert.match(router.status().conformance, /agree at every layer/);
  const want = expected("demo-linear");
  for (const w of want.requests) {
    const d = router.route(w.prompt, { suite: w.suite, qualityTarget: w.quality_target, requestId: "r" });
    assert.equal(d.model, w.model, w.prompt.slice(0, 30));
    assert.deepEqual(d.fallbacks, w.fallbacks);
    assert.equal(d.propensity, w.propensity);
    assert.equal(d.policyProbability, w.policy_probability);
    assert.equal(d.unknownSuite, w.unknown_suite);
    assert.deepEqual(d.passProbabilities, w.pass_probabilities);
    assert.deepEqual(d.expectedCostUsd, w.expected_cost_usd);
    assert.equal(d.decisionId, "r");
  }
});

test("a decision's arrays are its own: later decisions, which reuse the policy's scratch, leave them be", { skip: NO_FIXTURES }, async () => {
  const router = await Router.open({ files: versionFiles("registry"), publicKeys: [publicKey()] });
  const policy = router.policy;
  const requests = expected("demo-linear").requests.slice(0, 20);
  const first = requests.map((w) => policy.decide(w.prompt, w.suite, w.quality_target));
  const copy = (d) => ({ ...d, p: Array.from(d.p), c: Array.from(d.c), promptRaw: Array.from(d.promptRaw), fallbacks: [...d.fallbacks] });
  const before = first.map(copy);
  const scored = policy.scoreRequest(requests[0].prompt, requests[0].suite, true);
  const kept = { ids: Array.from(scored.layers.ids), vals: Array.from(scored.layers.vals), raw: Array.from(scored.layers.text.raw) };
  for (const w of requests.slice().reverse()) router.route("something else entirely " + w.prompt, { suite: w.suite });
  assert.deepEqual(first.map(copy), before);
  assert.deepEqual({ ids: Array.from(scored.layers.ids), vals: Array.from(scored.layers.vals), raw: Array.from(scored.layers.text.raw) }, kept);
  for (let i = 0; i < requests.length; i++) {
    const w = requests[i], d = router.route(w.prompt, { suite: w.suite, qualityTarget: w.quality_target });
    assert.equal(d.model, first[i].model);
    assert.deepEqual(Object.values(d.passProbabilities), before[i].p);
  }
});

test("hostile prompts route; a non-string prompt is a clear error", { skip: NO_FIXTURES }, async () => {
  const router = await Router.open({ files: versionFiles("registry"), publicKeys: [publicKey()] });
  const names = router.policy.candidates;
  for (const p of ["", "\u0000", "\ud800", "a".repeat(1 << 20), "😀".repeat(5000), "İ".repeat(9000)]) {
    for (const suite of [undefined, null, "", "no-such-suite", "reverse"]) assert.ok(names.includes(router.route(p, { suite }).model));
  }
  assert.throws(() => router.route(undefined), TypeError);
  assert.throws(() => router.route(42, {}), /prompt must be a string/);
  assert.throws(() => router.route("x", { suite: 7 }), /suite must be a string/);
  assert.throws(() => router.route("x", { qualityTarget: NaN }), /finite/);
  assert.match(router.route("x").decisionId, /^[0-9a-f]{12}-[0-9a-f]+$/);
});

test("without a key, with another key, or tampered, nothing loads", { skip: NO_FIXTURES }, async () => {
  const files = versionFiles("registry");
  await assert.rejects(Router.open({ files }), (e) => e instanceof PolicyLoadError && e.kind === "config");
  const other = await signer();
  await assert.rejects(Router.open({ files, publicKeys: [other.pem] }), /signed by key \w+, but the trusted key is/);
  const sig = JSON.parse(dec(files["manifest.sig"]));
  const raw = Buffer.from(sig.signature, "base64");
  raw[0] ^= 1;
  const forged = { ...files, "manifest.sig": enc(JSON.stringify({ ...sig, signature: raw.toString("base64") })) };
  await assert.rejects(Router.open({ files: forged, publicKeys: [publicKey()] }), /signature does not match the content/);
  const arrays = new Uint8Array(files["arrays.safetensors"]);
  arrays[arrays.length - 1] ^= 1;
  await assert.rejects(Router.open({ files: { ...files, "arrays.safetensors": arrays }, publicKeys: [publicKey()] }), /tampered or truncated/);
  const noSig = { ...files };
  delete noSig["manifest.sig"];
  await assert.rejects(Router.open({ files: noSig, publicKeys: [publicKey()] }), (e) => e.kind === "unsigned");
  const unsigned = await Router.open({ files: noSig, allowUnsigned: true });
  assert.equal(unsigned.status().signed, false);
});

test("validly signed but wrong: the format, the vectors and the loader refuse it", { skip: NO_FIXTURES }, async () => {
  const s = await signer();
  const files = versionFiles("registry");
  const attempt = async (change, pattern, kind) => {
    const bad = await s.resign(files, change);
    await assert.rejects(Router.open({ files: bad, publicKeys: [s.pem] }), (e) => pattern.test(e.message) && (!kind || e.kind === kind));
  };
  assert.equal((await Router.open({ files: await s.resign(files), publicKeys: [s.pem] })).version, 1);
  await attempt((m, f) => { f["arrays.safetensors"] = patchTensor(f["arrays.safetensors"], "scorer.weights", (a) => { a[5] += 1; a[99] -= 1; }); },
    /conformance vectors disagree.*step scores/, "conformance");
  await attempt((m, f) => { f["arrays.safetensors"] = f["arrays.safetensors"].slice(0, 4000); }, /policy does not load or decide.*truncated/);
  await attempt((m, f) => { f["conformance.safetensors"] = versionFiles("registry", 2)["conformance.safetensors"]; }, /conformance vectors disagree/, "conformance");
  await attempt((m) => { m.policy_format.version = 2; }, /policy format 2 is not supported/);
  await attempt((m) => { delete m.policy_format; }, /policy format 2 is not supported/);
  await attempt((m) => { m.policy_format.portable = false; m.policy_format.not_portable = "MiniLM embeddings"; }, /not portable: MiniLM embeddings/);
  await attempt((m) => { m.expires_at = "2001-01-01T00:00:00Z"; }, /expired/, "expired");
  await attempt((m) => { m.files[0].path = "../etc/passwd"; }, /unsafe file name/);
  await attempt((m, f) => { f["policy.json"] = enc("{}"); }, /format_version undefined is not supported/);
});

test("an expired policy serves the default model, saying why", { skip: NO_FIXTURES }, async () => {
  const s = await signer();
  const expired = await s.resign(versionFiles("registry"), (m) => { m.expires_at = "2001-01-01T00:00:00Z"; });
  const router = await Router.open({ files: expired, publicKeys: [s.pem], defaultModel: "fallback-model" });
  const d = router.route("hello", { suite: "add" });
  assert.equal(d.model, "fallback-model");
  assert.equal(d.policyVersion, 0);
  assert.match(d.defaultReason, /expired at 2001-01-01T00:00:00Z/);
  assert.equal(router.status().servingDefault, true);
});

test("the gateway explores with exact propensities and logs Python's fields", { skip: NO_FIXTURES }, async () => {
  const router = await Router.open({ files: versionFiles("registry"), publicKeys: [publicKey()] });
  const log = new MemoryLog();
  const names = router.policy.candidates;
  const gw = await Gateway.create(router, { exploration: { rate: 0.3, exclude: [names[0]], seed: 7 }, log,
    redact: (t) => (t.includes("secret") ? null : t) });
  let explored = 0;
  const n = 3000;
  for (let i = 0; i < n; i++) {
    const d = gw.route(`Task: add numbers ${i} and ${i * 7}`, { suite: "add", requestId: `req-${i}` });
    assert.equal(d.decisionId, `req-${i}`);
    assert.ok(d.propensity > 0 && d.propensity <= 1);
  }
  gw.route("a secret prompt", { requestId: "s" });
  gw.recordUsage("req-1", names[1], { inputTokens: 10, outputTokens: 2 });
  const recs = log.lines.map((l) => JSON.parse(l));
  for (const r of recs.slice(0, n)) explored += r.explored ? 1 : 0;
  assert.ok(Math.abs(explored / n - 0.3) < 0.04, `explored ${explored / n}`);
  const keys = ["v", "kind", "time", "request_id", "suite", "quality_target", "prompt_hash", "prompt_chars", "text", "channel",
    "policy_version", "model", "propensity", "policy_model", "policy_probability", "explored", "pass_probabilities",
    "expected_cost_usd", "exploration"];
  assert.deepEqual(Object.keys(recs[0]), keys);
  assert.match(recs[0].time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
  assert.equal(recs[n].text, undefined);
  assert.equal(recs[n + 1].kind, "usage");
  for (const r of recs.slice(0, n)) {
    if (r.explored) assert.ok(!r.exploration.eligible.includes(names[0]) && r.exploration.eligible.includes(r.model));
  }
});

test("a suite the policy was not trained on is counted, warned once per name and logged", { skip: NO_FIXTURES }, async () => {
  const events = [];
  const router = await Router.open({ files: versionFiles("registry"), publicKeys: [publicKey()],
    onEvent: (kind, message) => events.push([kind, message]) });
  const log = new MemoryLog();
  const gw = await Gateway.create(router, { log });
  const known = router.route("Task: add 2 and 3", { suite: "add" });
  assert.equal(known.unknownSuite, false);
  for (let i = 0; i < 3; i++) assert.equal(gw.route("Task: add 2 and 3", { suite: "invoice-total" }).unknownSuite, true);
  assert.equal(gw.route("Task: add 2 and 3", { suite: "no-such" }).unknownSuite, true);
  assert.equal(gw.route("Task: add 2 and 3").unknownSuite, false);
  assert.deepEqual(router.status().unknownSuites, { "invoice-total": 3, "no-such": 1 });
  assert.equal(router.status().unknownSuiteRequests, 4);
  const warned = events.filter(([k]) => k === "unknown_suite").map(([, m]) => m);
  assert.equal(warned.length, 2);
  assert.match(warned[0], /suite "invoice-total" is not one the policy was trained on \(it knows \[.*"add".*\]\)/);
  const recs = log.lines.map((l) => JSON.parse(l));
  assert.deepEqual(recs.map((r) => r.unknown_suite ?? false), [true, true, true, true, false]);
});
