"""The quality knob measured the way a user meets it: through the command line, on every set.

For each sub-folder of --data holding train.parquet and test.parquet (default ../shared/data):

    routeopt import outcomes train.parquet --db D
    routeopt train --db D --registry R
    routeopt route --policy R --input test_prompts.jsonl --output out.jsonl --quality-target x

for every target x, then the chosen models are scored against the test outcomes. Prints per set
the realised pass rate and cost at each target, S100 / S95 / AIQ of the knob beside the plain
reference (routeopt.router_training.evaluation.baselines.ReferenceRouter), the zero router, the best single
candidate and the oracle, and how often the promise (pass rate >= x * best single) held.

    python benchmarks/router_knob.py [--data ../shared/data] [--sets routerbench,alpacaeval]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router_data import data_dir  # noqa: E402
from routeopt.router_training.evaluation.baselines import ReferenceRouter  # noqa: E402
from routeopt.router_training.evaluation.bench import (  # noqa: E402
    find_sets,
    format_set,
    format_summary,
    measure,
    scoring_data,
)
from routeopt.router_training.fit.data import routing_data  # noqa: E402
from routeopt.router_training.fit.knob_fitting import STANDARD_TARGETS  # noqa: E402


def cli(*args: str) -> str:
    """Run `routeopt ARGS` from this checkout and return its output; fail loudly."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "routeopt.flows.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"routeopt {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def keys(tmp: Path) -> tuple[Path, Path]:
    """A signing key pair of this benchmark's own (as a user's `routeopt run` makes one)."""
    from routeopt.artifacts.publish.signing_keys import generate_keys

    folder = tmp / "keys"
    if not folder.exists():
        folder.mkdir()
        return generate_keys(folder)
    return folder / "signing_key.pem", folder / "public_key.pem"


def run_set(name: str, train_path: Path, test_path: Path, tmp: Path) -> dict:
    db, registry, requests = tmp / f"{name}.duckdb", tmp / f"{name}-registry", tmp / f"{name}-prompts.jsonl"
    private, public = keys(tmp)
    start = time.perf_counter()
    cli("import", "outcomes", str(train_path), "--db", str(db))
    trained = cli("train", "--db", str(db), "--registry", str(registry), "--signing-key", str(private))
    train_s = time.perf_counter() - start
    test_frame = pd.read_parquet(test_path)
    first = test_frame.drop_duplicates("request_id")
    requests.write_text(
        "".join(
            json.dumps({"id": r.request_id, "prompt": r.prompt, "suite": r.suite}) + "\n"
            for r in first.itertuples()
        ),
        encoding="utf-8",
    )
    from routeopt.artifacts.serving.loader import load

    policy = load(registry, public_key=public).policy
    test = scoring_data(test_frame, policy.candidates)
    pos = {c: j for j, c in enumerate(policy.candidates)}
    row_of = {r: i for i, r in enumerate(test.request_ids)}
    choices = []
    for x in STANDARD_TARGETS:
        out = tmp / f"{name}-{x:g}.jsonl"
        cli(
            "route",
            "--policy",
            str(registry),
            "--input",
            str(requests),
            "--output",
            str(out),
            "--quality-target",
            str(x),
            "--public-key",
            str(public),
        )
        pick = np.full(len(test), -1)
        for line in out.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["id"] in row_of:
                pick[row_of[row["id"]]] = pos[row["model"]]
        if (pick < 0).any():
            raise SystemExit(f"{name}: route left {(pick < 0).sum()} test requests without a model")
        choices.append(pick)
    from routeopt.evals.storage.store import Store

    with Store(db, read_only=True) as store:  # the reference sees what `routeopt train` saw
        train_data = routing_data(store.training_frame(), candidates=policy.candidates)
    knob = {
        "confidence": policy.knob.confidence,
        "certified_up_to": policy.knob.certified_up_to(),
        "reference_model": policy.reference_model,
        "train_output": trained.strip().splitlines(),
        "import_and_train_seconds": train_s,
    }
    report = measure(choices, test, train_data, ReferenceRouter().fit(train_data), knob=knob)
    report["name"] = name
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=data_dir())
    ap.add_argument("--sets", default="", help="Comma-separated set names (default: every set).")
    ap.add_argument("--json", type=Path, default=None, help="Also write the reports as JSON.")
    args = ap.parse_args()
    wanted = {s for s in args.sets.split(",") if s}
    reports = []
    with tempfile.TemporaryDirectory(prefix="router-knob-") as tmp:
        for name, train_path, test_path in find_sets(args.data):
            if wanted and name not in wanted:
                continue
            report = run_set(name, train_path, test_path, Path(tmp))
            print(format_set(report))
            print(
                f"import + train through the CLI: {report['knob']['import_and_train_seconds']:.1f} s; "
                + " | ".join(report["knob"]["train_output"][1:])
                + "\n"
            )
            sys.stdout.flush()
            reports.append(report)
    print(format_summary(reports))
    if args.json:
        from routeopt.common.io import jsonable

        args.json.write_text(json.dumps(jsonable(reports), indent=1))


if __name__ == "__main__":
    main()
