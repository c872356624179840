"""Router quality benchmark: what the quality knob realises on requests it has never seen.

    routeopt bench router --sets ../shared/data --plot curves.png
    routeopt bench router --train a/train.parquet --test a/test.parquet [--train b/... --test b/...]

For each set the policy is trained as `routeopt train` trains it (the caller passes the frame
`routeopt import outcomes` would store), then routed at every user target as `routeopt route
--quality-target x` routes, and the chosen candidates are scored against the test outcomes.
Beside it: the plain reference (`baselines.ReferenceRouter`, its own knob), the zero router
(cost-weighted mixes of single candidates), the best single candidate and the oracle.

S100 / S95: 1 - cost to reach the best single's test pass rate (95% of it) on the hull of a
router's realised points, over the best single's cost; AIQ: mean pass rate on that hull over
the single candidates' cost range (routeopt.router_training.evaluation.metrics). `zero_router` mixes the singles
on the test hull (RouterBench's definition, which picks its mixes with the test outcomes);
`zero_router_train` mixes those on the training split's hull, as a user could.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from routeopt.router_training.evaluation import metrics as M
from routeopt.router_training.evaluation.baselines import Curve, ReferenceRouter, outcomes_of, summarise
from routeopt.router_training.fit.data import RoutingData, routing_data
from routeopt.router_training.fit.knob_fitting import STANDARD_TARGETS
from routeopt.router_training.policy.knob import request_unit
from routeopt.router_training.policy.routing import RoutingPolicy

# target -> how far below its floor the knob's held-out pass rate may land before a check fails
CHECKED = {1.0: 0.01, 0.95: 0.015, 0.9: 0.015, 0.8: 0.015}


def read_frame(path: Path) -> pd.DataFrame:
    """An outcome file in long format, by extension."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return pd.read_parquet(path)
    if suffix == ".csv":
        return pd.read_csv(path)
    if suffix in (".jsonl", ".ndjson", ".json"):
        return pd.read_json(path, lines=True)
    raise ValueError(f"{path}: unknown format {suffix!r}; use .parquet, .csv or .jsonl")


def find_sets(folder: Path) -> list[tuple[str, Path, Path]]:
    """(name, train, test) for every sub-folder holding train.parquet and test.parquet."""
    found = sorted(
        (d.name, d / "train.parquet", d / "test.parquet")
        for d in Path(folder).iterdir()
        if (d / "train.parquet").is_file() and (d / "test.parquet").is_file()
    )
    if not found:
        raise ValueError(f"{folder}: no sub-folder holds both train.parquet and test.parquet")
    return found


def scoring_data(frame: pd.DataFrame, candidates: list[str]) -> RoutingData:
    """Complete test requests, scored by `score` where the file has it (fractions count)."""
    if "score" in frame and "passed" in frame:
        frame = frame.drop(columns=["passed"])
    return routing_data(frame, candidates=candidates).complete()


def knob_choices(
    policy: RoutingPolicy, test: RoutingData, targets: tuple[float, ...] = STANDARD_TARGETS
) -> list[np.ndarray]:
    """The candidate index the policy chooses for every test request at every target, exactly
    as `routeopt route --quality-target x` chooses it (features computed once)."""
    P, Cp = policy.predict(test.prompts, test.suites)
    return [policy.select(P, Cp, test.prompts, test.suites, x)[0] for x in targets]


