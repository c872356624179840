"""The gateway's decision log, exploration with known propensities, shadow and canary."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from routeopt.artifacts.serving.gateway import (
    DecisionLog,
    Exploration,
    Gateway,
    choose,
    policy_distribution,
    unit_draw,
    verbatim,
)
from routeopt.artifacts.publish.registry import move_channel
from routeopt.artifacts.serving.loader import ServedDecision
from tests import REPO
from tests.artifacts.policies import PROMPTS

NAMES = ("cheap", "mid", "dear", "banned")
COSTS = {"cheap": 0.001, "mid": 0.004, "dear": 0.02, "banned": 0.002}


class FakeRouter:
    """A router whose policy always picks `pick` (version `version`)."""

    def __init__(self, pick: str = "cheap", version: int = 1, extra: dict | None = None) -> None:
        self.pick, self.version, self.extra, self.calls = pick, version, extra or {}, 0

    def route(self, prompt: str, suite: str | None = None, quality_target: float | None = None):
        self.calls += 1
        fallbacks = tuple(n for n in NAMES if n != self.pick)
        d = ServedDecision(self.pick, fallbacks, dict.fromkeys(NAMES, 0.5), dict(COSTS), self.version)
        if self.extra:
            return _Extended(**d.__dict__, **self.extra)
        return d

    def status(self):
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Extended(ServedDecision):
    probability: float | None = None
    choice_probabilities: dict | None = None


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_exploration_frequencies_match_the_logged_propensities() -> None:
    x = Exploration(rate=0.3, exclude={"banned"}, max_cost_usd=0.01, seed=7)
    gw = Gateway(FakeRouter("mid"), exploration=x)
    n = 20_000
    seen = Counter()
    props: dict[str, set[float]] = {}
    for i in range(n):
        d = gw.route("p", request_id=f"req-{i}")
        seen[d.model] += 1
        props.setdefault(d.model, set()).add(round(d.propensity, 12))
    # eligible: cheap and mid (banned is excluded, dear is above the cost cap)
    assert set(seen) == {"cheap", "mid"}
    assert props == {"mid": {round(0.7 + 0.15, 12)}, "cheap": {0.15}}
    assert seen["cheap"] / n == pytest.approx(0.15, abs=0.01)
    assert sum(1 / p for m, ps in props.items() for p in ps for _ in range(seen[m])) / n == pytest.approx(
        2.0, rel=0.05
    )  # IPS of "always 1" over both models' weights sums to #models


def test_exploration_is_reproducible_per_request_id_with_a_seed() -> None:
    def models(seed):
        gw = Gateway(FakeRouter("mid"), exploration=Exploration(rate=0.5, seed=seed))
        return [gw.route("p", request_id=f"r{i}").model for i in range(200)]

    assert models(1) == models(1)
    assert models(1) != models(2)
    unseeded = Gateway(FakeRouter("mid"), exploration=Exploration(rate=0.5))
    first = [unseeded.route("p", request_id=f"r{i}").model for i in range(50)]
    assert first == [unseeded.route("p", request_id=f"r{i}").model for i in range(50)]


def test_ratio_cap_and_fallbacks() -> None:
    x = Exploration(rate=1.0, max_cost_ratio=2.0, seed=0)
    gw = Gateway(FakeRouter("cheap"), exploration=x)
    chosen = {gw.route("p", request_id=str(i)).model for i in range(200)}
    assert chosen <= {"cheap", "banned"}  # mid costs 4x the policy's choice, dear 20x
    d = next(
        gw.route("p", request_id=str(i))
        for i in range(200)
        if gw.route("p", request_id=str(i)).model == "banned"
    )
    assert d.fallbacks[0] == "cheap" and "banned" not in d.fallbacks


def test_propensity_composes_with_the_policys_own_randomisation() -> None:
    full = {"cheap": 0.6, "mid": 0.4, "dear": 0.0, "banned": 0.0}
    d = FakeRouter("mid", extra={"choice_probabilities": full}).route("p")
    x = Exploration(rate=0.2, exclude={"banned"})
    assert choose(d, x, u=0.9, v=0.0).propensity == pytest.approx(0.8 * 0.4 + 0.2 / 3)
    assert choose(d, x, u=0.1, v=0.0).propensity == pytest.approx(0.8 * 0.6 + 0.2 / 3)  # explored to cheap
    only_own = FakeRouter("mid", extra={"probability": 0.4}).route("p")
    dist, own = policy_distribution(only_own)
    assert own == 0.4 and dist == {"mid": 1.0}  # conditional on the policy's own draw
    c = choose(only_own, x, u=0.9, v=0.0)
    assert (c.propensity, c.policy_probability) == (pytest.approx(0.8 + 0.2 / 3), 0.4)


def test_a_mixed_knob_points_own_probability_is_logged_as_policy_probability(tmp_path) -> None:
    """The runtime names the policy's own probability `policy_probability` (a knob point that mixes
    two rules per request), as the record does, while the served model's propensity stays
    conditional on the request's own hash draw (1 without exploration)."""
    mixed = FakeRouter("mid", extra=None)
    mixed.route = lambda prompt, suite=None, quality_target=None: ServedDecision(  # type: ignore[method-assign]
        "mid", ("cheap",), dict.fromkeys(NAMES, 0.5), dict(COSTS), 1, policy_probability=0.875
    )
    assert policy_distribution(mixed.route("p")) == ({"mid": 1.0}, 0.875)
    log = DecisionLog(tmp_path, flush_s=0.05)
    gw = Gateway(mixed, log=log, candidate=mixed, shadow=False)
    d = gw.route("p", request_id="r1")
    x = Exploration(rate=0.2, seed=0)
    explored = Gateway(mixed, log=log, exploration=x).route("p", request_id="r2")
    log.close()
    first, second = _records(tmp_path)
    assert (d.propensity, first["propensity"], first["policy_probability"]) == (1.0, 1.0, 0.875)
    assert d.policy_probability == explored.policy_probability == 0.875
    assert second["policy_probability"] == 0.875 and second["propensity"] == explored.propensity


