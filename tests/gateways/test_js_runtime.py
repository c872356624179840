"""The JavaScript gateway (gateways/js) against the Python pipeline that publishes for it.

Policies are trained and published here with the real trainer and registry; the JavaScript
runtime then loads them from bytes, from a registry over HTTP (polled while the registry
changes under it), and inside workerd (a worker: no file system, fetch and WebCrypto only),
and must decide exactly as the Python runtime does. Its decision logs go through the real CLI.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from routeopt.artifacts.publish.registry import publish
from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.publish.registry_server import serve_in_thread
from tests import REPO
from tests.gateways.node import package, run_node

os.environ.setdefault("OMP_NUM_THREADS", "1")
HOSTILE = [
    "",
    " \t\n ",
    "\x00",
    "a\x00b",
    "\ud800",
    "abc\udfff",
    "e\u0301\u0301",
    "😀 👩‍👩‍👧‍👦",
    "مرحبا؟",
    "日本語のテキスト",
    "İstanbul ıi",
    "ΟΔΟΣ οδος",
    "a" * 9000,
    "é" * 4096,
    "x" + "é" * 4096,
    "Task: add the input. difficulty: 3. Input: stone river apple",
]
SUITES = [None, "", "add", "reverse", "sort", "no-such-suite"]
TARGETS = [None, 0.0, 0.5, 0.9, 1.0, 1.2]


def _requests() -> list[dict]:
    out = []
    for i, prompt in enumerate(HOSTILE):
        for j, suite in enumerate(SUITES):
            out.append(
                {
                    "id": f"r{i}-{j}",
                    "prompt": prompt,
                    "suite": suite,
                    "quality_target": TARGETS[(i + j) % len(TARGETS)],
                }
            )
    return out


def _python_decisions(router, requests: list[dict]) -> list[dict]:
    rows = []
    for r in requests:
        d = router.route(r["prompt"], suite=r["suite"], quality_target=r["quality_target"])
        rows.append(
            {
                **r,
                "model": d.model,
                "fallbacks": list(d.fallbacks),
                "propensity": d.propensity,
                "policy_probability": d.policy_probability,
                "unknown_suite": d.unknown_suite,
                "pass_probabilities": d.pass_probabilities,
                "expected_cost_usd": d.expected_cost_usd,
            }
        )
    return rows


def _same(js: dict, py: dict) -> None:
    assert (js["model"], js["fallbacks"], js["propensity"], js["policyProbability"], js["unknownSuite"]) == (
        py["model"],
        py["fallbacks"],
        py["propensity"],
        py["policy_probability"],
        py["unknown_suite"],
    ), py["id"]
    assert (
        js["passProbabilities"] == py["pass_probabilities"]
        and js["expectedCostUsd"] == py["expected_cost_usd"]
    )


@pytest.fixture(scope="module")
def js() -> Path:
    return package()


def build_fixtures(root: Path) -> Path:
    """Policies trained and published by the Python pipeline, and Python's own decisions:
    policies/ (linear with topics, char n-grams without topics, LightGBM trees, and a format 4
    one with latency budgets), registry/ (versions 1 and 2 on `latest`), registry-latency/,
    keys/, expected/."""
    from routeopt.artifacts.publish.signing_keys import generate_keys
    from routeopt.router_training.train import Design, train_router
    from tests.router_training.conftest import demo_frame

    private, public = generate_keys(root / "keys")
    policies = {
        "demo-linear": train_router(demo_frame(), seed=0).policy,
        "demo-chars": train_router(
            demo_frame(n_items=60, seed=3), seed=3, design=Design(topics=0, char_ngrams=4, candidate_text=0.0)
        ).policy,
        "demo-trees": train_router(demo_frame(n_items=60, seed=1), seed=1, estimator="lightgbm").policy,
    }
    for name, policy in policies.items():
        policy.save(root / "policies" / name)
    for name in ("demo-linear", "demo-chars"):
        publish(policies[name], root / "registry", lineage={}, metrics={}, signing_key=private)
    router = load(next((root / "registry" / "versions").glob("000001-*")), public_key=public, state_dir=False)
    (root / "expected").mkdir()
    (root / "expected" / "demo-linear.json").write_text(
        json.dumps({"requests": _python_decisions(router, _requests())})
    )
    _latency_fixtures(root, private)
    return root


# a ttft tier of the demo-latency policy for any suite, and for "add" an end-to-end budget below every tier
DEFAULT_BUDGETS = {"*": ("ttft", 1.3), "add": ("latency", 3.0)}


def _latency_fixtures(root: Path, private) -> None:
    """A format 4 policy (latency budgets, section 8.3) trained on timed outcomes, with default
    budgets by suite: policies/demo-latency, registry-latency/ (its one signed version) and
    expected/demo-latency.json, Python's own decisions under several budgets of each kind and
    under each request's default."""
    from routeopt.router_training.policy.routing import RoutingPolicy
    from routeopt.router_training.train import Design, train_router
    from tests.router_training.test_latency import timed_frame

    folder = root / "policies" / "demo-latency"
    trained = train_router(
        timed_frame(),
        quality_target=0.9,
        seed=0,
        default_budgets=DEFAULT_BUDGETS,
        design=Design(budget_margin=0.5),  # masks past their budgets (mask_s) in the vectors too
    )
    assert any(t.mask_s > t.budget_s for t in trained.policy.latency.tiers)
    trained.policy.save(folder)
    policy = RoutingPolicy.load(folder)
    assert policy.format_info["version"] == 4 and policy.self_check().ok
    assert policy.latency.defaults == DEFAULT_BUDGETS
    publish(policy, root / "registry-latency", lineage={}, metrics={}, signing_key=private)
    (root / "expected" / "demo-latency.json").write_text(
        json.dumps(
            {
                "budgets": _budgets(policy),
                "requests": _python_budget_decisions(policy, _requests()),
                "defaults": {suite: list(b) for suite, b in DEFAULT_BUDGETS.items()},
                "default_requests": _python_default_decisions(root, policy, _requests()),
            }
        )
    )
    (root / "expected" / "demo-latency-live.json").write_text(
        json.dumps(_python_live_decisions(root, policy))
    )
    (root / "expected" / "demo-latency-explored.json").write_text(
        json.dumps(_python_explored_decisions(root, policy, _requests()))
    )


