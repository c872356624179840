"""Turn logged production prompts into eval suites, so the nightly trains on the real distribution.

Only prompts whose text the gateway's redaction hook kept are candidates (text that never passed
the hook was never written, so none can leak here). The sample is stratified by suite and UTC day
(proportional allocation, largest remainders, seeded), repeated prompts counted once. One suite
per logged suite label is written (`<name>-<label>.yaml` and its JSONL beside the other data),
graded by a judge candidate either with a rubric alone or against a reference answer: the
strongest candidate's answer, fetched once when the suite is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from routeopt.common.io import atomic_write

RUBRIC = """Grade how well the response serves the request below, from 0 (wrong, unhelpful or
off-topic) to 10 (correct, complete and well suited to the request).

Request: {{ prompt }}
Response to grade: {{ response }}"""
REFERENCE_RUBRIC = """Grade the response to the request below from 0 (wrong or much worse than the
reference) to 10 (as correct and complete as the reference answer, or better).

Request: {{ prompt }}
Reference answer: {{ reference }}
Response to grade: {{ response }}"""


class TrafficSuiteError(ValueError):
    """The log cannot make a traffic suite (no kept text, a bad option); says what to do."""


@dataclass(frozen=True)
class TrafficSuite:
    name: str
    suite_path: Path
    data_path: Path
    items: int
    strata: dict[str, int]


def with_text(decisions: pd.DataFrame) -> pd.DataFrame:
    """Logged requests whose text was kept, one per distinct prompt (the first logged)."""
    rows = decisions[decisions["text"].map(lambda t: isinstance(t, str) and t.strip() != "")].copy()
    key = rows["prompt_hash"].where(rows["prompt_hash"].notna(), rows["text"])
    return rows.loc[~key.duplicated()].reset_index(drop=True)


def allocate(sizes: Sequence[int], n: int) -> list[int]:
    """Proportional allocation of n over strata by largest remainders; never above a stratum."""
    sizes = np.asarray(sizes, dtype=float)
    total = sizes.sum()
    if total <= 0 or n <= 0:
        return [0] * len(sizes)
    if n >= total:
        return [int(s) for s in sizes]
    exact = sizes * n / total
    base = np.floor(exact).astype(int)
    order = np.argsort(-(exact - base), kind="stable")
    for i in order[: n - base.sum()]:
        base[i] += 1
    return base.tolist()


def stratified_sample(rows: pd.DataFrame, n: int, seed: int = 0) -> tuple[pd.DataFrame, dict[str, int]]:
    """n rows drawn by (suite, UTC day), each stratum in proportion to its share of the traffic."""
    if n < 1:
        raise TrafficSuiteError(f"--sample must be at least 1, got {n}")
    days = pd.to_datetime(rows["time"], utc=True).dt.strftime("%Y-%m-%d")
    labels = rows["suite"].fillna("").astype(str)
    strata = sorted(set(zip(labels, days)))
    groups = [np.flatnonzero((labels == s).to_numpy() & (days == d).to_numpy()) for s, d in strata]
    take = allocate([len(g) for g in groups], n)
    rng = np.random.default_rng(seed)
    picked: list[int] = []
    counts: dict[str, int] = {}
    for (s, d), g, k in zip(strata, groups, take):
        if k:
            picked.extend(sorted(rng.choice(g, size=k, replace=False).tolist()))
            counts[f"{s or '(no suite)'} {d}"] = k
    out = rows.iloc[sorted(picked)].copy()
    out["day"] = days.iloc[sorted(picked)].to_numpy()
    return out.reset_index(drop=True), counts


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-.") or "unlabelled"


def suite_yaml(
    name: str,
    label: str,
    data_rel: str,
    *,
    judge: str,
    rubric: str,
    n: int,
    strata: dict[str, int],
    max_tokens: int,
) -> str:
    """A suite file: the logged prompt as the whole prompt, graded by the judge candidate."""
    import yaml

    spec = {
        "name": name,
        "description": f"Production prompts of suite '{label or '(none)'}' sampled from the decision "
        f"logs by day ({n} items); written by `routeopt import traffic`.",
        "owner": "routeopt-traffic",
        "tags": ["traffic", "production"],
        "dataset": {"path": data_rel, "id_field": "id"},
        "prompt": {"template": "{{ prompt }}"},
        "generation": {"max_tokens": max_tokens, "temperature": 0.0},
        "grader": {
            "type": "judge",
            "candidate": judge,
            "rubric": rubric,
            "min_score": 0,
            "max_score": 10,
            "threshold": 0.7,
        },
    }
    head = (
        "# Written by `routeopt import traffic`; strata (suite day: items): "
        + ", ".join(f"{k}: {v}" for k, v in sorted(strata.items()))
        + "\n"
    )
    return head + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=100)


async def _answers(
    candidate: Any, prompts: dict[str, str], max_tokens: int, concurrency: int
) -> dict[str, str]:
    from routeopt.evals.providers import make_provider
    from routeopt.evals.providers.base import GenerationSettings, Message, Request

    provider = make_provider(candidate)
    gate = asyncio.Semaphore(concurrency)

    async def one(key: str, text: str) -> tuple[str, str]:
        async with gate:
            done = await provider.generate(
                Request((Message("user", text),), GenerationSettings(max_tokens=max_tokens))
            )
            return key, done.text

    try:
        return dict(await asyncio.gather(*(one(k, t) for k, t in prompts.items())))
    finally:
        await provider.aclose()


def reference_answers(
    candidate: Any, prompts: dict[str, str], *, max_tokens: int = 512, concurrency: int = 8
) -> dict[str, str]:
    """The reference candidate's answer to every prompt (id -> text)."""
    from routeopt.evals.providers.base import ProviderError

    try:
        return asyncio.run(_answers(candidate, prompts, max_tokens, concurrency))
    except ProviderError as exc:
        raise TrafficSuiteError(
            f"reference candidate {candidate.name!r} failed: {exc}; no suite was written"
        ) from None