def measure(
    choices: list[np.ndarray],
    test: RoutingData,
    train: RoutingData,
    reference: ReferenceRouter | None = None,
    targets: tuple[float, ...] = STANDARD_TARGETS,
    knob: dict | None = None,
    best_on: str = "train",
) -> dict:
    """Score the knob's choices at each target (and every baseline) on complete test requests.

    The best single candidate is the one with the best pass rate on `train` (what a user picks
    without test data), or on the test requests themselves (`best_on="test"`: a shifted test
    set, where the floor is the best a user could have had on that traffic); its test pass rate
    is the floor's reference. JSON-ready.
    """
    names = test.candidates
    sq, sc = np.array([outcomes_of(np.full(len(test), j), test) for j in range(len(names))]).T
    rate = sq if best_on == "test" else np.nanmean(train.align(names).Y, axis=0)
    best = int(np.nanargmax(np.nan_to_num(rate, nan=-1.0)))
    points = np.array([outcomes_of(c, test) for c in choices])  # (targets, 2): pass, cost
    curves = {"knob": Curve("knob", points[:, 1], points[:, 0])}
    ref_pts = None
    if reference is not None:
        ref_pts = np.array(
            [outcomes_of(reference.choose(test.prompts, test.suites, x), test) for x in targets]
        )
        curves["reference"] = Curve("reference", ref_pts[:, 1], ref_pts[:, 0])
    oracle = outcomes_of(M.oracle_choice(test.Y, test.C), test)
    curves["zero_router"] = Curve("zero_router", sc, sq)
    chosen = _train_hull(train.align(names))
    curves["zero_router_train"] = Curve("zero_router_train", sc[chosen], sq[chosen])
    curves["best_single"] = Curve("best_single", sc[best : best + 1], sq[best : best + 1])
    curves["oracle"] = Curve("oracle", np.array([oracle[1]]), np.array([oracle[0]]))
    cost_range = (float(sc.min()), float(sc.max()))
    rows = {k: summarise(c, sq[best], sc[best], cost_range) for k, c in curves.items()}
    knob = dict(knob or {})
    certified_up_to = knob.get("certified_up_to", math.inf)
    table = []
    for i, x in enumerate(targets):
        q, c = points[i]
        row = {
            "target": x,
            "floor": x * sq[best],
            "pass_rate": q,
            "cost": c,
            "cost_vs_best": c / sc[best],
            "certified": bool(x <= certified_up_to + 1e-12),
            "held": bool(q >= x * sq[best] - 1e-12),
        }
        if ref_pts is not None:
            row.update(reference_pass_rate=ref_pts[i, 0], reference_cost_vs_best=ref_pts[i, 1] / sc[best])
        table.append(row)
    return {
        "n_test_requests": len(test),
        "best_single": {"model": names[best], "pass_rate": sq[best], "cost": sc[best]},
        "oracle": {"pass_rate": oracle[0], "cost": oracle[1]},
        "per_candidate": {m: {"pass_rate": float(q), "cost": float(c)} for m, q, c in zip(names, sq, sc)},
        "targets": table,
        "table": rows,
        "checks": checks(table, rows),
        "curves": {k: {"cost": c.costs.tolist(), "quality": c.quality.tolist()} for k, c in curves.items()},
        "knob": knob,
    }


def _train_hull(train: RoutingData) -> np.ndarray:
    """The single candidates on the training split's cost-quality hull: the zero router a user
    can actually build (the usual zero router picks its mixes on the test outcomes)."""
    from routeopt.router_training.fit.knob_fitting import hull_vertices

    q, c = np.nanmean(train.Y, axis=0), np.nanmean(train.C, axis=0)
    ok = np.flatnonzero(np.isfinite(q) & np.isfinite(c))
    return ok[hull_vertices(c[ok], q[ok])]


def knob_info(policy: RoutingPolicy) -> dict:
    return {
        "confidence": policy.knob.confidence,
        "certified_up_to": policy.knob.certified_up_to(),
        "reference_model": policy.reference_model,
    }


def checks(table: list[dict], rows: dict) -> dict[str, bool]:
    """The bench's pass/fail checks for one set: the knob's pass rate at the checked targets
    against their floors, its AIQ against the zero router's and the reference router's."""
    out = {}
    for r in table:
        tol = CHECKED.get(round(r["target"], 6))
        if tol is not None:
            out[f"pass@{r['target']:g} >= floor - {tol:g}"] = bool(r["pass_rate"] >= r["floor"] - tol - 1e-12)
    knob = rows["knob"]
    out["AIQ >= zero router"] = bool(knob["aiq"] >= rows["zero_router"]["aiq"] - 1e-12)
    if "reference" in rows:
        ref = rows["reference"]
        out["AIQ >= reference - 0.005"] = bool(knob["aiq"] >= ref["aiq"] - 0.005)
        s95, r95 = _savings(knob["savings_at_95"]), _savings(ref["savings_at_95"])
        out["S95 >= reference - 0.02"] = bool(s95 >= r95 - 0.02)
    return out


def _savings(v: float) -> float:
    """Savings for comparisons: 'never reaches it' (NaN) counts as no savings at all."""
    return -math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def run_set(
    name: str,
    train_frame: pd.DataFrame,
    test_frame: pd.DataFrame,
    train: Callable[[pd.DataFrame], RoutingPolicy],
    with_reference: bool = True,
) -> dict:
    """Train with the caller's `routeopt train` equivalent, route every test request at every
    user target and measure it, beside the reference trained on the same frame."""
    policy = train(train_frame)
    train_data = routing_data(train_frame, candidates=policy.candidates)
    test = scoring_data(test_frame, policy.candidates)
    reference = ReferenceRouter().fit(train_data) if with_reference else None
    choices = knob_choices(policy, test)
    report = measure(choices, test, train_data, reference, knob=knob_info(policy))
    report["name"] = name
    if test.latency:
        for row, pick in zip(report["targets"], choices):
            row.update(_p95s(test, pick))
        if policy.latency is not None:
            report["budgets"] = budget_rows(policy, test, report["best_single"]["cost"])
    return report


