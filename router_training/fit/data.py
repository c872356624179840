"""From a long outcome frame (one row per run x request x model) to routing matrices.

Several runs of the same (request, model) are averaged: the pass target becomes a pass
fraction, the cost a mean. Missing pairs stay NaN and estimators skip them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

REQUIRED = ("request_id", "prompt", "model")
LATENCY_COLUMNS = {"ttft": "ttft_s", "latency": "latency_s"}  # kind -> the outcome column it is read from


@dataclass
class RoutingData:
    """Requests x candidates: outcome Y (pass fraction) and cost C, NaN where not observed."""

    request_ids: list[str]
    prompts: list[str]
    suites: list[str | None]
    candidates: list[str]
    Y: np.ndarray
    C: np.ndarray
    # measured seconds by kind ("ttft", "latency"), (n, K), NaN where not measured; only the
    # kinds the outcomes measured at all
    latency: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.request_ids)

    def subset(self, idx: np.ndarray) -> "RoutingData":
        idx = np.asarray(idx, dtype=int)
        return RoutingData(
            [self.request_ids[i] for i in idx],
            [self.prompts[i] for i in idx],
            [self.suites[i] for i in idx],
            list(self.candidates),
            self.Y[idx],
            self.C[idx],
            {k: v[idx] for k, v in self.latency.items()},
        )

    def complete(self) -> "RoutingData":
        """Only requests where every candidate has an outcome and a cost (for fair evaluation)."""
        ok = ~np.isnan(self.Y).any(axis=1) & ~np.isnan(self.C).any(axis=1)
        return self.subset(np.flatnonzero(ok))

    def align(self, candidates: list[str]) -> "RoutingData":
        """Reorder (and NaN-fill) columns to a given candidate list."""
        pos = {c: i for i, c in enumerate(self.candidates)}
        Y = np.full((len(self), len(candidates)), np.nan)
        C = np.full((len(self), len(candidates)), np.nan)
        L = {k: np.full((len(self), len(candidates)), np.nan) for k in self.latency}
        for j, c in enumerate(candidates):
            if c in pos:
                Y[:, j], C[:, j] = self.Y[:, pos[c]], self.C[:, pos[c]]
                for k in L:
                    L[k][:, j] = self.latency[k][:, pos[c]]
        return RoutingData(self.request_ids, self.prompts, self.suites, list(candidates), Y, C, L)


def _pass_target(frame: pd.DataFrame) -> pd.Series:
    score = pd.to_numeric(frame["score"], errors="coerce") if "score" in frame else None
    if "passed" in frame:
        passed = frame["passed"].astype("float64")
        if score is not None:
            return passed.fillna(score.clip(0, 1))
        return passed
    if score is None:
        raise ValueError("outcome frame needs a 'score' or a 'passed' column")
    return score.clip(0, 1)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame:
        return pd.Series(np.nan, index=frame.index, dtype="float64")
    return pd.to_numeric(frame[name], errors="coerce").astype("float64")


def _priced_cost(frame: pd.DataFrame, prices: dict[str, dict]) -> pd.Series:
    """Recorded cost, replaced by list price x tokens for priced candidates.

    Missing input tokens are estimated as chars/4; missing output tokens as the candidate's mean.
    """
    cost = _column(frame, "cost_usd")
    if not prices:
        return cost
    inp = _column(frame, "input_tokens").fillna(_prompt_chars(frame["prompt"]) / 4.0)
    out = _column(frame, "output_tokens")
    out = out.fillna(out.groupby(frame["model"]).transform("mean")).fillna(0.0)
    for model, price in prices.items():
        rows = frame["model"] == model
        p_in = float(price.get("input_price_per_mtok") or 0.0)
        p_out = float(price.get("output_price_per_mtok") or 0.0)
        cost[rows] = (inp[rows] * p_in + out[rows] * p_out) / 1e6
    return cost


def _prompt_chars(prompt: pd.Series) -> pd.Series:
    """Each row's prompt length, from each distinct prompt once when the column is categorical."""
    if isinstance(prompt.dtype, pd.CategoricalDtype):
        lengths = prompt.cat.categories.astype(str).str.len().to_numpy(dtype=np.float64)
        codes = prompt.cat.codes.to_numpy()
        return pd.Series(np.where(codes >= 0, lengths[codes], np.nan), index=prompt.index)
    return prompt.astype(str).str.len()


def routing_data(
    frame: pd.DataFrame, prices: dict[str, dict] | None = None, candidates: list[str] | None = None
) -> RoutingData:
    """Aggregate a long outcome frame into matrices; candidates sorted by name unless given."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"outcome frame lacks column(s) {', '.join(missing)}")
    if frame.empty:
        raise ValueError("outcome frame is empty: nothing to train on")
    df = pd.DataFrame(
        {
            "request_id": frame["request_id"].astype(str),
            "row": np.arange(len(frame)),
            "suite": frame["suite"].astype("object") if "suite" in frame else None,
            "model": frame["model"].astype(str),
            "y": _pass_target(frame).astype("float64"),
            "cost": _priced_cost(frame, prices or {}).astype("float64"),
            **{kind: _column(frame, column) for kind, column in LATENCY_COLUMNS.items()},
        }
    )
    df = df.dropna(subset=["y"])
    measured = [kind for kind in LATENCY_COLUMNS if df[kind].notna().any()]
    agg = df.groupby(["request_id", "model"], sort=True).agg(
        y=("y", "mean"), cost=("cost", "mean"), **{kind: (kind, "mean") for kind in measured}
    )
    first = df.groupby("request_id", sort=True).agg(row=("row", "first"), suite=("suite", "first"))
    # a request's prompt is that of its first row: only those rows' prompts are read as text
    first["prompt"] = frame["prompt"].iloc[first["row"].to_numpy()].astype(str).to_numpy()
    names = candidates or sorted(df["model"].unique().tolist())
    Y = agg["y"].unstack("model").reindex(index=first.index, columns=names)
    C = agg["cost"].unstack("model").reindex(index=first.index, columns=names)
    suites = [
        None if (s is None or (isinstance(s, float) and np.isnan(s))) else str(s)
        for s in first["suite"].tolist()
    ]
    return RoutingData(
        request_ids=first.index.tolist(),
        prompts=first["prompt"].tolist(),
        suites=suites,
        candidates=list(names),
        Y=Y.to_numpy(dtype=np.float64),
        C=C.to_numpy(dtype=np.float64),
        latency={
            kind: agg[kind]
            .unstack("model")
            .reindex(index=first.index, columns=names)
            .to_numpy(dtype=np.float64)
            for kind in measured
        },
    )


def release_free_memory() -> None:
    """Give the pages a finished training stage freed back to the operating system: glibc's
    malloc keeps freed heap memory for reuse, which the next stage's peak would stack on."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
