"""Configuration mistakes, made as a new user makes them: three `openai` candidates behind a real
LiteLLM proxy (`litellm --config`, `mock_response` deployments), and `routeopt run`.

Each mistake is named on screen with the candidate, its URL and what the proxy said, the run
exits non-zero, and no policy is published; with --skip-broken the rest runs and publishes
without the broken one. Without a preflight, the same error on every call of a candidate is a
configuration error: excluded, named with its first message, and the run exits non-zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests import REPO
from tests.litellm_proxy import LiteLLMProxy, free_port

pytestmark = pytest.mark.slow  # a real proxy (its first start builds its virtualenv)

KEY_ENV = "I26_PROXY_KEY"
SIZES = {"small": ("41", 0.1), "medium": ("42", 1.0), "big": ("42", 10.0)}  # answer, $/Mtok


@pytest.fixture(scope="module")
def proxy():
    config = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "mock_response": answer,
                    "api_key": "sk-upstream-unused",
                },
            }
            for name, (answer, _) in SIZES.items()
        ]
    }
    with LiteLLMProxy(config) as p:
        yield p


def _project(tmp_path: Path, proxy: LiteLLMProxy, **big: object) -> Path:
    """A suite of 12 items whose answer is 42, and three candidates on the proxy; `big` changes
    the big one."""
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "answer.jsonl").write_text(
        "".join(json.dumps({"id": f"q{i}", "a": 40 - i, "b": 2 + i}) + "\n" for i in range(12))
    )
    (suites / "answer.yaml").write_text(
        json.dumps(
            {
                "name": "answer",
                "dataset": {"path": "answer.jsonl", "id_field": "id"},
                "prompt": {"template": "What is {{ a }} + {{ b }}?"},
                "generation": {"max_tokens": 4},
                "grader": {"type": "exact_match", "target": "42"},
            }
        )
    )
    candidates = [
        {
            "name": name,
            "provider": "openai",
            "model": name,
            "base_url": proxy.base_url,
            "api_key_env": KEY_ENV,
            "input_price_per_mtok": price,
            "output_price_per_mtok": price,
            "max_retries": 0,
        }
        for name, (_, price) in SIZES.items()
    ]
    candidates[2].update(big)
    path = tmp_path / "routeopt.yaml"
    path.write_text(
        json.dumps(
            {
                "candidates": candidates,
                "suites_dir": "suites",
                "db_path": "out/db.duckdb",
                "registry_dir": "out/registry",
                "cache_dir": "out/cache",
            }
        )
    )
    return path


@pytest.fixture(autouse=True)
def _session_prefect(prefect_api: str, monkeypatch) -> None:
    """`routeopt run` reports to the session's Prefect server instead of starting its own."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)