EXPLORATION = {"rate": 0.5, "seed": 11}


def _python_explored_decisions(root: Path, policy, requests: list[dict]) -> dict:
    """Python's Gateway, exploring half the requests, under every budget of the vectors: each log
    line's model, propensity, explored and eligible (8.1: only candidates predicted to meet the
    budget are eligible)."""
    from routeopt.artifacts.serving.gateway import DecisionLog, Exploration, Gateway

    router = load(
        next((root / "registry-latency" / "versions").iterdir()),
        public_key=root / "keys" / "public_key.pem",
        state_dir=False,
    )
    asked = [
        {**r, "kind": kind, "budget_s": budget, "request_id": f"e{i}-{j}"}
        for i, (kind, budget) in enumerate(_budgets(policy))
        for j, r in enumerate(requests)
    ]
    with tempfile.TemporaryDirectory() as folder:
        log = DecisionLog(Path(folder))
        gateway = Gateway(router, log=log, exploration=Exploration(**EXPLORATION))
        for a in asked:
            gateway.route(
                a["prompt"],
                a["suite"],
                a["quality_target"],
                request_id=a["request_id"],
                **{f"{a['kind']}_budget_s": a["budget_s"]},
            )
        log.close()
        lines = {
            line["request_id"]: line
            for f in Path(folder).glob("*.jsonl")
            for line in map(json.loads, f.read_text().splitlines())
        }
    rows = []
    for a in asked:
        line = lines[a["request_id"]]
        rows.append(
            {
                **a,
                **{k: line[k] for k in ("model", "propensity", "explored", "policy_model")},
                "eligible": line["exploration"]["eligible"],
            }
        )
    assert any(r["explored"] for r in rows) and any(len(r["eligible"]) < len(policy.candidates) for r in rows)
    return {"exploration": EXPLORATION, "requests": rows}


