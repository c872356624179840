"""Policies on live traffic: where a policy's choices come from, the gate, shadow/canary rollouts, the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from routeopt.artifacts.publish.promotion import (
    PromotionDecision,
    decide_promotion,
    rollout_evidence,
    with_live_evidence,
)
from routeopt.evals.storage.store import Store
from routeopt.evals.storage.traffic import import_decisions, import_feedback, load_traffic
from routeopt.flows.cli import cli
from routeopt.router_training.live.promise import (
    Comparison,
    PolicyOnTraffic,
    canary_arms,
    evaluate,
    live_comparison,
)
from routeopt.router_training.live.offpolicy import Estimate
from tests.artifacts.policies import make_policy, synthetic_frame
from tests.benchmarks import load
from tests.evals.storage.test_traffic import decision, write_log

tr = load("traffic_replay")
REPO_CONFIG = Path(__file__).resolve().parents[3] / "evals" / "demo" / "routeopt.yaml"


def _run(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert (result.exit_code == 0) is ok, result.output
    return result.output


@dataclass
class _D:
    model: str
    pass_probabilities: dict
    expected_cost_usd: dict


class TextPolicy:
    """Decides 'b' for every text (to check the policy is asked only where text was kept)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def decide_batch(self, prompts, suites=None, quality_target=None):
        self.seen += list(prompts)
        return [_D("b", {"a": 0.2, "b": 0.8}, {"a": 0.001, "b": 0.01}) for _ in prompts]


def test_a_policys_choices_come_from_its_records_shadows_or_kept_text(tmp_path) -> None:
    shadow = {
        "channel": "candidate",
        "policy_version": 2,
        "model": "b",
        "pass_probabilities": {"a": 0.3, "b": 0.7},
        "expected_cost_usd": {"a": 0.001, "b": 0.01},
    }
    records = [
        decision("shadowed", "a", 0.95, shadow=shadow),
        decision("canary", "b", 0.95, channel="candidate", policy_version=2),
        decision("text", "b", 0.05, explored=True, policy_model="a", text="keep me"),
        decision("opaque", "a", 0.95),
        decision("unsupported", "a", 1.0, text="t2", exploration={"rate": 0.1, "eligible": ["a"]}),
        decision("unknown-model", "z", 0.5, text="t3", policy_model="a", explored=True),  # z: unknown to v2
    ]
    for i, r in enumerate(records):
        r["time"] = f"2025-03-01T10:00:0{i}Z"
    with Store(tmp_path / "db.duckdb") as store:
        import_decisions(write_log(tmp_path / "log.jsonl", records), store)
        fb = tmp_path / "fb.jsonl"
        fb.write_text(
            "".join(
                json.dumps({"request_id": r["request_id"], "passed": True, "cost_usd": 0.01}) + "\n"
                for r in records
            )
        )
        import_feedback(fb, store)
        frame = load_traffic(store)
    policy = TextPolicy()
    est = evaluate(frame, 2, policy)
    assert policy.seen == ["keep me", "t2", "t3"]  # text is used only where nothing else says
    assert est.basis == {"shadow": 1, "logged": 1, "text": 3}
    assert (est.n_logged, est.n_feedback, est.n_evaluated, est.n_unknown) == (6, 6, 5, 1)
    assert est.n_unsupported == 1  # picks b where exploration could only pick a
    t = est.terms
    assert t.weight.tolist()[:3] == [0.0, pytest.approx(1 / 0.95), pytest.approx(1 / 0.05)]
    assert t.target_propensity[0] == pytest.approx(0.05) and t.target_propensity[1] == pytest.approx(0.95)
    assert est.terms.g_pass_logged[5] == 0.0 and est.terms.weight[5] == 0.0
    champion = evaluate(frame, 3)  # the serving policy: its own records only
    assert champion.basis == {"logged": 5} and champion.n_unknown == 1