def test_log_records_every_decision_and_keeps_text_only_through_the_hook(tmp_path) -> None:
    hidden = DecisionLog(tmp_path / "a", flush_s=0.05)
    kept = DecisionLog(
        tmp_path / "b", redact=lambda s: s.replace("secret", "[x]"), flush_s=0.05, hash_key=b"k"
    )
    for log in (hidden, kept):
        gw = Gateway(FakeRouter("mid", version=3), log=log, exploration=Exploration(rate=0.1, seed=0))
        for i in range(50):
            gw.route(f"my secret {i}", suite="s", request_id=f"id-{i}")
        gw.record_usage("id-1", "mid", input_tokens=12, output_tokens=4, cost_usd=0.002)
        log.close()
    a, b = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert len(a) == len(b) == 51
    rec = a[0]
    assert {rec[k] for k in ("request_id", "suite", "policy_version", "policy_model")} == {
        "id-0",
        "s",
        3,
        "mid",
    }
    assert rec["propensity"] > 0 and rec["exploration"]["rate"] == 0.1 and rec["prompt_chars"] == 11
    assert "text" not in rec and all("secret" not in json.dumps(r) for r in a)
    assert b[0]["text"] == "my [x] 0" and b[0]["prompt_hash"] != rec["prompt_hash"]  # keyed hash
    assert a[-1] == {**a[-1], "kind": "usage", "request_id": "id-1", "input_tokens": 12, "cost_usd": 0.002}


def test_a_prompt_that_is_not_valid_unicode_loses_no_records(tmp_path) -> None:
    log = DecisionLog(tmp_path, redact=verbatim, flush_s=0.05)
    gw = Gateway(FakeRouter(), log=log)
    for i, prompt in enumerate(["fine", "broken \udc80 half", "fine again"]):
        gw.route(prompt, request_id=str(i))
    log.close()
    assert [r["text"] for r in _records(tmp_path)] == ["fine", "broken \udc80 half", "fine again"]
    assert log.status().written == 3 and log.status().dropped == 0