def _python_live_decisions(root: Path, policy) -> dict:
    """Live latency (section 8.4) through Python's Router on the published version: every
    candidate observed once a second for 90 s, each call against the p95 predicted for it (a
    request's `predicted_s` of that candidate) and taking 0.5 to 1.04 of it, some without a
    prediction; two of them three times slower from 20 s to 40 s: the one whose slowdown could
    move most of the decisions under the TTFT tier whose mask is furthest past its budget, and
    the one whose decisions that tier's mask keeps most often where the budget would not (its
    slowed prediction past the budget, within the mask); and six requests decided under that
    budget after each second's observations, on the second and half a second on. The events in
    order, with Python's decisions, for the JavaScript Router to replay on the same clock."""
    from routeopt.artifacts.serving.loader import Router, resolve
    from routeopt.router_training.policy.live import live_move

    # the TTFT tier whose mask is furthest past its budget: a slowed prediction is held to the mask
    tier = max(
        (t for t in policy.latency.tiers if t.kind == "ttft"),
        key=lambda t: (t.mask_s / t.budget_s, t.budget_s),
    )
    assert tier.mask_s > tier.budget_s
    kind, budget = "ttft", tier.budget_s
    names = policy.candidates
    requests = [r for r in _requests() if r["prompt"].strip()]
    decided = [
        policy.decide(r["prompt"], r["suite"], r["quality_target"], ttft_budget_s=budget) for r in requests
    ]

    def moves(d, limit_s: float) -> bool:
        """Whether a slowdown of three of its model moves decision d, held to limit_s."""
        b = d.budget
        return (
            live_move(
                d.model, d.fallbacks, names, d.pass_probabilities, b.predicted_s, limit_s, {d.model: 3.0}
            )
            is not None
        )

    movable = [d.model for d in decided if moves(d, d.budget.limit_s)]
    assert movable, "the sequence needs decisions a slowdown can move"
    slow = max(names, key=movable.count)
    kept = [
        d.model
        for d in decided
        if d.model != slow and moves(d, d.budget.budget_s) and not moves(d, d.budget.limit_s)
    ]
    assert kept, "the sequence needs decisions the mask keeps where the budget would move them"
    steady = max(names, key=kept.count)
    clock = {"now": 0.0}
    backend, prefix, _ = resolve(next((root / "registry-latency" / "versions").iterdir()))
    router = Router(
        backend,
        prefix=prefix,
        public_key=root / "keys" / "public_key.pem",
        state_dir=False,
        clock=lambda: clock["now"],
    )
    events: list[dict] = []
    for second in range(91):
        for j, model in enumerate(names):
            # the call of a request as its decision predicted it (its predicted_s of the model called)
            predicted = decided[(5 * second + j) % len(decided)].budget.predicted_s[model]
            ttft = predicted * (0.5 + 0.06 * ((7 * second + 3 * j) % 10))  # 0.50 to 1.04 of the prediction
            if model in (slow, steady) and 20 <= second < 40:
                ttft *= 3.0
            obs = {
                "model": model,
                "ttft_s": ttft,
                "latency_s": 2.0 * ttft,
                # some calls come without a prediction: they have no say in the live factor
                "predicted_ttft_s": None if second % 7 == 3 else predicted,
                "predicted_latency_s": 2.0 * predicted if second % 2 else None,
                "at": float(second),
            }
            router.observe(**obs)
            events.append({"observe": obs})
        for i in range(6):  # on the second (an observation then leaves the window) and half a second on
            clock["now"] = second + 0.5 * (i % 2)
            r = requests[(6 * second + i) % len(requests)]
            d = router.route(r["prompt"], r["suite"], r["quality_target"], ttft_budget_s=budget)
            events.append(
                {
                    "route": {**r, "id": f"{r['id']}@{second}"},
                    "now": clock["now"],
                    "model": d.model,
                    "fallbacks": list(d.fallbacks),
                    "policy_probability": d.policy_probability,
                    "met": d.budget["met"],
                    "live": d.live,
                }
            )
    moved = [e for e in events if e.get("live")]
    assert moved and all(e["live"]["from"] == slow for e in moved), (
        "the sequence must move decisions off the slow one, and keep the steady one's"
    )
    assert any(e.get("model") == steady and 30 <= e["now"] < 40 for e in events), (
        "the steady one must be decided slowed"
    )
    return {
        "kind": kind,
        "budget_s": budget,
        "mask_s": tier.mask_s,
        "slow": slow,
        "steady": steady,
        "slow_from": 20.0,
        "slow_to": 40.0,
        "events": events,
    }