def test_at_another_quality_target_a_policy_decides_again_where_it_logged_another_target(tmp_path) -> None:
    """A record routed at 0.9 says nothing about the policy's choice at 0.5: at 0.5 the policy
    decides again on the kept text, and a record without text is unknown."""
    records = [
        decision("at-0.9-text", "a", 0.95, quality_target=0.9, policy_version=2, text="t1"),
        decision("at-0.9-opaque", "a", 0.95, quality_target=0.9, policy_version=2),
        decision("at-0.5", "a", 0.95, quality_target=0.5, policy_version=2),
    ]
    for i, r in enumerate(records):
        r["time"] = f"2025-03-01T10:00:0{i}Z"
    with Store(tmp_path / "db.duckdb") as store:
        import_decisions(write_log(tmp_path / "log.jsonl", records), store)
        fb = tmp_path / "fb.jsonl"
        fb.write_text(
            "".join(json.dumps({"request_id": r["request_id"], "passed": True}) + "\n" for r in records)
        )
        import_feedback(fb, store)
        frame = load_traffic(store)

    class Asked(TextPolicy):
        def decide_batch(self, prompts, suites=None, quality_target=None):
            self.targets = getattr(self, "targets", []) + [quality_target] * len(prompts)
            return super().decide_batch(prompts, suites, quality_target)

    as_logged = evaluate(frame, 2, Asked())
    assert as_logged.basis == {"logged": 3}
    policy = Asked()
    at_half = evaluate(frame, 2, policy, quality_target=0.5)
    assert at_half.basis == {"text": 1, "logged": 1} and at_half.n_unknown == 1
    assert policy.seen == ["t1"] and policy.targets == [0.5]
    assert at_half.terms.chosen.tolist() == ["b", None, "a"]


def _est(value: float, half: float, n: int = 500) -> Estimate:
    return Estimate(value, value - half, value + half, half / 1.96, n, float(n))


def _comparison(dp: Estimate, dc: Estimate) -> Comparison:
    stub = PolicyOnTraffic("x", 1, 0, 0, 0, 0, 0, math.nan, {}, {}, {}, 0)
    return Comparison(stub, stub, dp, dc)


@pytest.mark.parametrize(
    "held_ok,dp,dc,promoted,by",
    [
        (True, _est(0.0, 0.02), _est(0.0, 1e-4), True, "held-out items and live traffic"),
        (True, _est(-0.06, 0.02), _est(0.0, 1e-4), False, "live traffic"),
        (True, _est(0.01, 0.02), _est(5e-4, 1e-4), False, "live traffic"),
        (False, _est(0.0, 0.02), _est(0.0, 1e-4), False, "held-out items"),
        (False, _est(-0.2, 0.02), _est(0.0, 1e-4), False, "held-out items and live traffic"),
        (True, _est(-0.2, 0.02, n=50), _est(0.0, 1e-4, n=50), True, "held-out items"),  # too little feedback
    ],
)
def test_live_evidence_joins_the_gate(held_ok, dp, dc, promoted, by) -> None:
    held = PromotionDecision(held_ok, "held-out says so", {"pass_rate": 0.9}, {"pass_rate": 0.9})
    out = with_live_evidence(held, _comparison(dp, dc), tolerance=0.01, min_feedback=200)
    assert (out.promoted, out.decided_by) == (promoted, by), out.reason
    assert out.live["pass_rate_diff"]["n"] == dp.n
    if dp.n < 200:
        assert "50 requests with feedback, 200 needed" in out.reason
    required = with_live_evidence(held, None, tolerance=0.01, min_feedback=200, require_live=True)
    assert not required.promoted


def test_decide_promotion_says_drift_or_no_champion_decided(pair) -> None:
    from routeopt.router_training.fit.data import routing_data

    champion, second = pair
    test = routing_data(synthetic_frame(3, 30))
    drift = decide_promotion(second, champion, test, tolerance=0.01, blocking=["x regressed"])
    assert not drift.promoted and drift.decided_by == "drift"
    first = decide_promotion(second, None, test, tolerance=0.01)
    assert first.promoted and first.reason == "no champion yet"


@pytest.fixture(scope="module")
def pair():
    champion = make_policy(0)
    return champion, replace(champion, quality_target=0.5)


@pytest.fixture(scope="module")
def replayed(pair, tmp_path_factory):
    """A registry (champion v1, worse candidate v2) and stores of its traffic in three modes."""
    folder = tmp_path_factory.mktemp("replay")
    fleet = tr.fleet_from_frame(synthetic_frame(7, n_items=300))
    registry = tr.publish_pair(folder, *pair)
    stores = {
        mode: tr.replay(registry, fleet, folder, mode=mode, seed=1, rate=0.2, reps=2)
        for mode in ("text", "shadow", "canary")
    }
    return registry, stores, fleet, folder