def test_a_failing_redaction_hook_logs_no_text(tmp_path) -> None:
    def broken(text: str) -> str:
        raise RuntimeError("regex timeout")

    log = DecisionLog(tmp_path, redact=broken, flush_s=0.05)
    gw = Gateway(FakeRouter(), log=log)
    gw.route("call me at 555-0100, Jane Roe", request_id="x")
    log.close()
    (rec,) = _records(tmp_path)
    assert "text" not in rec and "Jane" not in json.dumps(rec)
    assert log.status().redaction_errors == 1


def test_a_full_queue_drops_and_counts_and_never_blocks(tmp_path) -> None:
    log = DecisionLog(tmp_path, max_queue=10, flush_s=60)
    gate = threading.Event()
    original = log._drain
    log._drain = lambda: (gate.wait(5), original())  # the writer is stuck
    gw = Gateway(FakeRouter(), log=log)
    t0 = time.perf_counter()
    for i in range(1000):
        gw.route("p", request_id=str(i))
    assert time.perf_counter() - t0 < 2.0
    status = log.status()
    assert status.dropped == 990 and status.queued == 10
    gate.set()
    log.close()
    assert log.status().written == 10 and len(_records(tmp_path)) == 10


def test_write_errors_are_counted_and_routing_goes_on(tmp_path) -> None:
    log = DecisionLog(tmp_path / "log", flush_s=0.02)
    gw = Gateway(FakeRouter(), log=log)
    log._rotate_if_due = lambda: (_ for _ in ()).throw(OSError("disk full"))
    assert gw.route("p", request_id="1").model == "cheap"
    assert log.flush(5)
    s = log.status()
    assert s.write_errors >= 1 and s.dropped == 1 and "disk full" in s.last_error


def test_logging_that_raises_never_fails_the_routing_call() -> None:
    class Broken:
        def submit(self, *a):
            raise RuntimeError("boom")

        def status(self):
            return None

    gw = Gateway(FakeRouter("dear"), log=Broken())
    d = gw.route("p", request_id="r")
    assert (d.model, d.request_id) == ("dear", "r")
    assert gw.status().errors == 1 and "boom" in gw.status().last_error


def test_files_rotate_by_size_and_old_ones_are_deleted(tmp_path) -> None:
    log = DecisionLog(tmp_path, max_file_bytes=2000, flush_s=0.01, keep_files=3)
    gw = Gateway(FakeRouter(), log=log)
    for i in range(60):
        gw.route("p", request_id=str(i))
        if i % 5 == 4:
            log.flush()
    log.close()
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) == 3 and log.status().files == 3
    assert all(f.stat().st_size < 5000 for f in files)


def test_shadow_logs_the_candidates_decision_without_acting_on_it(tmp_path) -> None:
    champion, candidate = FakeRouter("cheap", 1), FakeRouter("dear", 2)
    log = DecisionLog(tmp_path, flush_s=0.02)
    gw = Gateway(champion, log=log, candidate=candidate, shadow=True)
    assert all(gw.route("p", request_id=str(i)).model == "cheap" for i in range(20))
    log.close()
    recs = _records(tmp_path)
    assert len(recs) == 20 and candidate.calls == 20
    assert all(
        r["shadow"]["model"] == "dear"
        and r["shadow"]["policy_version"] == 2
        and r["shadow"]["channel"] == "candidate"
        and r["channel"] == "champion"
        for r in recs
    )
    same = DecisionLog(tmp_path / "same", flush_s=0.02)
    Gateway(champion, log=same, candidate=FakeRouter("dear", 1), shadow=True).route("p", request_id="s")
    same.close()
    assert "shadow" not in _records(tmp_path / "same")[0]  # the same version: nothing to compare