def write_suites(
    sample: pd.DataFrame,
    *,
    name: str,
    suites_dir: Path,
    data_dir: Path,
    judge: str,
    references: dict[str, str] | None,
    strata: dict[str, int],
    max_tokens: int = 512,
) -> list[TrafficSuite]:
    """One suite (YAML + JSONL, written atomically) per suite label of the sample."""
    out = []
    rubric = REFERENCE_RUBRIC if references is not None else RUBRIC
    for label, part in sample.groupby(sample["suite"].fillna("").astype(str), sort=True):
        suite_name = f"{name}-{_slug(label)}" if label else name
        data_path = data_dir / f"{suite_name}.jsonl"
        lines = []
        for r in part.itertuples():
            item = {"id": r.request_id, "prompt": r.text, "logged_suite": label or None, "day": r.day}
            if references is not None:
                item["reference"] = references[r.request_id]
            lines.append(json.dumps(item, ensure_ascii=False))
        atomic_write(data_path, "\n".join(lines) + "\n")
        rel = os.path.relpath(data_path, suites_dir)
        mine = {k: v for k, v in strata.items() if k.rsplit(" ", 1)[0] == (label or "(no suite)")}
        suite_path = suites_dir / f"{suite_name}.yaml"
        atomic_write(
            suite_path,
            suite_yaml(
                suite_name,
                label,
                rel,
                judge=judge,
                rubric=rubric,
                n=len(part),
                strata=mine,
                max_tokens=max_tokens,
            ),
        )
        out.append(TrafficSuite(suite_name, suite_path, data_path, len(part), mine))
    return out


def build_traffic_suites(
    decisions: pd.DataFrame,
    n: int,
    *,
    cfg: Any,
    name: str = "traffic",
    judge: str | None = None,
    reference: str | None = None,
    seed: int = 0,
    suites_dir: Path | None = None,
    data_dir: Path | None = None,
    max_tokens: int = 512,
) -> list[TrafficSuite]:
    """Sample the logged prompts with text and write their suites (see the module docstring)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise TrafficSuiteError(f"--name {name!r}: use letters, digits, '.', '_' or '-'")
    rows = with_text(decisions)
    if rows.empty:
        raise TrafficSuiteError(
            f"none of the {len(decisions)} logged decisions kept its text; a gateway logs text only "
            "through a redaction hook (DecisionLog(redact=...)), see docs/operations.md"
        )
    judge = judge or cfg.traffic.judge
    if judge is None:
        raise TrafficSuiteError("name the judge candidate: --judge NAME or traffic.judge in the config")
    names = [c.name for c in cfg.candidates]
    for role, value in (("judge", judge), ("reference", reference)):
        if value is not None and value not in names:
            raise TrafficSuiteError(f"--{role} {value!r} is not a candidate; the config has {names}")
    sample, strata = stratified_sample(rows, n, seed)
    refs = None
    if reference is not None:
        refs = reference_answers(
            cfg.candidate(reference), dict(zip(sample.request_id, sample.text)), max_tokens=max_tokens
        )
    suites_dir = Path(suites_dir or cfg.traffic.suites_dir or cfg.suites_dir)
    data_dir = Path(data_dir or cfg.traffic.data_dir or suites_dir.parent / "data")
    return write_suites(
        sample,
        name=name,
        suites_dir=suites_dir,
        data_dir=data_dir,
        judge=judge,
        references=refs,
        strata=strata,
        max_tokens=max_tokens,
    )


def strongest_candidate(cfg: Any, champion: Any) -> str | None:
    """The champion policy's reference model (its best single candidate), if it is in the config."""
    names = {c.name for c in cfg.candidates}
    model = getattr(champion, "reference_model", None)
    return model if model in names else None
