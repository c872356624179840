"""How fast suites load and graders grade: suite load time, text-grader rate, sandboxed code rate.

    nice python benchmarks/suites_graders.py [--items 10000] [--code-items 40] [--code-repeats 5]

Prints one line per figure. The code grader's figure is dominated by starting two fresh,
isolated interpreters per item (the program and the checker, each in its own bubblewrap sandbox),
which bounds how many code items per second a run can grade; `max_parallel` trades CPU for
throughput. `--code-repeats` repeats the code figures and prints their median (timings are noisy
on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

from routeopt.evals.grading import build_grader
from routeopt.evals.grading.sandbox import isolation
from routeopt.evals.suite.spec import load_suite


def _suite(folder: Path, n: int) -> Path:
    rng = random.Random(0)
    rows = [{"id": f"q{i}", "a": rng.randint(0, 999), "b": rng.randint(0, 999)} for i in range(n)]
    (folder / "d.jsonl").write_text(
        "".join(json.dumps({**r, "answer": r["a"] + r["b"]}) + "\n" for r in rows)
    )
    (folder / "s.yaml").write_text(
        "name: bench\ndataset: {path: d.jsonl, id_field: id}\n"
        "prompt: {system: 'Answer with a number.', template: 'What is {{ a }} + {{ b }}?'}\n"
        "grader: {type: numeric, target: '{{ answer }}'}\n"
    )
    return folder / "s.yaml"


async def _rate(grader_spec: dict, pairs: list[tuple[str, dict]]) -> float:
    g = build_grader(grader_spec)
    started = time.perf_counter()
    for response, item in pairs:
        await g.grade(response, item)
    return len(pairs) / (time.perf_counter() - started)


async def _code_rate(n: int, parallel: int) -> tuple[float, float]:
    g = build_grader({"type": "code", "max_parallel": parallel, "timeout_s": 10})
    item = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    started = time.perf_counter()
    grades = await asyncio.gather(*(g.grade("def add(a, b):\n    return a + b", item) for _ in range(n)))
    wall = time.perf_counter() - started
    assert all(x.passed for x in grades)
    return n / wall, wall / n * parallel


async def main(items: int, code_items: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _suite(Path(tmp), items)
        started = time.perf_counter()
        suite = load_suite(path)
        print(f"suite load ({items} items, all templates checked): {time.perf_counter() - started:.2f} s")
    pairs = [(f"The answer is {i.fields['answer']}", i.fields) for i in suite.items]
    print(
        f"numeric grader: {await _rate({'type': 'numeric', 'target': '{{ answer }}'}, pairs):,.0f} grades/s"
    )
    js = {
        "type": "json",
        "schema": {"type": "object", "required": ["sum"]},
        "fields": {"sum": "{{ answer }}"},
    }
    jpairs = [(f'```json\n{{"sum": {i.fields["answer"]}}}\n```', i.fields) for i in suite.items]
    print(f"json grader (schema + field): {await _rate(js, jpairs):,.0f} grades/s")
    iso = isolation(False)
    if isinstance(iso, str):
        print(f"code grader: skipped ({iso})")
        return
    print(f"code grader isolation: {iso.description}")
    for parallel in (1, 2):
        runs = sorted([await _code_rate(code_items, parallel) for _ in range(repeats)])
        rate, per_item = runs[len(runs) // 2]
        print(
            f"code grader (max_parallel={parallel}, median of {repeats}): {rate:.1f} items/s, "
            f"{per_item * 1000:.0f} ms per item"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--code-items", type=int, default=40)
    ap.add_argument("--code-repeats", type=int, default=5)
    args = ap.parse_args()
    asyncio.run(main(args.items, args.code_items, args.code_repeats))