def _p95s(test: RoutingData, pick: np.ndarray) -> dict[str, float]:
    """The p95 of the measured seconds of the chosen candidates, per kind the test set measured."""
    rows = np.arange(len(test))
    out = {}
    for kind, seconds in test.latency.items():
        chosen = seconds[rows, pick]
        chosen = chosen[~np.isnan(chosen)]
        out[f"{kind}_p95_s"] = float(np.quantile(chosen, 0.95)) if len(chosen) else math.nan
    return out


def budget_outcomes(
    policy: RoutingPolicy,
    data: RoutingData,
    targets: tuple[float, ...],
    budgets: Callable[[str], list[float]] | None = None,
) -> Iterator[tuple[str, float, float, bool, float, float, np.ndarray]]:
    """Per kind the policy models and `data` measured, each budget (`budgets(kind)`, default every
    certified one) and target: (kind, budget, target, certified, pass rate, cost, the measured
    seconds of the chosen candidates) on the (complete) requests of `data`."""
    assert policy.latency is not None
    lat = policy.latency
    P, Cp = policy.predict(data.prompts, data.suites)
    rows_idx = np.arange(len(data))
    units = lambda i: request_unit(data.prompts[i], data.suites[i])  # noqa: E731
    for kind in lat.model.kinds:
        if kind not in data.latency:
            continue
        pred = policy.predict_latency(kind, data.prompts, data.suites)
        for budget in (budgets or lat.budgets)(kind):
            tier = lat.tier_for(kind, budget)
            for x in targets:
                pick = policy._budget_choice(kind, budget, P, Cp, pred, units, x)[0]
                q, c = outcomes_of(pick, data)
                seconds = data.latency[kind][rows_idx, pick]
                certified = tier is not None and x <= tier.knob.certified_up_to() + 1e-12
                yield kind, budget, x, bool(certified), q, c, seconds[~np.isnan(seconds)]


BUDGET_TARGETS = (0.8, 0.9, 0.95)


def budget_rows(policy: RoutingPolicy, test: RoutingData, best_cost: float, per_kind: int = 4) -> list[dict]:
    """The three-way trade-off under budgets: for a spread of the policy's certified budgets
    per kind and a few targets, the pass rate, cost, measured p95 and over-budget share of the
    choices on the test requests, and whether the (target, budget) pair was certified."""
    assert policy.latency is not None
    lat = policy.latency

    def spread(kind: str) -> list[float]:
        budgets = lat.budgets(kind)
        if not budgets:
            return []
        return sorted(
            {budgets[round(i * (len(budgets) - 1) / max(per_kind - 1, 1))] for i in range(per_kind)}
        )

    return [
        {
            "kind": kind,
            "budget_s": budget,
            "target": x,
            "certified": certified,
            "pass_rate": q,
            "cost_vs_best": c / best_cost,
            "p95_s": float(np.quantile(measured, 0.95)) if len(measured) else math.nan,
            "over_budget": float(np.mean(measured > budget)) if len(measured) else math.nan,
        }
        for kind, budget, x, certified, q, c, measured in budget_outcomes(
            policy, test, BUDGET_TARGETS, spread
        )
    ]