def _run(config: Path, proxy: LiteLLMProxy, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTEOPT_SIGNING_KEY", "I26_UNSET_KEY")}
    env.update(
        PYTHONPATH=str(REPO), PREFECT_LOGGING_LEVEL="WARNING", **{KEY_ENV: proxy.master_key}, **env_vars
    )
    return subprocess.run(
        [sys.executable, "-m", "routeopt.flows.cli", "run", "--config", str(config), "--no-progress", *args],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _published(tmp_path: Path) -> list[Path]:
    return (
        sorted((tmp_path / "out" / "registry" / "versions").glob("*"))
        if (tmp_path / "out" / "registry" / "versions").exists()
        else []
    )


def _mistake(name: str, proxy: LiteLLMProxy) -> tuple[dict, str, str]:
    """(the big candidate's change, its URL as it must be named, what the proxy said)."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    return {  # a wrong key: the big candidate reads another variable, which holds a wrong key
        "wrong_key": (
            {"api_key_env": "I26_WRONG_KEY"},
            proxy.base_url,
            f"HTTP 400: No connected db. [no_db_connection] (POST {proxy.base_url}/chat/completions)",
        ),
        "model_typo": (
            {"model": "big-hundredd"},
            proxy.base_url,
            "HTTP 400: /chat/completions: Invalid model name passed in model=big-hundredd.",
        ),
        "dead_port": ({"base_url": dead}, dead, "Connection error. (ConnectError: "),
        "wrong_path": (
            {"base_url": proxy.url + "/v2"},
            proxy.url + "/v2",
            f"HTTP 404: Not Found (POST {proxy.url}/v2/chat/completions)",
        ),
    }[name]


@pytest.mark.parametrize("mistake", ["wrong_key", "model_typo", "dead_port", "wrong_path"])
def test_a_misconfigured_candidate_is_named_before_any_suite_and_nothing_is_published(
    tmp_path: Path, proxy: LiteLLMProxy, mistake: str
) -> None:
    change, url, said = _mistake(mistake, proxy)
    done = _run(_project(tmp_path, proxy, **change), proxy, I26_WRONG_KEY="sk-not-a-proxy-key")
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, out
    assert f"routeopt: preflight: candidate big ({url}): {said}" in out, out
    assert "Error: preflight failed for big: nothing was evaluated" in out
    assert "candidate small" not in out and "candidate medium" not in out  # they answered
    assert "Beginning flow run" not in out and "Traceback" not in out  # stopped before the flow
    assert _published(tmp_path) == []
    with duckdb.connect(str(tmp_path / "out" / "db.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        probes = dict(con.execute("SELECT candidate, verdict FROM preflight").fetchall())
    assert probes == {"small": "ok", "medium": "ok", "big": "broken"}


def test_an_unset_key_variable_is_named_before_anything_starts(tmp_path: Path, proxy: LiteLLMProxy) -> None:
    done = _run(_project(tmp_path, proxy, api_key_env="I26_UNSET_KEY"), proxy)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: candidate big: $I26_UNSET_KEY is not set\n"), done.stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_with_skip_broken_the_rest_runs_and_publishes_without_it(tmp_path: Path, proxy: LiteLLMProxy) -> None:
    done = _run(_project(tmp_path, proxy, model="big-hundredd"), proxy, "--skip-broken")
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, out  # it published, and still says a candidate needs fixing
    assert "Error: big failed preflight and was left out of this run and its policy (--skip-broken)" in out
    (version,) = _published(tmp_path)
    policy = json.loads((version / "policy.json").read_text())
    assert sorted(policy["candidates"]) == ["medium", "small"], policy["candidates"]
    with duckdb.connect(str(tmp_path / "out" / "db.duckdb"), read_only=True) as con:
        evaluated = dict(con.execute("SELECT candidate, count(*) FROM outcomes GROUP BY 1").fetchall())
    assert evaluated == {"small": 12, "medium": 12}


def test_without_preflight_the_same_error_on_every_call_is_a_configuration_error(
    tmp_path: Path, proxy: LiteLLMProxy
) -> None:
    """Four broken candidates beside a good one, and no preflight: each one's rows are excluded
    as misconfigured and named with their first message, the dead port's breaker says so when
    it opens, no policy is published, and the run exits non-zero."""
    config = _project(tmp_path, proxy)
    cfg = json.loads(config.read_text())
    good = cfg["candidates"][1]
    dead = f"http://127.0.0.1:{free_port()}/v1"
    broken = {
        "wrong-key": {"api_key_env": "I26_WRONG_KEY"},
        "typo": {"model": "big-hundredd"},
        "wrong-path": {"base_url": proxy.url + "/v2"},
        "dead-port": {
            "base_url": dead,
            "max_concurrency": 4,
            "circuit_breaker_failures": 3,
            "circuit_breaker_cooldown_s": 0.2,
            "circuit_breaker_max_wait_s": 1.0,
        },
    }
    cfg["candidates"] = [good] + [{**good, "name": name, **change} for name, change in broken.items()]
    config.write_text(json.dumps(cfg))
    done = _run(config, proxy, "--no-preflight", I26_WRONG_KEY="sk-not-a-proxy-key")
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, out
    for name, first in (
        ("wrong-key", "client_error: HTTP 400: No connected db. [no_db_connection]"),
        (
            "typo",
            "client_error: HTTP 400: /chat/completions: Invalid model name passed in model=big-hundredd.",
        ),
        ("wrong-path", f"config: HTTP 404: Not Found (POST {proxy.url}/v2/chat/completions)"),
        ("dead-port", "connection: Connection error. (ConnectError: "),
    ):
        assert f"candidate {name} is misconfigured: all" in out and first in out, (name, out)
    assert f"circuit breaker open for {dead}" in out  # said when it opened
    assert "no policy published: dead-port, typo, wrong-key, wrong-path got the same error" in out
    assert "Traceback" not in out and _published(tmp_path) == []
    with duckdb.connect(str(tmp_path / "out" / "db.duckdb"), read_only=True) as con:
        kinds = con.execute(
            "SELECT candidate, error_kind, count(*) FROM outcomes GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    by = {(c, k): n for c, k, n in kinds}
    assert by[("medium", None)] == 12 and not any(c == "medium" and k for c, k in by)
    assert all(by.get((name, "misconfigured"), 0) >= 3 for name in broken), kinds
    assert {k for c, k in by if c in broken} <= {"misconfigured", "circuit_open"}