def test_the_gate_sees_a_worse_policy_on_live_traffic(pair, replayed) -> None:
    champion, second = pair
    _, stores, fleet, _ = replayed
    with Store(stores["text"], read_only=True) as store:
        live = live_comparison(load_traffic(store), second, 2, champion, 1)
    (true_new, _), (true_old, _) = tr.truth(second, fleet), tr.truth(champion, fleet)
    d = live.pass_rate_diff
    assert d.n == 600 and d.covers(true_new - true_old) and d.high < 0
    held = PromotionDecision(True, "not worse on held-out items")
    out = with_live_evidence(held, live, tolerance=0.01, min_feedback=200)
    assert not out.promoted and out.decided_by == "live traffic" and "lower than the champion" in out.reason


def test_rollout_evidence_for_shadow_and_canary(replayed) -> None:
    _, stores, _, _ = replayed
    for kind in ("shadow", "canary"):
        with Store(stores[kind], read_only=True) as store:
            frame = load_traffic(store)
        ok, why, detail = rollout_evidence(frame, 2, 1, kind, margin=0.01, min_feedback=10_000)
        assert not ok and "10000 needed" in why
        ok, why, detail = rollout_evidence(frame, 2, 1, kind, margin=0.01, min_feedback=50)
        assert not ok and detail and "not shown to be within 0.01" in why  # the candidate is worse
        ok, why, _ = rollout_evidence(frame, 2, 1, kind, margin=1.0, min_feedback=50)
        assert ok and "within 1 of the champion" in why, why
    with Store(stores["canary"], read_only=True) as store:
        frame = load_traffic(store)
    arms = canary_arms(frame, 2)
    assert 0.1 < arms.candidate.n / (arms.candidate.n + arms.champion.n) < 0.3  # canary share 0.2
    assert arms.difference.value < 0


def _trust(registry: Path) -> tuple[str, str]:
    """The CLI option that trusts the replay registry's public key."""
    return "--public-key", str(tr.registry_keys(registry) / "public_key.pem")


def test_cli_import_evaluate_and_promote_with_a_shadow_requirement(pair, replayed, tmp_path) -> None:
    registry, _, _, folder = replayed
    db = tmp_path / "db.duckdb"
    log = folder / "log-shadow-1"
    out = _run("import", "decisions", str(log), "--db", str(db))
    assert "600 new decisions" in out
    assert "0 new decisions" in _run("import", "decisions", str(log), "--db", str(db))
    fb = folder / "feedback-shadow-1.jsonl"
    out = _run("import", "feedback", str(fb), "--db", str(db), "--source", "truth")
    assert "600 feedback rows" in out and "600 match a logged decision" in out
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,passed\nx,true\ny,perhaps\n")
    assert f"{bad}:3: column 'passed'" in _run("import", "feedback", str(bad), "--db", str(db), ok=False)
    report = json.loads(
        _run(
            "policies", "evaluate", "--registry", str(registry), "--db", str(db), "--json", *_trust(registry)
        )
    )
    champion, candidate = report["policies"]
    assert (champion["version"], candidate["version"]) == (1, 2)
    assert candidate["basis"] == {"shadow": 600} and champion["basis"] == {"logged": 600}
    assert report["differences"]["candidate - champion"]["pass_rate_diff"]["value"] < 0
    table = _run(
        "policies", "evaluate", "1", "2", "--registry", str(registry), "--db", str(db), *_trust(registry)
    )
    assert "version 2 - version 1: pass rate" in table and "600 logged requests, 600 with feedback" in table
    from_log = json.loads(
        _run(
            "policies",
            "evaluate",
            "2",
            "--registry",
            str(registry),
            "--log",
            str(log),
            "--db",
            str(db),
            "--json",
            *_trust(registry),
        )
    )
    assert from_log["policies"][0]["pass_rate"] == candidate["pass_rate"]
    own = json.loads(
        _run(
            "policies",
            "evaluate",
            "2",
            "--quality-target",
            "0.5",
            "--registry",
            str(registry),
            "--db",
            str(db),
            "--json",
            *_trust(registry),
        )
    )["policies"][0]
    assert own["pass_rate"] == candidate["pass_rate"] and own["label"] == "version 2 @ 0.5"
    other = json.loads(
        _run(
            "policies",
            "evaluate",
            "2",
            "--quality-target",
            "0.9",
            "--registry",
            str(registry),
            "--db",
            str(db),
            "--json",
            *_trust(registry),
        )
    )["policies"][0]
    assert other["n_evaluated"] == 0 and other["n_unknown"] == 600  # shadowed at 0.5, and no text
    refused = _run(
        "policies",
        "promote",
        "2",
        "--registry",
        str(registry),
        "--require",
        "shadow",
        "--db",
        str(db),
        "--min-feedback",
        "100",
        ok=False,
    )
    assert "not promoted: shadow:" in refused and "not shown to be within 0.01" in refused
    assert "champion -> version 1" not in refused
    too_few = _run(
        "policies",
        "promote",
        "2",
        "--registry",
        str(registry),
        "--require",
        "canary",
        "--db",
        str(db),
        ok=False,
    )
    assert "0 requests with feedback, 200 needed" in too_few


