"""Seconds from `routeopt run` starting to the line that names a misconfigured candidate.

A new user's configuration mistakes, made against a real LiteLLM proxy (`litellm --config` with three
`mock_response` deployments, from the test helper's virtualenv): the big candidate's key is
wrong (the proxy answers 400 `No connected db.`), its model name has a typo, its base URL points
at a dead port or a wrong path, or its `api_key_env` names a variable that is not set. For each,
`python -m routeopt.flows.cli run --no-progress` runs --reps times from a fresh folder; the figure is the
time until the line naming the candidate (with its URL and the proxy's message, or the unset
variable) appears on stderr, and the time until the process exits (it must exit non-zero).

    flock /tmp/routeopt-bench.lock python benchmarks/preflight_detect.py [--reps 3]

The proxy is started once (its start is not timed). The last line holds the medians as
key=value, after the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.litellm_proxy import LiteLLMProxy, free_port  # noqa: E402

KEY_ENV = "BENCH_PROXY_KEY"


def project(folder: Path, proxy: LiteLLMProxy, big: dict) -> Path:
    """Three candidates on the proxy and a 12-item suite; `big` changes the big candidate."""
    suites = folder / "suites"
    suites.mkdir(parents=True)
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
            "name": n,
            "provider": "openai",
            "model": n,
            "base_url": proxy.base_url,
            "api_key_env": KEY_ENV,
            "input_price_per_mtok": p,
            "output_price_per_mtok": p,
        }
        for n, p in (("small", 0.1), ("medium", 1.0), ("big", 10.0))
    ]
    candidates[2].update(big)
    path = folder / "routeopt.yaml"
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


def mistakes(proxy: LiteLLMProxy) -> dict[str, tuple[dict, str]]:
    """name -> (the big candidate's change, text the naming line must hold)."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    return {
        "wrong_key": (
            {"api_key_env": "BENCH_WRONG_KEY"},
            f"candidate big ({proxy.base_url}): HTTP 400: No connected db.",
        ),
        "model_typo": (
            {"model": "big-hundredd"},
            f"candidate big ({proxy.base_url}): HTTP 400: /chat/completions: "
            "Invalid model name passed in model=big-hundredd",
        ),
        "dead_port": ({"base_url": dead}, f"candidate big ({dead}): Connection error."),
        "wrong_path": (
            {"base_url": proxy.url + "/v2"},
            f"candidate big ({proxy.url}/v2): HTTP 404: Not Found",
        ),
        "unset_env": ({"api_key_env": "BENCH_UNSET_KEY"}, "candidate big: $BENCH_UNSET_KEY is not set"),
    }


def one_run(config: Path, proxy: LiteLLMProxy, expect: str) -> tuple[float, float]:
    """(seconds until the naming line, seconds until exit); raises if it is never said."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "BENCH_UNSET_KEY")}
    env.update(PYTHONPATH=str(REPO), **{KEY_ENV: proxy.master_key, "BENCH_WRONG_KEY": "sk-not-a-proxy-key"})
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "routeopt.flows.cli", "run", "--config", str(config), "--no-progress"],
        cwd=config.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    named, seen = None, []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if named is None and expect in line:
            named = time.perf_counter() - start
    ended = time.perf_counter() - start
    if proc.wait() == 0 or named is None:
        raise RuntimeError(f"exit {proc.returncode}, {expect!r} never said:\n{''.join(seen)[-3000:]}")
    return named, ended


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="routeopt-preflight-"))
    config = {
        "model_list": [
            {
                "model_name": n,
                "litellm_params": {
                    "model": "openai/gpt-4o-mini",
                    "mock_response": "42",
                    "api_key": "sk-unused",
                },
            }
            for n in ("small", "medium", "big")
        ]
    }
    load_before = os.getloadavg()
    named: dict[str, list[float]] = {}
    ended: dict[str, list[float]] = {}
    with LiteLLMProxy(config) as proxy:
        for rep in range(args.reps):
            for name, (change, expect) in mistakes(proxy).items():
                said, done = one_run(project(tmp / f"{name}-{rep}", proxy, change), proxy, expect)
                named.setdefault(name, []).append(said)
                ended.setdefault(name, []).append(done)
                print(
                    f"round {rep + 1}: {name:<11} named after {said:5.2f} s, exited after {done:5.2f} s",
                    flush=True,
                )
    load_after = os.getloadavg()
    print(
        f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} (1 min; {os.cpu_count()} cores)"
    )
    print(
        " ".join(
            [f"{k}_named_s={statistics.median(v):.2f}" for k, v in named.items()]
            + [f"{k}_exit_s={statistics.median(v):.2f}" for k, v in ended.items()]
            + [f"load_before={load_before[0]:.1f}", f"load_after={load_after[0]:.1f}"]
        )
    )


if __name__ == "__main__":
    main()
