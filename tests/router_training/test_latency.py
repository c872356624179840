"""Latency budgets: the model learned from measured seconds, certified tiers, the decision under a
budget, format 4 on disk and its conformance vectors."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from routeopt.router_training.fit.knob_fitting import Calibration
from routeopt.router_training.fit.latency_fitting import (
    MIN_ROWS,
    budget_knob,
    fit_quantile_model,
    mask_scale,
    open_scale,
)
from routeopt.router_training.policy.knob import Member, choose, member_choice
from routeopt.router_training.policy.latency import BudgetTier, budget_mask
from routeopt.router_training.policy.routing import RoutingPolicy
from routeopt.router_training.train import train_router
from tests.router_training.conftest import timed_frame


@pytest.fixture(scope="module")
def timed() -> pd.DataFrame:
    return timed_frame()


@pytest.fixture(scope="module")
def trained_timed(timed):
    return train_router(timed, quality_target=0.9, seed=0)


def test_the_mask_allows_what_meets_the_budget_and_else_the_fastest() -> None:
    pred = np.array([[0.5, 1.5, 0.9], [2.0, 3.0, 2.0]])
    assert budget_mask(pred, 1.0).tolist() == [[True, False, True], [True, False, False]]
    assert budget_mask(pred, -math.inf).tolist() == [[True, False, False], [True, False, False]]


def test_members_choose_among_the_allowed_candidates_only() -> None:
    p = np.array([[0.9, 0.5, 0.7]])
    c = np.array([[3.0, 1.0, 2.0]])
    allowed = np.array([[False, True, True]])
    assert member_choice(Member("single", 0), p, c, allowed).tolist() == [2]  # lambda 0 among the allowed
    assert member_choice(Member("single", 1), p, c, allowed).tolist() == [1]
    assert member_choice(Member("lambda", 0.0), p, c, allowed).tolist() == [2]
    assert member_choice(Member("lambda", 0.0), p, c).tolist() == [0]
    assert choose(p, c, "threshold", 0.8, allowed)[0].tolist() == [2, 1, 0]
    assert choose(p, c, "lambda", 0.0, allowed)[0].tolist() == [2, 1, 0]


def _slack(over_rate: float, n: int = 3000, slow: float = 1.1) -> tuple[Calibration, np.ndarray, np.ndarray]:
    """A fast, cheap candidate that passes half the time and a slow, dear one that passes 90% of
    the time, predicted a little over a 1 s budget (`slow` seconds) and over it on `over_rate`
    of requests."""
    rng = np.random.default_rng(3)
    P = np.tile([0.5, 0.9], (n, 1))
    Y = (rng.random((n, 2)) < P).astype(float)
    C = np.tile([1.0, 10.0], (n, 1))
    pred = np.tile([0.5, slow], (n, 1))
    pred[0, 1] = slow * 1.5  # one request the slow candidate is predicted slower on still
    over = np.stack([np.zeros(n), (rng.random(n) < over_rate).astype(float)], 1)
    return Calibration(P, C, Y, C), pred, over


@pytest.mark.parametrize("over_rate, scale", [(0.03, 1.25), (0.6, 1.0)])
def test_a_tiers_mask_reaches_past_its_budget_only_where_the_violations_allow(over_rate, scale) -> None:
    cal, pred, over = _slack(over_rate)
    chosen = mask_scale(cal, 1, pred, 1.0, over, 0.9, 0.1, target=0.9, margin=0.5)
    assert mask_scale(cal, 1, pred, 1.0, over, 0.9, 0.1, target=0.9, margin=math.inf) == 1.0
    assert chosen == scale
    knob, _ = budget_knob(cal, 1, budget_mask(pred, 1.0 * chosen), over, 0.9, 0.1)
    assert knob.certified_up_to() >= 0.9 if scale > 1 else knob.certified_up_to() < 0.9


@pytest.mark.parametrize("over_rate, open_", [(0.03, True), (0.6, False)])
def test_a_tiers_mask_opens_to_every_candidate_only_where_the_violations_allow(over_rate, open_) -> None:
    """Predicted at 3x the budget, the slow candidate is past every fixed scale: only the open
    mask (every candidate on every calibration request) lets the knob reach the target, and
    only where its measured violations keep alpha."""
    cal, pred, over = _slack(over_rate, slow=3.0)
    widest = open_scale(pred, 1.0)
    assert widest == 4.5 and budget_mask(pred, widest).all()
    chosen = mask_scale(cal, 1, pred, 1.0, over, 0.9, 0.1, target=0.9, margin=0.5, open_mask=True)
    assert chosen == (widest if open_ else 1.0)
    assert mask_scale(cal, 1, pred, 1.0, over, 0.9, 0.1, target=0.9, margin=0.5) == 1.0  # off by default
    knob, _ = budget_knob(cal, 1, budget_mask(pred, chosen), over, 0.9, 0.1)
    assert knob.certified_up_to() >= 0.9 if open_ else knob.certified_up_to() < 0.9


def test_a_tiers_mask_s_is_read_checked_and_decides(trained_timed, timed) -> None:
    import dataclasses

    policy = trained_timed.policy
    tier = policy.latency.tiers[0]
    raw = tier.to_dict()
    assert raw["mask_s"] >= raw["budget_s"]
    del raw["mask_s"]  # a tier written before masks had their own seconds: its budget's
    assert BudgetTier.from_dict(raw).mask_s == tier.budget_s
    with pytest.raises(ValueError, match="mask_s"):
        BudgetTier.from_dict({**raw, "mask_s": -1.0})
    # a mask of no seconds allows only the candidate predicted fastest, whatever the budget
    narrow = dataclasses.replace(tier, mask_s=1e-9)
    policy.latency.tiers = [narrow if t is tier else t for t in policy.latency.tiers]
    policy.latency.__post_init__()
    try:
        row = timed.drop_duplicates("request_id").iloc[0]
        d = policy.decide(row["prompt"], row["suite"], 0.9, **{f"{tier.kind}_budget_s": tier.budget_s})
        assert d.budget.tier_s == tier.budget_s
        assert d.model == min(d.budget.predicted_s, key=d.budget.predicted_s.get)
    finally:
        policy.latency.tiers = [tier if t is narrow else t for t in policy.latency.tiers]
        policy.latency.__post_init__()


def test_quantile_models_learn_each_candidates_spread_and_length() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    chars = rng.integers(100, 5000, n)
    suite = rng.integers(0, 2, n)
    seconds = np.stack(
        [0.2 + 0.1 * chars / 1000 + 0.3 * suite + rng.exponential(0.1, n), np.full(n, np.nan)], 1
    )
    seconds[: MIN_ROWS * 2, 1] = 1.0
    m50 = fit_quantile_model(chars, suite, seconds, 2, "p50")
    m95 = fit_quantile_model(chars, suite, seconds, 2, "p95")
    pred50, pred95 = m50.predict(chars, suite)[:, 0], m95.predict(chars, suite)[:, 0]
    truth = seconds[:, 0]
    assert abs(np.mean(truth <= pred50) - 0.5) < 0.03
    assert abs(np.mean(truth <= pred95) - 0.95) < 0.02
    assert 0.07 < m50.coef[1, 0] < 0.13  # the per-kchar slope
    assert m95.predict(np.array([1000]), np.array([1]))[0, 1] == pytest.approx(1.0)  # only what was measured


def test_budgets_are_certified_and_held_on_held_out_requests(trained_timed) -> None:
    policy, metrics = trained_timed.policy, trained_timed.metrics
    lat = policy.latency
    assert lat is not None and lat.alpha == 0.1
    assert set(lat.model.kinds) == {"ttft", "latency"}
    assert lat.budgets("ttft"), metrics["latency"]
    assert metrics["latency"]["budgets"]["ttft"] == lat.budgets("ttft")
    report = metrics["holdout"]["latency"]
    assert report["promised"] > 0
    for row in report["rows"]:
        if row["certified"]:
            assert row["over_budget"] <= 0.1 + 1e-9 or not row["held"]
    assert report["held"] >= report["promised"] - 1  # a few hundred requests: at most one miss


def test_a_budget_keeps_the_slow_candidate_out_and_says_whether_it_was_met(trained_timed, timed) -> None:
    policy = trained_timed.policy
    prompts = timed.drop_duplicates("request_id")
    budget = next(b for b in policy.latency.budgets("ttft") if b >= 0.9)
    chosen = set()
    for prompt, suite in zip(prompts["prompt"][:120], prompts["suite"][:120]):
        d = policy.decide(prompt, suite, 0.9, ttft_budget_s=budget)
        assert d.budget is not None and d.budget.tier_s is not None and d.budget.tier_s <= budget
        assert d.budget.met == (d.budget.predicted_s[d.model] <= budget)
        assert d.budget.predicted_s["tiny"] > budget  # the cheap one starts too slowly
        chosen.add(d.model)
        free = policy.decide(prompt, suite, 0.9)
        assert free.budget is None
    assert "tiny" not in chosen
    low = policy.decide(prompts["prompt"].iloc[0], prompts["suite"].iloc[0], ttft_budget_s=0.01)
    assert low.budget.tier_s is None and not low.budget.met
    assert low.model == min(low.budget.predicted_s, key=low.budget.predicted_s.get)


def test_without_a_budget_the_latency_columns_change_nothing(trained_timed, timed) -> None:
    plain = train_router(timed.drop(columns=["ttft_s", "latency_s"]), quality_target=0.9, seed=0).policy
    timed_policy = trained_timed.policy
    assert plain.latency is None
    assert plain.knob.to_dict() == timed_policy.knob.to_dict()
    prompts = timed.drop_duplicates("request_id")
    a = plain.decide_batch(prompts["prompt"].tolist(), prompts["suite"].tolist())
    b = timed_policy.decide_batch(prompts["prompt"].tolist(), prompts["suite"].tolist())
    assert [d.model for d in a] == [d.model for d in b]


def test_batch_and_one_request_decisions_agree_under_a_budget(trained_timed, timed) -> None:
    policy = trained_timed.policy
    prompts = timed.drop_duplicates("request_id").head(60)
    budget = policy.latency.budgets("latency")[len(policy.latency.budgets("latency")) // 2]
    batch = policy.decide_batch(
        prompts["prompt"].tolist(), prompts["suite"].tolist(), latency_budget_s=budget
    )
    for d, (prompt, suite) in zip(batch, zip(prompts["prompt"], prompts["suite"])):
        one = policy.decide(prompt, suite, latency_budget_s=budget)
        assert (one.model, one.fallbacks, one.budget) == (d.model, d.fallbacks, d.budget)


def test_bad_budgets_are_clear_errors(trained_timed, trained) -> None:
    policy = trained_timed.policy
    with pytest.raises(ValueError, match="not both"):
        policy.decide("x", None, ttft_budget_s=1, latency_budget_s=2)
    with pytest.raises(ValueError, match="positive number of seconds"):
        policy.decide("x", None, ttft_budget_s=-1)
    with pytest.raises(ValueError, match="ttft_budget_s must be a number"):
        policy.decide("x", None, ttft_budget_s="fast")
    with pytest.raises(ValueError, match="no ttft model"):
        trained.policy.decide("x", None, ttft_budget_s=1.0)


def test_unmeasured_rows_are_left_out_and_counted() -> None:
    frame = timed_frame(n_items=60, unmeasured=0.3)
    policy = train_router(frame, quality_target=0.9, seed=0, holdout_fraction=0).policy
    counts = policy.latency.metrics["measurements"]["ttft"]
    assert sum(counts["not_measured"]) > 0.2 * 180 * 4
    assert all(m + u == 180 for m, u in zip(counts["measured"], counts["not_measured"]))
    too_few = train_router(timed_frame(n_items=4), quality_target=0.9, holdout_fraction=0).policy
    assert too_few.latency is None
    assert "fewer than 20 measured" in too_few.metrics["latency"]["measurements"]["ttft"]["no_model"]


def test_format_4_round_trips_and_its_vectors_check_budgets(trained_timed, tmp_path) -> None:
    policy = trained_timed.policy
    policy.save(tmp_path / "p")
    head = json.loads((tmp_path / "p" / "policy.json").read_text())
    assert head["format_version"] == 4 and head["latency"]["alpha"] == 0.1
    back = RoutingPolicy.load(tmp_path / "p")
    report = back.self_check()
    assert report.ok, report.summary()
    assert "budget" in report.layers and "latency" in report.layers
    prompt = "Task: sort the input. difficulty: 2. Input: stone river apple"
    budget = policy.latency.budgets("ttft")[-1]
    assert back.decide(prompt, "sort", ttft_budget_s=budget) == policy.decide(
        prompt, "sort", ttft_budget_s=budget
    )


def test_a_policy_whose_vectors_disagree_under_a_budget_is_refused(trained_timed, tmp_path) -> None:
    policy = trained_timed.policy
    policy.save(tmp_path / "p")
    arrays = tmp_path / "p" / "arrays.safetensors"
    from routeopt.router_training.policy.tensors import dumps, loads

    tensors, meta = loads(arrays.read_bytes(), str(arrays))
    tensors = dict(tensors)
    tensors["latency.ttft.p95.floor"] = tensors["latency.ttft.p95.floor"] * 0 + 100.0  # every candidate slow
    arrays.write_bytes(dumps(tensors, meta))
    report = RoutingPolicy.load(tmp_path / "p").self_check()
    assert not report.ok and "latency" in (report.first or ""), report.summary()


def test_a_format_4_policy_without_its_section_names_it(trained_timed, tmp_path) -> None:
    trained_timed.policy.save(tmp_path / "p")
    path = tmp_path / "p" / "policy.json"
    head = json.loads(path.read_text())
    del head["latency"]
    path.write_text(json.dumps(head))
    with pytest.raises(ValueError, match="latency section"):
        RoutingPolicy.load(tmp_path / "p")


def test_vectors_naming_a_layer_this_runtime_lacks_are_refused(trained, tmp_path) -> None:
    from routeopt.router_training.policy.conformance import check_vectors
    from routeopt.router_training.policy.tensors import dumps, loads

    trained.policy.save(tmp_path / "p")
    blob = (tmp_path / "p" / "conformance.safetensors").read_bytes()
    tensors, meta = loads(blob, "v")
    m = json.loads(meta["routeopt"])
    m["layers"].append("teleport")
    report = check_vectors(trained.policy, dumps(dict(tensors), {"routeopt": json.dumps(m)}))
    assert not report.ok and "teleport" in report.first


def test_routeopt_route_takes_a_budget(trained_timed, trained, tmp_path) -> None:
    from click.testing import CliRunner

    from routeopt.flows.cli import cli

    trained_timed.policy.save(tmp_path / "timed")
    trained.policy.save(tmp_path / "plain")
    budget = trained_timed.policy.latency.budgets("ttft")[-1]
    prompt = "Task: add the input. difficulty: 3. Input: stone river apple"
    r = CliRunner().invoke(
        cli,
        [
            "route",
            "--allow-unsigned",
            "--policy",
            str(tmp_path / "timed"),
            "--suite",
            "add",
            "--ttft-budget",
            str(budget),
            prompt,
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    want = trained_timed.policy.decide(prompt, "add", ttft_budget_s=budget)
    assert out["model"] == want.model and out["budget"]["met"] == want.budget.met
    assert out["budget"]["tier_s"] == want.budget.tier_s
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps({"id": "a", "prompt": prompt, "suite": "add"}) + "\n")
    r = CliRunner().invoke(
        cli,
        [
            "route",
            "--allow-unsigned",
            "--policy",
            str(tmp_path / "timed"),
            "--input",
            str(requests),
            "--latency-budget",
            "0.001",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.splitlines()[0])["budget_met"] is False
    r = CliRunner().invoke(
        cli, ["route", "--allow-unsigned", "--policy", str(tmp_path / "plain"), "--ttft-budget", "1", prompt]
    )
    assert r.exit_code != 0 and "has no ttft model" in r.output
    r = CliRunner().invoke(
        cli,
        [
            "route",
            "--allow-unsigned",
            "--policy",
            str(tmp_path / "timed"),
            "--ttft-budget",
            "1",
            "--latency-budget",
            "2",
            prompt,
        ],
    )
    assert r.exit_code != 0 and "not both" in r.output


def test_the_live_layer_replays_a_slowdown_and_a_wrong_move_is_refused(trained_timed) -> None:
    from routeopt.router_training.policy.conformance import check_vectors, read_vectors
    from routeopt.router_training.policy.tensors import dumps, loads

    policy = trained_timed.policy
    from routeopt.router_training.policy.conformance import build_vectors

    blob = build_vectors(policy)
    _, meta, want = read_vectors(blob)
    moved = want["live.moved"].sum(axis=1).tolist()
    assert moved[0] == 0 and moved[-1] == 0 and max(moved) > 0, moved  # moved in the slowdown, back after
    assert check_vectors(policy, blob).ok
    tensors, raw = loads(blob, "v")
    tensors = dict(tensors)
    flipped = tensors["live.moved"].copy()
    flipped[0, 0] ^= 1
    tensors["live.moved"] = flipped
    report = check_vectors(policy, dumps(tensors, raw))
    assert not report.ok and "step live" in report.first, report.summary()


def test_bench_router_shows_pass_cost_and_latency_under_budgets(timed) -> None:
    from routeopt.router_training.evaluation.bench import format_set, run_set

    ids = sorted(timed["request_id"].unique())
    test_ids = set(ids[::4])
    train, test = timed[~timed["request_id"].isin(test_ids)], timed[timed["request_id"].isin(test_ids)]
    fit = lambda f: train_router(f, quality_target=0.9, seed=0).policy  # noqa: E731
    report = run_set("timed", train, test, fit, with_reference=False)
    assert {"ttft_p95_s", "latency_p95_s"} <= set(report["targets"][0])
    rows = report["budgets"]
    assert {r["kind"] for r in rows} == {"ttft", "latency"}
    for r in rows:
        assert 0 <= r["over_budget"] <= 1 and r["p95_s"] > 0
    text = format_set(report)
    assert "latency budgets" in text and "ttft p95 s" in text
    plain = run_set("plain", train.drop(columns=["ttft_s", "latency_s"]), test, fit, with_reference=False)
    assert "budgets" not in plain and "ttft_p95_s" in plain["targets"][0]  # the test set still measured it
    untimed = run_set(
        "untimed",
        train.drop(columns=["ttft_s", "latency_s"]),
        test.drop(columns=["ttft_s", "latency_s"]),
        fit,
        False,
    )
    assert "ttft_p95_s" not in untimed["targets"][0] and "latency budgets" not in format_set(untimed)


def test_default_budgets_by_suite_reach_routers_and_the_vectors(timed) -> None:
    from routeopt.evals.config import RouterSettings
    from routeopt.router_training.policy.conformance import build_vectors, check_vectors, read_vectors

    settings = RouterSettings(
        budgets={"*": {"ttft_s": 1.3}, "add": {"latency_s": 3.0}, "sort": {"ttft_s": 9}}
    )
    wanted = {suite: b.pair() for suite, b in settings.budgets.items()}
    result = train_router(timed, quality_target=0.9, seed=0, default_budgets=wanted)
    policy = result.policy
    assert policy.latency.defaults == wanted
    assert result.metrics["default_budgets"]["set"]["add"] == ["latency", 3.0]
    add = "Task: add the input. difficulty: 2. Input: stone river"
    assert policy.decide(add, "add").budget is None  # the plain decision of the spec has none
    assert policy.decide(add, "add", use_defaults=True).budget.kind == "latency"
    assert policy.decide(add, "reverse", use_defaults=True).budget.budget_s == 1.3  # "*"
    assert policy.decide(add, None, use_defaults=True).budget.budget_s == 1.3
    explicit = policy.decide(add, "add", ttft_budget_s=2.0, use_defaults=True).budget
    assert (explicit.kind, explicit.budget_s) == ("ttft", 2.0)  # what the request asks wins
    batch = policy.decide_batch([add, add, add], ["add", "reverse", None], use_defaults=True)
    assert [d.budget.kind for d in batch] == ["latency", "ttft", "ttft"]
    one = [policy.decide(add, s, use_defaults=True) for s in ("add", "reverse", None)]
    assert [(d.model, d.fallbacks) for d in batch] == [(d.model, d.fallbacks) for d in one]
    blob = build_vectors(policy)
    _, meta, _ = read_vectors(blob)
    assert [c[0] for c in meta["budgets"]].count("default") == 2
    assert check_vectors(policy, blob).ok
    with pytest.raises(ValueError, match="ttft_s or latency_s"):
        RouterSettings(budgets={"*": {"ttft_s": 1, "latency_s": 2}})
    left = train_router(
        timed.drop(columns=["latency_s"]), quality_target=0.9, default_budgets={"add": ("latency", 3.0)}
    )
    assert left.policy.latency.defaults == {} and "add" in left.metrics["default_budgets"]["left_out"]


@pytest.mark.parametrize(
    "defaults",
    [["ttft", 1.0], {"*": ["ttft", "1.3"]}, {"*": ["fast", 1.0]}, {"*": ["ttft"]}, {"*": ["ttft", True]}],
)
def test_bad_default_budgets_in_policy_json_name_the_field(trained_timed, tmp_path, defaults) -> None:
    trained_timed.policy.save(tmp_path / "p")
    path = tmp_path / "p" / "policy.json"
    head = json.loads(path.read_text())
    head["latency"]["defaults"] = defaults
    path.write_text(json.dumps(head))
    with pytest.raises(ValueError, match=r"latency\.defaults"):
        RoutingPolicy.load(tmp_path / "p")
