"""The dashboard's load-replay section: latency against replay speed, from `routeopt bench replay`.

The latest replay in the store is shown: TTFT and end-to-end p95/p99 of all its requests at each
speed it was replayed at (the median over a sweep's probes of that speed; the table lists every
probe), with the SLO's targets as flat lines. Speeds where the generator fell
behind are left off the curves (their figures describe the machine that sent, not the server)
and listed instead, as are speeds where an endpoint stopped answering.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from routeopt.evals.selfhost.replay_store import load_runs
from routeopt.evals.storage.store import Store
from routeopt.reports.charts import Axis, Series, chart


def replay_section(store: Store) -> dict[str, Any] | None:
    """The latest replay's overall rows and its chart, or None without any replay."""
    runs = load_runs(store)
    if runs.empty:
        return None
    overall = runs[runs.model == "*"].sort_values("speed")
    return {
        "replay_id": str(overall.replay_id.iloc[0]),
        "source": str(overall.source.iloc[0]),
        "rows": overall.to_dict("records"),
        "chart": latency_chart(overall),
    }


def latency_chart(overall: pd.DataFrame) -> str:
    usable = overall[~overall.generator_limited.astype(bool)]
    usable = usable.groupby("speed", as_index=False)[["ttft_p95", "ttft_p99", "e2e_p95", "e2e_p99"]].median()
    xs = [float(s) for s in usable.speed]
    series = [
        Series(
            name,
            xs,
            [None if pd.isna(v) else float(v) * 1000 for v in usable[col]],
            [f"{name} at {x:g}x" for x in xs],
            dashed=dashed,
            color=color,
        )
        for name, col, dashed, color in (
            ("TTFT p95", "ttft_p95", False, "#2563eb"),
            ("TTFT p99", "ttft_p99", True, "#2563eb"),
            ("E2E p95", "e2e_p95", False, "#dc2626"),
            ("E2E p99", "e2e_p99", True, "#dc2626"),
        )
    ]
    for name, col, color in (
        ("TTFT target", "ttft_target_s", "#93c5fd"),
        ("E2E target", "latency_target_s", "#fca5a5"),
    ):
        target = overall[col].dropna()
        if len(target) and xs:
            series.append(
                Series(
                    name,
                    [min(xs), max(xs)],
                    [float(target.iloc[0]) * 1000] * 2,
                    dashed=True,
                    marker="square",
                    color=color,
                )
            )
    return chart(
        "Latency vs replay speed (all requests)",
        series,
        Axis("speed (x the logged pace)", log=len(xs) > 1 and max(xs) / min(xs) >= 8, fmt=".3g"),
        Axis("milliseconds", fmt=".3g"),
        chart_id="replay-latency",
    )