def test_canary_share_is_sticky_per_request_id(tmp_path) -> None:
    def channels(gw):
        return [gw.route("p", request_id=f"user-{i}").policy_version for i in range(4000)]

    a = Gateway(FakeRouter("cheap", 1), candidate=FakeRouter("dear", 2), canary_share=0.1)
    b = Gateway(FakeRouter("cheap", 1), candidate=FakeRouter("dear", 2), canary_share=0.1)
    first = channels(a)
    assert first == channels(a) == channels(b)  # same ids, same arm, in any gateway process
    assert first.count(2) / len(first) == pytest.approx(0.1, abs=0.02)
    other = Gateway(
        FakeRouter("cheap", 1), candidate=FakeRouter("dear", 2), canary_share=0.1, canary_seed="another"
    )
    assert channels(other) != first


def test_unit_draw_is_uniform_and_keyed() -> None:
    xs = [unit_draw(b"k", str(i))[0] for i in range(5000)]
    assert 0.48 < sum(xs) / len(xs) < 0.52 and min(xs) >= 0 and max(xs) < 1
    assert unit_draw(b"k", "a") != unit_draw(b"j", "a")


def test_gateway_open_on_a_registry(policies, publish_to, registry, keypair, tmp_path) -> None:
    publish_to(policies[0])
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    publish_to(policies[1])
    move_channel(registry, "candidate", 2, signing_key=keypair[0])
    gw = Gateway.open(
        registry,
        keypair[1],
        log_dir=tmp_path / "log",
        redact=verbatim,
        exploration=Exploration(rate=0.2, seed=1),
        shadow=True,
        canary_share=0.5,
    )
    for i, (prompt, suite) in enumerate(PROMPTS * 10):
        d = gw.route(prompt, suite, request_id=f"q{i}")
        assert d.model in policies[0].candidates and 0 < d.propensity <= 1
    status = gw.status()
    gw.close()
    assert status.champion.version == 1 and status.candidate.version == 2
    recs = _records(tmp_path / "log")
    assert {r["channel"] for r in recs} == {"champion", "candidate"}
    assert all(r["shadow"]["policy_version"] == (2 if r["channel"] == "champion" else 1) for r in recs)


def test_gateway_open_without_a_candidate_channel_routes_without_shadow(
    policies, tmp_path, caplog, keypair
) -> None:
    from routeopt.artifacts.publish.registry import publish

    publish(policies[0], tmp_path / "reg", lineage={}, metrics={}, signing_key=keypair[0])
    gw = Gateway.open(tmp_path / "reg", keypair[1], shadow=True, canary_share=0.2)
    assert gw.candidate is None and gw.status().mode == {
        "exploration_rate": 0.0,
        "shadow": False,
        "canary_share": 0.0,
    }
    assert gw.route(*PROMPTS[0]).model in policies[0].candidates
    assert "shadow and canary are off" in caplog.text
    gw.close()


GATEWAY_SCRIPT = """
import json, sys, tempfile
before = set(sys.modules)
from routeopt.artifacts.serving.gateway import Exploration, Gateway, verbatim
gw = Gateway.open(sys.argv[1], public_key=sys.argv[2], log_dir=tempfile.mkdtemp(), redact=verbatim,
                  exploration=Exploration(rate=0.5, seed=0), shadow=True)
decision = gw.route("Reverse the string: abcdef", suite="reverse", request_id="r1")
gw.close()
loaded = sorted({".".join(m.split(".")[:2]) if m.startswith("routeopt.") else m.split(".")[0]
                 for m in set(sys.modules) - before} - set(sys.stdlib_module_names))
print(json.dumps({"model": decision.model, "propensity": decision.propensity, "loaded": loaded}))
"""


