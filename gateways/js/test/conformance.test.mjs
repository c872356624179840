// Section 9 on policies the Python pipeline trained: every layer agrees, and a runtime that
// differs (here: arrays changed under it) is told the first step that differs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkVectors, conformanceSummary, KERNEL_ENGINE, readPolicy } from "../dist/index.js";
import { NO_FIXTURES, patchTensor, policyFiles, policyNames, widenTensor } from "./helpers.mjs";

const names = policyNames();
const load = (files, engine) => readPolicy(files["policy.json"], files["arrays.safetensors"], engine);

test("fixtures exist", { skip: NO_FIXTURES }, () => assert.ok(names.length >= 2, names.join(",")));

test("Node compiles the features' and scorer's WebAssembly loops, and policies use them", () => {
  assert.equal(KERNEL_ENGINE, "webassembly");
});

// Each engine of the hot loops (kernel.ts) on its own: WebAssembly, Node's default, and
// JavaScript, what workerd runs
for (const engine of ["webassembly", "javascript"]) {
  for (const name of names) {
    test(`${name}, ${engine} loops: every layer of the conformance vectors agrees, bit for bit`, { skip: NO_FIXTURES }, async () => {
      const files = policyFiles(name);
      const report = await checkVectors(load(files, engine), files["conformance.safetensors"]);
      assert.ok(report.ok, conformanceSummary(report));
      assert.ok(report.requests >= 2000);
      assert.equal(report.maxRelativeError, 0);
      assert.ok(Object.values(report.mismatches).every((v) => v === 0));
    });
  }
}

const first = names.find((n) => n.startsWith("demo-linear"));

test("F64 weights (the published F32 ones, widened) meet the same vectors in both engines", { skip: NO_FIXTURES || !first }, async () => {
  const files = policyFiles(first);
  const arrays = widenTensor(files["arrays.safetensors"], "scorer.weights");
  for (const engine of ["webassembly", "javascript"]) {
    const report = await checkVectors(load({ ...files, "arrays.safetensors": arrays }, engine), files["conformance.safetensors"]);
    assert.ok(report.ok, `${engine}: ${conformanceSummary(report)}`);
  }
  // and a changed weight in them is caught
  const changed = patchTensor(arrays, "scorer.weights", (a) => { a[a.length - 7] += 0.5; });
  const report = await checkVectors(load({ ...files, "arrays.safetensors": changed }), files["conformance.safetensors"]);
  assert.ok(!report.ok && report.first.startsWith("step scores"), report.first);
});

test("changed arrays are caught at the step they change", { skip: NO_FIXTURES || !first }, async () => {
  const files = policyFiles(first);
  const vectors = files["conformance.safetensors"];
  const cases = [
    ["features.idf", (a) => { for (let i = 0; i < a.length; i += 2) a[i] *= 1.01; }, "step features"],
    ["scorer.weights", (a) => { for (let i = 0; i < a.length; i += 37) a[i] += 0.5; }, "step scores"],
    ["calibration.platt", (a) => { a[a.length - 1] += 1e-3; }, "step calibration"],
    ["cost.floor", (a) => { for (let i = 0; i < a.length; i++) a[i] = a[i] * 3 + 1; }, "step cost"],
  ];
  for (const [tensor, change, step] of cases) {
    for (const engine of ["webassembly", "javascript"]) {
      const policy = load({ ...files, "arrays.safetensors": patchTensor(files["arrays.safetensors"], tensor, change) }, engine);
      const report = await checkVectors(policy, vectors);
      assert.ok(!report.ok && report.first.startsWith(step), `${tensor}, ${engine}: ${report.first}`);
    }
  }
});

test("vectors of another policy, or broken ones, are refused with a reason", { skip: NO_FIXTURES || names.length < 2 }, async () => {
  const a = policyFiles(names[0]);
  const policy = load(a);
  for (const other of names.slice(1)) {
    const report = await checkVectors(policy, policyFiles(other)["conformance.safetensors"]);
    assert.ok(!report.ok, other);
  }
  for (const bad of [new Uint8Array(0), a["conformance.safetensors"].slice(0, 5000), a["conformance.safetensors"].slice(0, -3)]) {
    const report = await checkVectors(policy, bad);
    assert.ok(!report.ok && /conformance\.safetensors/.test(report.first), report.first);
  }
});

test("policy.json errors name the field", { skip: NO_FIXTURES || !first }, () => {
  const files = policyFiles(first);
  const head = JSON.parse(new TextDecoder().decode(files["policy.json"]));
  const variant = (change) => new TextEncoder().encode(JSON.stringify(change(structuredClone(head))));
  const bad = [
    [(h) => ({ ...h, format_version: 2 }), /format_version 2 is not supported/],
    [(h) => ({ ...h, format_version: 99 }), /format_version 99/],
    [(h) => ({ ...h, portable: false, not_portable: "uses embeddings" }), /not portable: uses embeddings/],
    [(h) => ({ ...h, scorer: { ...h.scorer, kind: "xgboost" } }), /unknown scorer kind/],
    [(h) => ({ ...h, scorer: { ...h.scorer, rank: h.scorer.rank + 1 } }), /scorer.weights/],
    [(h) => ({ ...h, knob: { ...h.knob, members: [["magic", 1]] } }), /unknown knob member rule/],
    [(h) => ({ ...h, features: { ...h.features, n_buckets: 1000 } }), /power of two/],
  ];
  for (const [change, pattern] of bad) {
    assert.throws(() => readPolicy(variant(change), files["arrays.safetensors"]), pattern);
  }
  assert.throws(() => readPolicy(files["policy.json"], files["arrays.safetensors"].slice(0, 1000)), /arrays.safetensors/);
  assert.throws(() => readPolicy(new TextEncoder().encode("{nope"), files["arrays.safetensors"]), /not valid JSON/);
});