def _budgets(policy) -> list[list]:
    """Per kind: below every tier, the first tier, between the first two, a middle tier, just
    under the next one, the last tier and above every tier."""
    out = []
    for kind in policy.latency.model.kinds:
        b = policy.latency.budgets(kind)
        mid = b[len(b) // 2]
        for budget in (b[0] / 2, b[0], (b[0] + b[1]) / 2, mid, b[len(b) // 2 + 1] - 1e-9, b[-1], b[-1] * 2):
            out.append([kind, budget])
    return out


def _python_budget_decisions(policy, requests: list[dict]) -> list[dict]:
    rows = []
    for kind, budget in _budgets(policy):
        for r in requests:
            d = policy.decide(r["prompt"], r["suite"], r["quality_target"], **{f"{kind}_budget_s": budget})
            rows.append({**r, "kind": kind, "budget_s": budget, **_budget_decision(d)})
    return rows


def _python_default_decisions(root: Path, policy, requests: list[dict]) -> list[dict]:
    """Each request naming no budget, decided under its suite's default as RoutingPolicy.decide
    does with use_defaults, and checked against Python's Router on the published version."""
    router = load(
        next((root / "registry-latency" / "versions").iterdir()),
        public_key=root / "keys" / "public_key.pem",
        state_dir=False,
    )
    rows = []
    for r in requests:
        d = policy.decide(r["prompt"], r["suite"], r["quality_target"], use_defaults=True)
        row = {**r, "kind": d.budget.kind, "budget_s": d.budget.budget_s, **_budget_decision(d)}
        served = router.route(r["prompt"], r["suite"], r["quality_target"])
        got = (served.model, list(served.fallbacks), served.policy_probability, served.budget)
        assert got == (row["model"], row["fallbacks"], row["propensity"], row["budget"]), r["id"]
        rows.append(row)
    return rows


def _budget_decision(d) -> dict:
    return {
        "model": d.model,
        "fallbacks": list(d.fallbacks),
        "propensity": d.propensity,
        "pass_probabilities": d.pass_probabilities,
        "expected_cost_usd": d.expected_cost_usd,
        "budget": {
            "kind": d.budget.kind,
            "budget_s": d.budget.budget_s,
            "tier_s": d.budget.tier_s,
            "met": d.budget.met,
            "predicted_s": d.budget.predicted_s,
            "mask_s": d.budget.mask_s,
        },
    }


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory, js) -> Path:
    return build_fixtures(tmp_path_factory.mktemp("js-fixtures"))


def test_node_tests_pass_on_policies_the_python_pipeline_made(fixtures) -> None:
    """gateways/js/test: numbers, BLAKE2b, the container, every conformance layer of three
    policies (linear with topics, char n-grams without, LightGBM trees), tampering, signatures,
    routing exactly as Python, exploration and the log's fields, latency budgets (named, and the
    policy's defaults by suite) and live latency (a scripted observation sequence replayed
    against Python's Router's decisions)."""
    files = sorted(
        str(f.relative_to(REPO / "gateways" / "js"))
        for f in (REPO / "gateways" / "js" / "test").glob("*.test.mjs")
    )
    done = run_node("--test", *files, env={"ROUTEOPT_JS_FIXTURES": str(fixtures)})
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "# fail 0" in done.stdout and "# skipped 0" in done.stdout, done.stdout[-2000:]


class Harness:
    """A node gateway process driven one JSON line at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["node", "test/harness.mjs"],
            cwd=REPO / "gateways" / "js",
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def __call__(self, op: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        assert ready, f"the node gateway did not answer {op} within 300 s"
        line = self.proc.stdout.readline()
        assert line, f"the node gateway exited: {self.proc.stderr.read()[-3000:]}"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self("close")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture()
def harness(js):
    h = Harness()
    yield h
    h.close()


def test_registry_polling_swaps_refuses_and_keeps_the_last_good_policy(fixtures, tmp_path, harness) -> None:
    from routeopt.artifacts.publish.signing_keys import load_private_key
    from routeopt.router_training.policy.routing import RoutingPolicy
    from tests.artifacts.serving.test_conformance import Altered, _rewrite_arrays

    registry, key = tmp_path / "registry", load_private_key(fixtures / "keys" / "signing_key.pem")
    pem = (fixtures / "keys" / "public_key.pem").read_text()
    first, second = (RoutingPolicy.load(fixtures / "policies" / n) for n in ("demo-linear", "demo-chars"))
    publish(first, registry, lineage={}, metrics={}, signing_key=key)
    server, url = serve_in_thread(registry)
    try:
        opened = harness("open", url=url, pem=pem)
        assert opened["version"] == 1 and "agree at every layer" in opened["status"]["conformance"]
        assert harness("refresh")["swapped"] is False  # unchanged: a 304
        old_pointer = (registry / "channels" / "latest.json").read_bytes()
        publish(second, registry, lineage={}, metrics={}, signing_key=key)
        swapped = harness("refresh")
        assert swapped["swapped"] and swapped["version"] == 2 and swapped["events"][0][0] == "swapped"
        python = load(
            registry, public_key=fixtures / "keys" / "public_key.pem", channel="latest", state_dir=False
        )
        requests = _requests()
        got = harness("routeMany", requests=requests)["decisions"]
        for js_d, py_d in zip(got, _python_decisions(python, requests)):
            _same(js_d, py_d)

        def edit(folder, names):
            _rewrite_arrays(folder, lambda t: t["scorer.weights"].__setitem__((slice(None), 1), 0.3))

        publish(Altered(first, edit), registry, lineage={}, metrics={}, signing_key=key)
        refused = harness("refresh")
        assert not refused["swapped"] and refused["version"] == 2
        assert "conformance vectors disagree" in refused["status"]["lastError"]
        assert refused["events"][-1][0] == "rejected"
        assert harness("route", prompt="still routing?", suite="add")["policyVersion"] == 2
        (registry / "channels" / "latest.json").write_bytes(old_pointer)  # a replayed, validly signed pointer
        replay = harness("refresh")
        assert replay["version"] == 2 and "replayed" in replay["status"]["lastError"]
    finally:
        server.shutdown()


class _Bad(BaseHTTPRequestHandler):
    """Answers every request with garbage, or (slow) only after the client gave up."""

    slow = threading.Event()

    def do_GET(self) -> None:
        if self.server.slow:  # type: ignore[attr-defined]
            self.slow.wait(5)
        body = b"\x00garbage{" * 10
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.mark.parametrize("slow", [False, True])
def test_a_registry_that_answers_garbage_or_slowly_is_a_clear_error(fixtures, harness, slow: bool) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bad)
    server.slow = slow  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    pem = (fixtures / "keys" / "public_key.pem").read_text()
    try:
        failed = harness("open", url=url, pem=pem, channel="latest", timeoutMs=300)
        assert failed["name"] == "PolicyLoadError"
        assert ("no answer within 300 ms" if slow else "not a valid channel file") in failed["error"]
        opened = harness("open", url=url, pem=pem, channel="latest", timeoutMs=300, defaultModel="safe-model")
        assert opened["version"] == 0 and opened["status"]["servingDefault"]
        d = harness("route", prompt="hello", suite="add")
        assert d["model"] == "safe-model" and d["policyVersion"] == 0 and d["defaultReason"]
    finally:
        _Bad.slow.set()
        server.shutdown()
        _Bad.slow.clear()


def test_a_worker_with_only_fetch_and_webcrypto_routes_like_python(fixtures, tmp_path) -> None:
    """workerd (through miniflare) runs the package as a Cloudflare worker would: it fetches the
    registry, verifies, self-checks and routes, with no file system, no Node APIs and no run-time
    WebAssembly."""
    server, url = serve_in_thread(fixtures / "registry")
    requests = _requests()
    (tmp_path / "requests.json").write_text(json.dumps({"requests": requests}))
    try:
        done = run_node(
            "test/worker/run.mjs",
            url,
            str(fixtures / "keys" / "public_key.pem"),
            str(tmp_path / "requests.json"),
            timeout=600,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert "error" not in answer, answer
    assert answer["environment"] == {"process": "undefined", "require": "undefined", "fs": "undefined"}
    # workerd refuses to compile WebAssembly from bytes: here the JavaScript engines of BLAKE2b
    # and of the features' and scorer's loops meet the vectors (Node's tests run both engines)
    assert answer["blake2b"] == "javascript"
    assert answer["kernel"] == "javascript"
    assert answer["status"]["version"] == 2 and "agree at every layer" in answer["status"]["conformance"]
    python = load(
        fixtures / "registry",
        public_key=fixtures / "keys" / "public_key.pem",
        channel="latest",
        state_dir=False,
    )
    for js_d, py_d in zip(answer["decisions"], _python_decisions(python, requests)):
        _same(js_d, py_d)


def test_a_worker_serves_latency_budgets_like_python(fixtures, tmp_path) -> None:
    """workerd (JavaScript engines only) loads the format 4 policy from a registry, passes its
    latency, budget and live layers, and decides under every budget as RoutingPolicy.decide does."""
    want = json.loads((fixtures / "expected" / "demo-latency.json").read_text())["requests"]
    requests = [
        {
            "id": w["id"],
            "prompt": w["prompt"],
            "suite": w["suite"],
            "quality_target": w["quality_target"],
            f"{w['kind']}_budget_s": w["budget_s"],
        }
        for w in want
    ]
    (tmp_path / "requests.json").write_text(json.dumps({"requests": requests}))
    server, url = serve_in_thread(fixtures / "registry-latency")
    try:
        done = run_node(
            "test/worker/run.mjs",
            url,
            str(fixtures / "keys" / "public_key.pem"),
            str(tmp_path / "requests.json"),
            timeout=600,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert "error" not in answer, answer
    assert answer["kernel"] == "javascript"
    assert "latency, budget, live" in answer["status"]["conformance"]
    assert len(answer["decisions"]) == len(want) > 1000
    for js_d, w in zip(answer["decisions"], want):
        b = js_d["budget"]
        assert (js_d["model"], js_d["fallbacks"], js_d["policyProbability"]) == (
            w["model"],
            w["fallbacks"],
            w["propensity"],
        ), w["id"]
        assert {
            "kind": b["kind"],
            "budget_s": b["budgetS"],
            "tier_s": b["tierS"],
            "met": b["met"],
            "predicted_s": b["predictedS"],
            "mask_s": b["maskS"],
        } == w["budget"]


def test_decision_logs_go_through_the_real_cli(fixtures, tmp_path, harness, monkeypatch) -> None:
    """`routeopt import feedback --log` and `routeopt policies evaluate --log` read the JavaScript
    gateway's logs unchanged."""
    server, url = serve_in_thread(fixtures / "registry")
    logs = tmp_path / "logs"
    pem = (fixtures / "keys" / "public_key.pem").read_text()
    try:
        assert harness("open", url=url, pem=pem, channel="latest")["version"] == 2
        harness("gateway", logDir=str(logs), exploration={"rate": 0.5, "seed": 3}, keepText=True)
        requests = [
            {
                "id": f"q{i}",
                "prompt": f"Task: add the input. difficulty: {i % 5 + 1}. Input: {i}",
                "suite": "add",
            }
            for i in range(300)
        ]
        decisions = harness("routeMany", requests=requests)["decisions"]
        closed = harness("close")
    finally:
        server.shutdown()
    assert closed["written"] == 300 and closed["dropped"] == 0
    feedback = tmp_path / "feedback.jsonl"
    feedback.write_text(
        "".join(
            json.dumps({"request_id": d["decisionId"], "passed": i % 3 != 0}) + "\n"
            for i, d in enumerate(decisions)
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ROUTEOPT_PUBLIC_KEY": str(fixtures / "keys" / "public_key.pem"),
    }
    db = tmp_path / "traffic.duckdb"
    cli = lambda *a: subprocess.run(
        ["python", "-m", "routeopt.flows.cli", *a],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    imported = cli("import", "feedback", str(feedback), "--db", str(db), "--log", str(logs))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "300 match a logged decision" in imported.stdout
    evaluated = cli(
        "policies",
        "evaluate",
        "2",
        "--registry",
        str(fixtures / "registry"),
        "--db",
        str(db),
        "--log",
        str(logs),
        "--json",
    )
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    result = json.loads(evaluated.stdout)["policies"][0]
    assert result["n_logged"] == 300 and result["n_feedback"] == 300


def _shared_sets() -> list[Path]:
    """The shared outcome sets beside the checkout (a worktree's are beside its parent)."""
    for data in (REPO.parent / "shared" / "data", REPO.parent.parent / "shared" / "data"):
        if data.is_dir():
            return sorted(p for p in data.iterdir() if (p / "train.parquet").is_file())
    return []


def test_policies_trained_on_every_shared_set_pass_in_javascript(js, tmp_path) -> None:
    """The conformance vectors of policies trained on the shared sets' training splits (as
    `routeopt train` trains, one fit without a held-out part) pass in JavaScript, bit for bit."""
    from routeopt.evals.storage.importer import training_frame_of
    from routeopt.router_training.train import train_router

    sets = _shared_sets()
    if not sets:
        pytest.skip("no shared outcome sets (../shared/data) beside the checkout")
    for folder in sets:
        policy = train_router(training_frame_of(folder / "train.parquet"), holdout_fraction=0.0).policy
        policy.save(tmp_path / folder.name)
        out = run_node("bench/conformance.mjs", str(tmp_path / folder.name))
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout)
        assert report["ok"] and report["requests"] >= 2000 and report["maxRelativeError"] == 0, (
            folder.name,
            report,
        )


def test_the_python_runtime_runs_the_kernel_the_javascript_build_assembles() -> None:
    """router_training/policy/kernel.wasm is the module `npm run build` writes into
    src/kernel-wasm.ts (refresh it with `node scripts/python-kernel.mjs` after a build)."""
    import base64
    import re
    from importlib import resources

    built = (package() / "src" / "kernel-wasm.ts").read_text()
    js = base64.b64decode(re.search(r'KERNEL_WASM: string = "([^"]+)"', built).group(1))  # type: ignore[union-attr]
    python = resources.files("routeopt.router_training.policy").joinpath("kernel.wasm").read_bytes()
    assert python == js, "kernel.wasm differs from the JavaScript build's: run node scripts/python-kernel.mjs"