def test_logging_gateway_imports_only_numpy_cryptography_and_the_standard_library(
    policies, publish_to, registry, keypair
) -> None:
    publish_to(policies[0])
    move_channel(registry, "candidate", 1, signing_key=keypair[0])
    out = subprocess.run(
        [sys.executable, "-c", GATEWAY_SCRIPT, str(registry), str(keypair[1])],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    result = json.loads(out.stdout)
    assert result["model"] in policies[0].candidates and 0 < result["propensity"] <= 1
    assert set(result["loaded"]) <= {
        "numpy",
        "cryptography",
        "_cffi_backend",
        "_openssl",
        "routeopt",
        "routeopt.artifacts",
        "routeopt.router_training",
        "routeopt.common",
        "wasmtime",  # the fast extra's WebAssembly kernel, where installed
    }, result["loaded"]


UVICORN_HOST = """
import sys
import uvicorn
from routeopt.artifacts.serving.gateway import DecisionLog, write_through_on_signals

folder, port, hooked = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
state = {}

async def app(scope, receive, send):
    if scope["type"] == "lifespan":  # built at start-up, inside uvicorn's signal capture, as the proxy's
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                state["log"] = DecisionLog(folder, flush_s=3600)  # no tick will write anything
                if hooked:
                    assert write_through_on_signals(lambda: state["log"])
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await receive()
    for i in range(3):
        state["log"].submit(lambda i=i: {"kind": "decision", "request_id": f"r{i}"})
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"logged"})

uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def _logged(folder: Path) -> list[str]:
    return [r["request_id"] for r in _records(folder)]


@pytest.mark.parametrize("hooked", [True, False])
def test_a_host_that_re_raises_sigterm_loses_no_records_with_the_signal_hook(tmp_path, hooked) -> None:
    """uvicorn ends a graceful SIGTERM shutdown by re-raising the signal, so atexit never runs and
    a log waiting for its next tick loses what it holds (the control, hooked=False). The LiteLLM
    proxy is such a host; its callback installs `write_through_on_signals`."""
    import signal
    import urllib.request

    from tests.litellm_proxy import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", UVICORN_HOST, str(tmp_path), str(port), str(int(hooked))],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                    assert resp.read() == b"logged"
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM  # died of the signal: no atexit ran
    finally:
        proc.kill()
    assert _logged(tmp_path) == (["r0", "r1", "r2"] if hooked else [])


def test_without_a_host_handler_the_hook_writes_then_the_signal_ends_the_process(tmp_path) -> None:
    import signal

    script = (
        "import os, signal, sys\n"
        "from routeopt.artifacts.serving.gateway import DecisionLog, write_through_on_signals\n"
        "log = DecisionLog(sys.argv[1], flush_s=3600)\n"
        "assert write_through_on_signals(lambda: log)\n"
        "log.submit(lambda: {'kind': 'decision', 'request_id': 'r0'})\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('survived')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert out.returncode == -signal.SIGTERM and "survived" not in out.stdout, out.stderr
    assert _logged(tmp_path) == ["r0"]


def test_write_through_writes_each_record_without_waiting_for_a_tick(tmp_path) -> None:
    log = DecisionLog(tmp_path, flush_s=3600)
    log.submit(lambda: {"kind": "decision", "request_id": "r0"})
    log.write_through()
    log.submit(lambda: {"kind": "decision", "request_id": "r1"})
    deadline = time.monotonic() + 60  # only write-through can write before the hour's tick
    while _logged(tmp_path) != ["r0", "r1"]:
        assert time.monotonic() < deadline, _logged(tmp_path)
        time.sleep(0.01)
    log.submit(lambda: {"kind": "decision", "request_id": "r2"})
    while _logged(tmp_path) != ["r0", "r1", "r2"]:
        assert time.monotonic() < deadline, _logged(tmp_path)
        time.sleep(0.01)
    log.close()


def test_the_served_decision_keeps_every_field_of_the_policys_decision() -> None:
    """The gateway builds the served decision field by field (cheaper than dataclasses.replace):
    a field added to ServedDecision and not carried over would fail here."""
    import dataclasses

    router = FakeRouter("mid", version=7)
    served = Gateway(router).route("p", "s", 0.9, request_id="r1")
    want = dataclasses.replace(router.route("p", "s", 0.9), request_id="r1", propensity=1.0)
    assert served == want
    fields = {f.name for f in dataclasses.fields(ServedDecision)}
    assert fields == {
        "model",
        "fallbacks",
        "pass_probabilities",
        "expected_cost_usd",
        "policy_version",
        "default_reason",
        "propensity",
        "request_id",
        "trace_id",
        "traceparent",
        "policy_probability",
        "unknown_suite",
        "budget",
        "live",
    }, "Decision has new fields: carry them in Gateway._route"