def test_cli_promote_accepts_a_shadow_that_is_not_worse(pair, tmp_path) -> None:
    champion, _ = pair
    twin = replace(champion, quality_target=champion.quality_target)  # same choices, new version
    fleet = tr.fleet_from_frame(synthetic_frame(9, n_items=150))
    registry = tr.publish_pair(tmp_path, champion, twin)
    store = tr.replay(registry, fleet, tmp_path, mode="shadow", seed=2, rate=0.2)
    out = _run(
        "policies",
        "promote",
        "2",
        "--registry",
        str(registry),
        "--require",
        "shadow",
        "--db",
        str(store),
        "--min-feedback",
        "100",
        "--signing-key",
        str(tr.registry_keys(registry) / "signing_key.pem"),
    )
    assert "shadow: shadowed beside the champion on 150 requests" in out and "champion -> version 2" in out


def test_the_dashboard_shows_champion_and_candidate_on_live_traffic(replayed, tmp_path) -> None:
    import shutil

    from routeopt.reports.dashboard import build_report, gather

    _, stores, _, _ = replayed
    for mode in ("shadow", "canary"):
        db = tmp_path / f"{mode}.duckdb"
        shutil.copy(stores[mode], db)
        with Store(db) as store:
            store.begin_run("run-1")
            store.finish_run("run-1")
            live = gather(store, "run-1").live
            html = build_report(store, "run-1", tmp_path / f"{mode}.html").read_text()
        assert [p["version"] for p in live["policies"]] == [1, 2] and live["logged"] == 600
        assert live["difference"]["pass_rate_diff"]["n"] == 600
        assert (
            "Live traffic: champion vs candidate" in html
            and "Candidate minus champion, paired on 600" in html
        )
        assert ("Canary arms" in html) is (mode == "canary")
    with Store(tmp_path / "empty.duckdb") as store:
        store.begin_run("run-2")
        assert gather(store, "run-2").live is None


def test_the_nightly_imports_the_decision_logs(tmp_path, replayed) -> None:
    from routeopt.evals.config import load_config
    from routeopt.flows.nightly import import_traffic

    _, _, _, folder = replayed
    cfg = load_config(REPO_CONFIG).model_copy()
    with Store(tmp_path / "db.duckdb") as store:
        assert import_traffic(cfg, store) is None  # no traffic.log_dir: nothing to do
        cfg = cfg.model_copy(
            update={"traffic": cfg.traffic.model_copy(update={"log_dir": folder / "log-shadow-1"})}
        )
        assert import_traffic(cfg, store)["new"] == 600
        assert import_traffic(cfg, store)["new"] == 0
        missing = cfg.model_copy(
            update={"traffic": cfg.traffic.model_copy(update={"log_dir": tmp_path / "nope"})}
        )
        assert "does not exist" in import_traffic(missing, store)["error"]
        bad = tmp_path / "bad"
        write_log(bad / "x.jsonl", [decision("r", propensity=2.0)])
        broken = cfg.model_copy(update={"traffic": cfg.traffic.model_copy(update={"log_dir": bad})})
        assert "must lie in (0, 1]" in import_traffic(broken, store)["error"]
