"""Router quality benchmark: train on one outcome file, measure router and baselines on another.

    routeopt bench router --train train.parquet --test test.parquet --plot curves.png
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd

from router_training.baselines import evaluate
from router_training.data import routing_data
from router_training.train import train_router

COLUMNS = (
    ("savings_at_best", "savings@best"), ("savings_at_95", "savings@95%"), ("aiq", "AIQ"),
    ("max_quality", "max pass"), ("apgr", "APGR"), ("cpt50", "CPT(50%)"), ("cpt80", "CPT(80%)"),
)


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


ESTIMATOR_ROWS = {"linear": "router", "lightgbm": "router_lgbm"}


def run_bench(train_path: Path, test_path: Path, quality_target: float = 0.95, seed: int = 0,
              embeddings: bool = False, estimator: str = "linear") -> dict:
    """Train on all of `train_path` (cross-fitted calibration) and evaluate on `test_path`.

    `estimator` is 'linear', 'lightgbm' or 'both'; the first is the 'router' row, a LightGBM
    router next to it is the 'router_lgbm' row.
    """
    names = list(ESTIMATOR_ROWS) if estimator == "both" else [estimator]
    if any(n not in ESTIMATOR_ROWS for n in names):
        raise ValueError(f"estimator must be one of {(*ESTIMATOR_ROWS, 'both')}, got {estimator!r}")
    train_frame, test_frame = read_frame(train_path), read_frame(test_path)
    policies, seconds = {}, {}
    for name in names:
        start = time.perf_counter()
        policies[name] = train_router(train_frame, quality_target=quality_target, holdout_fraction=0.0,
                                      seed=seed, embeddings=embeddings, estimator=name).policy
        seconds[name] = time.perf_counter() - start
    policy = policies[names[0]]
    train = routing_data(train_frame, candidates=policy.candidates)
    test = routing_data(test_frame, candidates=policy.candidates)
    others = {ESTIMATOR_ROWS[n]: policies[n] for n in names[1:]}
    report = evaluate(policy, train, test, others=others)
    report["train_seconds"] = seconds[names[0]]
    report["train_seconds_by_estimator"] = seconds
    report["rule"] = policy.rule
    report["rules_by_estimator"] = {n: p.rule for n, p in policies.items()}
    if names[0] != "linear":
        report["table"] = {ESTIMATOR_ROWS[names[0]] if k == "router" else k: v
                           for k, v in report["table"].items()}
    report["train_rows"] = len(train_frame)
    return report


def _fmt(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _fmt_seconds(report: dict) -> str:
    by = report.get("train_seconds_by_estimator")
    if not by:
        return f"{report.get('train_seconds', 0):.1f}s"
    return ", ".join(f"{n} {s:.1f}s" for n, s in by.items())


def format_table(report: dict) -> str:
    """The metrics table, router first, then every baseline."""
    head = ["router/baseline", *[label for _, label in COLUMNS]]
    rows = [[name, *[_fmt(vals.get(key)) for key, _ in COLUMNS]] for name, vals in report["table"].items()]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    best, cheap, oracle = report["best_single"], report["cheapest_single"], report["oracle"]
    notes = [
        f"test requests: {report['n_test_requests']}  rule: "
        f"{report.get('rules_by_estimator') or report.get('rule')}  "
        f"train: {_fmt_seconds(report)}",
        f"best single: {best['model']} pass {best['pass_rate']:.4f} cost/request ${best['cost']:.6f}",
        f"cheapest single: {cheap['model']} pass {cheap['pass_rate']:.4f} cost/request ${cheap['cost']:.6f}",
        f"oracle: pass {oracle['pass_rate']:.4f} cost/request ${oracle['cost']:.6f}",
        f"APGR/CPT pair: strong {report['pair']['strong']} vs weak {report['pair']['weak']}",
        "savings@X = 1 - cost to reach X x best single's pass rate / best single's cost (n/a: never "
        "reached); AIQ = mean pass rate over [cheapest, dearest single's cost] on each hull (0 below "
        "a router's cheapest point)",
    ]
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows), "", *notes])


def plot_curves(report: dict, path: Path) -> None:
    """Cost-quality curves of the router and baselines (single candidates as points) to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from router_training.metrics import frontier

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for name, curve in report["curves"].items():
        c, q = frontier(curve["cost"], curve["quality"])
        if name in ("router", "router_lgbm", "per_suite", "knn", "zero_router"):
            ax.plot(c, q, marker="." if name != "zero_router" else None, label=name,
                    linestyle="--" if name == "zero_router" else "-")
        else:
            ax.scatter(c, q, marker="*" if name == "oracle" else "s", s=80, label=name, zorder=3)
    singles = report["per_candidate"]
    ax.scatter([v["cost"] for v in singles.values()], [v["pass_rate"] for v in singles.values()],
               marker="o", s=18, color="grey", label="single candidates", zorder=2)
    for model, v in singles.items():
        ax.annotate(model.split("/")[-1], (v["cost"], v["pass_rate"]), fontsize=6, alpha=0.7)
    ax.set_xscale("log")
    ax.set_xlabel("mean cost per request (USD, log scale)")
    ax.set_ylabel("pass rate")
    ax.set_title("Router vs baselines on held-out requests")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
