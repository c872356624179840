"""The nightly flow on a Dask cluster of two worker processes gives the same outcomes as the
default (thread) task runner, then trains and publishes. Workers return rows and get the
training frame from the flow: the flow process is the only one that opens DuckDB."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.fake_llm import (
    FakeLLM,
    default_answer,
    fails_odd_answers,
    write_arithmetic_suite,
    write_two_model_config,
)

pytest.importorskip("prefect_dask", reason="install the 'dask' extra: pip install -e '.[dask]'")
pytestmark = pytest.mark.slow

COLUMNS = "suite, suite_version, item_id, candidate, passed, score, response, input_tokens, output_tokens, cost_usd, error_kind"


def _config(tmp_path: Path, strong: FakeLLM, weak: FakeLLM, db: str) -> Path:
    suites = tmp_path / "suites"
    if not suites.exists():
        write_arithmetic_suite(suites, 12, name="arith")
        write_arithmetic_suite(suites, 10, name="arith2", system=None)
    return write_two_model_config(
        tmp_path / f"{Path(db).stem}.yaml",
        strong,
        weak,
        key_envs=("OPS_DASK_KEY", "OPS_DASK_KEY"),
        db=db,
        out=".",
    )


def _outcomes(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(f"SELECT {COLUMNS} FROM outcomes ORDER BY suite, item_id, candidate").fetchall()
    finally:
        con.close()


def test_dask_fan_out_matches_the_default_runner(tmp_path: Path, prefect_harness, monkeypatch):
    from distributed import Client, LocalCluster, get_task_stream
    from prefect_dask import DaskTaskRunner

    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.setenv("OPS_DASK_KEY", "sk-dask-test")
    # no prompt cache: which item writes it (and so pays more) depends on arrival order
    with FakeLLM(prompt_cache=False) as strong, FakeLLM(prompt_cache=False) as weak:
        weak.answer_fn = fails_odd_answers
        plain_cfg = _config(tmp_path, strong, weak, "plain.duckdb")
        dask_cfg = _config(tmp_path, strong, weak, "dask.duckdb")
        nightly(config_path=str(plain_cfg), run_id="r1", train=False, publish=False)
        close_store(tmp_path / "plain.duckdb")

        with (
            LocalCluster(
                n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            worker_pids = set(client.run(lambda: __import__("os").getpid()).values())
            on_dask = nightly.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))
            with get_task_stream(client) as stream:
                result = on_dask(config_path=str(dask_cfg), run_id="r1", persist_in_tasks=False)
            close_store(tmp_path / "dask.duckdb")
        sent = len(strong.requests) + len(weak.requests)

    assert len(worker_pids) == 2 and __import__("os").getpid() not in worker_pids
    ran_on = {t["worker"] for t in stream.data if "evaluate" in str(t.get("key", ""))}
    assert len(stream.data) >= 4 and ran_on, stream.data[:3]  # the four pairs ran on the workers
    assert sum(p["total"] for p in result.pairs) == 2 * (12 + 10)
    # training ran on a worker too, from the frame the flow read (workers cannot open the DB)
    assert result.router_metrics["n_requests"] == 22 and result.published["version"] == 1
    assert sent == 2 * 2 * (12 + 10 + 1)  # each run called every item once, after a probe
    plain, dask = _outcomes(tmp_path / "plain.duckdb"), _outcomes(tmp_path / "dask.duckdb")
    assert len(plain) == 44 and plain == dask
    assert 0 < sum(1 for r in dask if r[3] == "weak" and r[4]) < 22  # the weak model fails some


CODE = "```python\ndef add(a, b):\n    return a + b\n```"
JUDGE = {
    "type": "judge",
    "candidate": "judge",
    "max_tokens": 32,
    "rubric": "Grade: {{ response }} for {{ a }} + {{ b }} = {{ answer }}",
}
# every grader type, each as a suite of its own; the prompt's `style` says how to answer
GRADED: dict[str, tuple[str, dict]] = {
    "exact": ("number", {"type": "exact_match", "target": "{{ answer }}"}),
    "regex": ("sentence", {"type": "regex", "pattern": r"is (-?\d+)", "target": "{{ answer }}"}),
    "numeric": ("number", {"type": "numeric", "target": "{{ answer }}"}),
    "choice": (
        "number",
        {
            "type": "multiple_choice",
            "target": "A",
            "letters": "AB",
            "choices": ["{{ answer }}", "{{ answer + 1 }}"],
        },
    ),
    "contains": ("sentence", {"type": "contains", "target": "{{ answer }}"}),
    "json": (
        "json",
        {
            "type": "json",
            "schema": {"type": "object", "required": ["sum"]},
            "fields": {"sum": "{{ answer }}"},
        },
    ),
    "code": ("code", {"type": "code", "tests_field": "tests", "timeout_s": 30}),
    "judge": ("number", JUDGE),
    "custom": ("number", {"type": "custom", "function": "graders.py:right"}),
    "all": ("sentence", {"type": "all", "graders": [{"type": "contains", "target": "{{ answer }}"}, JUDGE]}),
    "any": (
        "number",
        {
            "type": "any",
            "graders": [
                {"type": "exact_match", "target": "nope"},
                {"type": "custom", "function": "graders.py:right"},
            ],
        },
    ),
    "weighted": (
        "number",
        {
            "type": "weighted",
            "threshold": 0.9,
            "graders": [{"type": "numeric", "target": "{{ answer }}"}, JUDGE],
        },
    ),
}


def _answer(prompt: str) -> str:
    """The strong model: answers in the style the prompt asks for; judges say 9/10."""
    if prompt.startswith("Grade:"):
        return "Right.\nSCORE: 9"
    n = default_answer(prompt)
    style = prompt.rsplit("style:", 1)[-1].strip()
    if not n.isdigit():  # a preflight probe
        return n
    return {"sentence": f"The sum is {n}.", "json": json.dumps({"sum": int(n)}), "code": CODE}.get(style, n)


def _every_grader_fleet(tmp_path: Path, server: FakeLLM) -> Path:
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "graders.py").write_text(
        "def right(response, item):\n    return response.strip() == str(item['answer'])\n"
    )
    for name, (style, grader) in GRADED.items():
        rows = [
            {"id": f"q{i}", "a": i, "b": i + 2, "answer": 2 * i + 2, "tests": ["assert add(2, 3) == 5"]}
            for i in range(3)
        ]
        (suites / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        spec = {
            "name": name,
            "dataset": {"path": f"{name}.jsonl", "id_field": "id"},
            "prompt": {"template": f"What is {{{{ a }}}} + {{{{ b }}}}? style: {style}"},
            "generation": {"max_tokens": 64},
            "grader": grader,
        }
        (suites / f"{name}.yaml").write_text(json.dumps(spec))
    cand = dict(
        provider="openai",
        base_url=server.openai_base_url,
        input_price_per_mtok=1.0,
        output_price_per_mtok=2.0,
        api_key_env="OPS_DASK_KEY",
    )
    cfg = {
        "candidates": [
            {"name": "model", "model": "model", **cand},
            {"name": "judge", "model": "judge-model", **cand},
        ],
        "suites_dir": "suites",
        "db_path": "every.duckdb",
        "registry_dir": "reg",
        "cache_dir": "cache",
    }
    path = tmp_path / "every.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_every_grader_type_runs_on_dask_workers(tmp_path: Path, prefect_harness, monkeypatch):
    """Suites are pickled to worker processes: code (a semaphore), judge (clients, bound to the
    runner's call path there) and custom (a function loaded from a file) graders included."""
    from distributed import Client, LocalCluster
    from prefect_dask import DaskTaskRunner

    from routeopt.evals.grading.sandbox import isolation
    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.setenv("OPS_DASK_KEY", "sk-dask-test")
    with FakeLLM(answer_fn=_answer) as server:
        cfg = _every_grader_fleet(tmp_path, server)
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster),
        ):
            on_dask = nightly.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))
            result = on_dask(
                config_path=str(cfg),
                run_id="every",
                candidates=["model"],
                train=False,
                publish=False,
                persist_in_tasks=False,
            )
        close_store(tmp_path / "every.duckdb")
    assert not result.suite_errors and set(result.suites) == set(GRADED)
    con = duckdb.connect(str(tmp_path / "every.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT suite, passed, error_kind, error, judge_cost_usd FROM outcomes WHERE run_id = 'every'"
        ).fetchall()
    finally:
        con.close()
    no_sandbox = isinstance(isolation(False), str)
    by_suite: dict[str, list[tuple]] = {}
    for r in rows:
        by_suite.setdefault(r[0], []).append(r)
    assert set(by_suite) == set(GRADED) and all(len(v) == 3 for v in by_suite.values())
    for suite, got in by_suite.items():
        if no_sandbox and suite == "code":
            continue
        assert all(r[1] is True and r[2] is None for r in got), (suite, got)
        judged = "judge" in json.dumps(GRADED[suite][1])
        assert all((r[4] or 0) > 0 for r in got) if judged else all(r[4] is None for r in got), suite
