"""Batch mode on the fake fleet: billed cost against a synchronous run, and kill -9 resumes.

1. The same fleet (an OpenAI and an Anthropic candidate, prompt caching on) and suites, run
   synchronously and in batch mode (latency_sample 0, so every item is batched): the billed
   cost of the batch run must be 0.50x the synchronous run's to the cent, with the same
   outcome rows (item, candidate, pass/fail, input/output tokens) and the same cached input
   tokens in total (which call fills a prompt cache first depends on arrival order).
2. A batch run killed with SIGKILL at `--kills` random moments, resumed each time, then to
   the end: lines lost (outcomes missing), lines billed twice (the fake server's count),
   batches the provider holds against batches planned in the store.

    python benchmarks/batch_cost.py --items 200 --kills 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.batch_driver import fleet, run  # noqa: E402
from tests.evals.execution.test_batch_kill import Server, check, kill_and_resume  # noqa: E402
from tests.fake_batches import FakeBatchLLM  # noqa: E402
from tests.fake_llm import write_arithmetic_suite  # noqa: E402

COLS = "suite, item_id, candidate, passed, input_tokens, output_tokens"


def costs(items: int, work: Path) -> dict:
    out: dict = {}
    for mode in ("sync", "batch"):
        folder = work / mode
        write_arithmetic_suite(folder / "suites", items, name="arith")
        write_arithmetic_suite(folder / "suites", items // 2, name="arith2", system=None)
        with FakeBatchLLM(phase_s=0.05) as server:
            cfg = fleet(
                folder,
                {"openai": server.openai_base_url, "anthropic": server.anthropic_base_url},
                batch=mode == "batch",
                latency_sample=0,
            )
            started = time.perf_counter()
            store = run(str(cfg), str(folder / "out.duckdb"), "run-1")
            wall = time.perf_counter() - started
        frame = store.query(
            f"SELECT {COLS}, cached_input_tokens, cost_usd, call_mode FROM outcomes "
            "ORDER BY suite, item_id, candidate"
        )
        store.close()
        # which item's call first fills a prompt cache depends on arrival order: compared in total
        out[mode] = {
            "cost_usd": float(frame.cost_usd.sum()),
            "rows": len(frame),
            "wall_s": wall,
            "cached_input_tokens": int(frame.cached_input_tokens.sum()),
            "modes": frame.call_mode.value_counts().to_dict(),
            "_rows": frame[COLS.split(", ")].to_dict("records"),
        }
    same = out["sync"].pop("_rows") == out["batch"].pop("_rows")
    ratio = out["batch"]["cost_usd"] / out["sync"]["cost_usd"]
    return {
        **out,
        "ratio": ratio,
        "same_rows": same,
        "cents_off": round(abs(out["batch"]["cost_usd"] - 0.5 * out["sync"]["cost_usd"]) * 100, 6),
    }


def kills(items: int, n: int, seed: int, work: Path) -> dict:
    server = Server("--phase-s", "0.5", "--seed", str(seed))
    try:
        write_arithmetic_suite(work / "suites", items)
        cfg = fleet(
            work,
            {"openai": server.url + "/v1", "anthropic": server.url},
            batch=True,
            extra={"max_requests": max(1, items // 6)},
        )
        db = work / "out" / "routeopt.duckdb"
        starts = kill_and_resume(cfg, db, kills=n, seed=seed, window_s=3.0)
        got = check(server, db)
    finally:
        server.stop()
    return {
        "starts": starts,
        "expected_rows": 2 * items,
        "lost": 2 * items - got["rows"],
        "billed_twice": len(got["twice"]),
        **{k: v for k, v in got.items() if k != "twice"},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "cost": costs(a.items, Path(tmp) / "cost"),
            "kill": kills(a.items // 2, a.kills, a.seed, Path(tmp) / "kill"),
        }
    c, k = result["cost"], result["kill"]
    print(f"sync run:  ${c['sync']['cost_usd']:.6f} for {c['sync']['rows']} rows")
    print(f"batch run: ${c['batch']['cost_usd']:.6f} for {c['batch']['rows']} rows ({c['batch']['modes']})")
    print(
        f"batch / sync = {c['ratio']:.6f}; |batch - 0.5 x sync| = {c['cents_off']} cents; "
        f"same outcome rows: {c['same_rows']}; cached input tokens "
        f"{c['sync']['cached_input_tokens']} vs {c['batch']['cached_input_tokens']}"
    )
    print(
        f"kill -9 x {a.kills}: {k['starts']} starts, {k['lost']} lines lost, "
        f"{k['billed_twice']} billed twice, batches at the provider {k['batches_server']} = "
        f"recorded {k['batches_recorded']} = planned {k['batches_planned']}; {k['modes']}"
    )
    if a.json:
        a.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