def _fmt(v: object, spec: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "never"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def _grid(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
    )
    return [line(head), line(["-" * w for w in widths]), *map(line, rows)]


def format_set(report: dict) -> str:
    """One set: the knob at every target, then S100 / S95 / AIQ of the knob and the baselines."""
    best, oracle, knob = report["best_single"], report["oracle"], report.get("knob", {})
    head = ["target", "floor", "knob pass", "cost/best", "certified", "held"]
    has_ref = "reference_pass_rate" in report["targets"][0]
    if has_ref:
        head += ["ref pass", "ref cost/best"]
    timed = [k for k in ("ttft", "latency") if f"{k}_p95_s" in report["targets"][0]]
    head += [f"{k} p95 s" for k in timed]
    rows = []
    for r in report["targets"]:
        row = [
            f"{r['target']:g}",
            _fmt(r["floor"]),
            _fmt(r["pass_rate"]),
            _fmt(r["cost_vs_best"]),
            _fmt(r["certified"]),
            _fmt(r["held"]) if r["certified"] else "-",
        ]
        if has_ref:
            row += [_fmt(r["reference_pass_rate"]), _fmt(r["reference_cost_vs_best"])]
        row += [_fmt(r[f"{k}_p95_s"], ".3g") for k in timed]
        rows.append(row)
    frontier = [
        [name, _fmt(v["savings_at_best"]), _fmt(v["savings_at_95"]), _fmt(v["aiq"]), _fmt(v["max_quality"])]
        for name, v in report["table"].items()
    ]
    promised = [r for r in report["targets"] if r["certified"]]
    lines = [
        f"== {report.get('name', 'set')}: {report['n_test_requests']} test requests; best single "
        f"{best['model']} pass {best['pass_rate']:.3f} at ${best['cost']:.6f}/request; oracle "
        f"{oracle['pass_rate']:.3f} at ${oracle['cost']:.6f}",
        f"knob: confidence {_fmt(knob.get('confidence'), '.2f')}, certified up to target "
        f"{_fmt(knob.get('certified_up_to'), '.3f')}; promise (pass >= target x best single) held at "
        f"{sum(r['held'] for r in promised)} of {len(promised)} certified targets",
        *_grid(head, rows),
        "",
        *_grid(["policy", "S100", "S95", "AIQ", "max pass"], frontier),
        "",
        "checks: " + "; ".join(f"{k}: {_fmt(v)}" for k, v in report["checks"].items()),
    ]
    if report.get("budgets"):
        budget_head = ["budget", "target", "certified", "pass", "cost/best", "p95 s", "over budget"]
        budget_grid = [
            [
                f"{b['kind']} {b['budget_s']:g} s",
                f"{b['target']:g}",
                _fmt(b["certified"]),
                _fmt(b["pass_rate"]),
                _fmt(b["cost_vs_best"]),
                _fmt(b["p95_s"], ".3g"),
                _fmt(b["over_budget"]),
            ]
            for b in report["budgets"]
        ]
        lines += [
            "",
            "latency budgets (p95 of the served calls, share over the budget):",
            *_grid(budget_head, budget_grid),
        ]
    return "\n".join(lines)


def format_summary(reports: list[dict]) -> str:
    """Across sets: S100 / S95 / AIQ of knob, reference and zero router, promise and checks."""
    head = ["set", "knob S100/S95/AIQ", "reference S100/S95/AIQ", "zero AIQ", "promise held", "checks passed"]
    rows = []
    for r in reports:
        t = r["table"]
        trio = lambda v: f"{_fmt(v['savings_at_best'])} / {_fmt(v['savings_at_95'])} / {_fmt(v['aiq'])}"
        promised = [x for x in r["targets"] if x["certified"]]
        rows.append(
            [
                r.get("name", "set"),
                trio(t["knob"]),
                trio(t["reference"]) if "reference" in t else "-",
                _fmt(t["zero_router"]["aiq"]),
                f"{sum(x['held'] for x in promised)}/{len(promised)}",
                f"{sum(r['checks'].values())}/{len(r['checks'])}",
            ]
        )
    held = sum(sum(x["held"] for x in r["targets"] if x["certified"]) for r in reports)
    promised = sum(sum(1 for x in r["targets"] if x["certified"]) for r in reports)
    return "\n".join(
        [
            "== summary across sets",
            *_grid(head, rows),
            "",
            f"promise held at {held} of {promised} certified (set, target) pairs",
        ]
    )


def plot_sets(reports: list[dict], path: Path) -> None:
    """One panel per set: knob points, reference points, single candidates, zero router, oracle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(reports)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 5), squeeze=False)
    for ax, report in zip(axes[0], reports):
        _plot_one(ax, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _plot_one(ax, report: dict) -> None:
    from matplotlib.ticker import NullFormatter

    curves = report["curves"]
    for name, style in (("knob", "o-"), ("reference", "s--")):
        if name in curves:
            c, q = M.frontier(curves[name]["cost"], curves[name]["quality"])
            ax.plot(c, q, style, label=f"{name} (hull of its points at the targets)", markersize=4)
            ax.scatter(curves[name]["cost"], curves[name]["quality"], s=10, alpha=0.5)
    zc, zq = M.frontier(curves["zero_router"]["cost"], curves["zero_router"]["quality"])
    ax.plot(zc, zq, ":", color="grey", label="zero router")
    singles = report["per_candidate"]
    ax.scatter(
        [v["cost"] for v in singles.values()],
        [v["pass_rate"] for v in singles.values()],
        s=14,
        color="grey",
        label="single candidates",
    )
    ax.scatter([report["oracle"]["cost"]], [report["oracle"]["pass_rate"]], marker="*", s=120, label="oracle")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on narrow ranges
    ax.set_xlabel("mean cost per request (USD, log scale)")
    ax.set_ylabel("pass rate")
    ax.set_title(f"{report.get('name', 'set')}: {report['n_test_requests']} test requests")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
