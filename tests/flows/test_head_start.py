"""The evaluations `routeopt run` begins while Prefect's temporary server starts: they stop when
it answers, keep what they finished, and the flow evaluates only the rest, each item once.

The server here is a stand-in whose "answered" moment the test chooses (after a number of
stored items), so nothing depends on how fast the real one starts."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import duckdb
import pytest

from tests.fake_llm import FakeLLM, write_arithmetic_suite, write_two_model_config

ITEMS = 120
KW = {"db_path": None, "candidates": (), "suites": (), "cache_max_age": None, "cache": False}


class _Server:
    """Prefect's temporary server as the CLI sees it: it answers once `ready` is set."""

    def __init__(self) -> None:
        self.ready = threading.Event()

    def wait_ready(self, timeout_s: float) -> None:
        assert self.ready.wait(timeout_s), "the test never let the server answer"


def _stored(db: Path, run_id: str) -> list[tuple[str, str, str]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT suite, candidate, item_id FROM outcomes WHERE run_id = ?", [run_id]
        ).fetchall()


def _count(db: Path, run_id: str) -> int:
    """Items stored so far, read through the CLI's own writing connection (DuckDB: one per file)."""
    from routeopt.flows.nightly import shared_store

    return sum(
        len(shared_store(db).done_items(run_id, suite, cand))
        for suite in ("arith", "arith2")
        for cand in ("strong", "weak")
    )


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HS_STRONG_KEY", "sk-hs-strong")
    monkeypatch.setenv("HS_WEAK_KEY", "sk-hs-weak")
    # answers take 0.2 s: the head start cannot finish before the stand-in server answers,
    # however fast the machine (a slow one only stores fewer items first)
    with FakeLLM(first_token_delay_s=0.2) as server:
        write_arithmetic_suite(tmp_path / "suites", ITEMS, name="arith")
        write_arithmetic_suite(tmp_path / "suites", ITEMS // 2, name="arith2", system=None)
        config = write_two_model_config(
            tmp_path / "routeopt.yaml", server, server, key_envs=("HS_STRONG_KEY", "HS_WEAK_KEY")
        )
        yield server, config


def test_what_began_before_the_flow_is_kept_and_the_flow_does_only_the_rest(project, prefect_harness):
    from routeopt.evals.config import load_config
    from routeopt.flows.commands.pipeline import _head_start
    from routeopt.flows.nightly import close_stores, nightly

    server, config = project
    cfg = load_config(config)
    run_id, total = "run-head", 2 * (ITEMS + ITEMS // 2)
    stand_in = _Server()

    def answer_after_some_items() -> None:
        while _count(cfg.db_path, run_id) < 40:
            time.sleep(0.01)
        stand_in.ready.set()

    threading.Thread(target=answer_after_some_items, daemon=True).start()
    with _head_start(cfg, stand_in, run_id, KW, probes=[], progress_key=None):
        pass  # the flow would run here
    begun = _count(cfg.db_path, run_id)
    assert 40 <= begun < total, "the stand-in answered after everything was done: nothing tested"

    nightly(config_path=str(config), run_id=run_id, train=False, publish=False)
    close_stores()
    rows = _stored(cfg.db_path, run_id)
    assert len(rows) == len(set(rows)) == total, "an item is missing or stored twice"
    # every item was called (the flow's preflight aside) once, but for those in flight when the head start stopped (cancelled
    # before their answer was stored, so the flow called them again): at most each candidate's
    # concurrency
    sent = collections.Counter(
        (r.body["model"], str(r.body.get("system")), str(r.body["messages"]))
        for r in server.requests
        if "What is" in str(r.body["messages"])
    )
    assert len(sent) == total
    again = sum(n - 1 for n in sent.values())
    assert again <= sum(c.max_concurrency for c in cfg.candidates), again
