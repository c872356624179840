"""`routeopt bench router --shift`: the knob on the project's own shifted test sets.

Each set's training split trains, as `routeopt train` trains:

* `default`: the knob certified for requests like the calibration requests (what ships);
* `traffic`: certified toward the shifted traffic (`--traffic`): the shifted test requests'
  prompts, without their outcomes, are the unlabelled sample (one policy per shift);
* `robust`: certified for every suite x difficulty mix within a factor gamma (`--robust`).

Each is routed at every target on each shift's test requests (`routeopt.router_training.evaluation.shifts`) and on
the unshifted test split, and scored with `bench.measure` against the best single candidate on
those very requests. The checks per (shift, policy): pass rate at 0.8 / 0.9 / 0.95 >=
x * best - 0.015 and at 1.0 >= best - 0.01; its price is S95 beside the default knob's.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from routeopt.router_training.evaluation.baselines import ReferenceRouter
from routeopt.router_training.evaluation.bench import (
    CHECKED,
    _fmt,
    _grid,
    knob_choices,
    knob_info,
    measure,
    scoring_data,
)
from routeopt.router_training.fit.certificate import Certificate, TrafficSample
from routeopt.router_training.fit.data import RoutingData, routing_data
from routeopt.router_training.policy.routing import RoutingPolicy
from routeopt.router_training.evaluation.shifts import SHIFTS, shifted

Fit = Callable[[pd.DataFrame, Certificate], RoutingPolicy]
SHIFT_TARGETS = (0.8, 0.9, 0.95, 1.0)


def difficulty(reference: ReferenceRouter, test: RoutingData) -> np.ndarray:
    """1 - the plain reference's mean predicted pass rate over the candidates (learned on the
    training split only): higher is harder."""
    return 1.0 - reference.predict_proba(test.prompts, test.suites).mean(axis=1)


def shift_checks(report: dict) -> dict[str, bool]:
    """The checks on one shifted set: the floors at 0.8 / 0.9 / 0.95 / 1.0."""
    return {k: v for k, v in report["checks"].items() if k.startswith("pass@")}


def _measure(policy: RoutingPolicy, test: RoutingData, train: RoutingData) -> dict:
    rep = measure(knob_choices(policy, test), test, train, knob=knob_info(policy), best_on="test")
    rep.pop("curves")
    rep["checks"] = shift_checks(rep)
    return rep


def run_shifts(
    name: str,
    train_frame: pd.DataFrame,
    test_frame: pd.DataFrame,
    fit: Fit,
    shifts: tuple[str, ...] = SHIFTS,
    robust: float | None = 2.0,
    seed: int = 0,
) -> dict:
    """Every policy on every shift of one set (and unshifted): JSON-ready."""
    default = fit(train_frame, Certificate())
    train = routing_data(train_frame, candidates=default.candidates)
    test = scoring_data(test_frame, default.candidates)
    hardness = difficulty(ReferenceRouter().fit(train), test)
    robust_policy = fit(train_frame, Certificate(robust=robust)) if robust else None
    out: dict = {"name": name, "n_test": len(test), "robust_gamma": robust, "shifts": []}
    for shift in ("none", *shifts):
        if shift == "none":
            sub, description = test, "the test split as it is"
        else:
            s = shifted(shift, test, hardness, seed=seed)
            if s is None:
                out["shifts"].append({"shift": shift, "skipped": "one suite only"})
                continue
            sub, description = test.subset(s.keep), s.description
        row: dict = {"shift": shift, "description": description, "n": len(sub), "policies": {}}
        row["policies"]["default"] = _measure(default, sub, train)
        if shift != "none":
            sample = TrafficSample.of_prompts(list(sub.prompts), list(sub.suites), source=f"shift {shift}")
            weighted = fit(train_frame, Certificate(traffic=sample))
            row["policies"]["traffic"] = _measure(weighted, sub, train)
            row["policies"]["traffic"]["weights"] = weighted.metrics["knob"]["certificate"].get("traffic", {})
        if robust_policy is not None:
            row["policies"]["robust"] = _measure(robust_policy, sub, train)
        out["shifts"].append(row)
    return out


def format_shifts(report: dict) -> str:
    """One set: per shift and policy, the pass rate at 0.8 / 0.9 / 0.95 / 1.0 against the floor,
    S95 and AIQ, and the checks."""
    head = [
        "shift",
        "n",
        "policy",
        "best single",
        *[f"pass@{x:g} (floor)" for x in SHIFT_TARGETS],
        "S95",
        "AIQ",
        "checks",
        "ESS",
    ]
    rows = []
    for sh in report["shifts"]:
        if "skipped" in sh:
            rows.append([sh["shift"], "-", f"skipped: {sh['skipped']}", *[""] * (len(head) - 3)])
            continue
        for label, rep in sh["policies"].items():
            at = {round(t["target"], 6): t for t in rep["targets"]}
            cells = [
                f"{_fmt(at[x]['pass_rate'])} ({_fmt(at[x]['floor'])})" if x in at else "-"
                for x in SHIFT_TARGETS
            ]
            ess = rep.get("weights", {}).get("effective_sample_size")
            rows.append(
                [
                    sh["shift"],
                    str(sh["n"]),
                    label,
                    f"{rep['best_single']['model'][:24]} {rep['best_single']['pass_rate']:.3f}",
                    *cells,
                    _fmt(rep["table"]["knob"]["savings_at_95"]),
                    _fmt(rep["table"]["knob"]["aiq"]),
                    f"{sum(rep['checks'].values())}/{len(rep['checks'])}",
                    "-" if ess is None else f"{ess:.0f}",
                ]
            )
    gamma = report.get("robust_gamma")
    lines = [
        f"== {report['name']}: shifted test sets ({report['n_test']} test requests; robust gamma "
        f"{_fmt(gamma, 'g')}); floors x * best single on the shifted requests, checks at "
        + ", ".join(f"{x:g} (-{CHECKED[x]:g})" for x in SHIFT_TARGETS),
        *_grid(head, rows),
    ]
    return "\n".join(lines)


def format_shift_summary(reports: list[dict]) -> str:
    """Across sets: checks passed per policy, and S95 of each policy beside the default's."""
    labels = ("default", "traffic", "robust")
    head = ["set", "shift", *[f"{k} S95" for k in labels], *[f"{k} checks" for k in labels]]
    rows, totals = [], {k: [0, 0] for k in labels}
    for r in reports:
        for sh in r["shifts"]:
            if "skipped" in sh:
                continue
            pol = sh["policies"]
            s95 = [_fmt(pol[k]["table"]["knob"]["savings_at_95"]) if k in pol else "-" for k in labels]
            checks = []
            for k in labels:
                if k not in pol:
                    checks.append("-")
                    continue
                ok, n = sum(pol[k]["checks"].values()), len(pol[k]["checks"])
                totals[k][0] += ok
                totals[k][1] += n
                checks.append(f"{ok}/{n}")
            rows.append([r["name"], sh["shift"], *s95, *checks])
    total = "; ".join(f"{k} {v[0]}/{v[1]}" for k, v in totals.items() if v[1])
    return "\n".join(["== shifted sets: summary", *_grid(head, rows), "", f"checks passed: {total}"])
