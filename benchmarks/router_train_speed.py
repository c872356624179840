"""How long train_router takes on ~120,000 outcome rows (RouterBench train, replicated).

Each copy of a request gets a distinct id, a prompt with a few words dropped and 5% of its
outcomes flipped, so the copies are not identical. Run with 2 cores, as CI does:

    OMP_NUM_THREADS=1 taskset -c 0,1 python benchmarks/router_train_speed.py [--rows 120000]

By default it times what `routeopt train` does: hold out 30% and measure on it, then refit on
every request. `--holdout 0` times a single fit on every request. `--sets DIR` times it on every
shared set's training split as `routeopt import outcomes` stores it, one after the other.
The synthetic frame's prompt column is categorical, as the store returns it (each distinct
prompt once); peak RSS is the whole process's, frame included.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from router_data import ROOT, data_dir

sys.path.insert(0, str(ROOT))  # measure this checkout's packages, not an installed copy

DATA = data_dir() / "routerbench" / "train.parquet"


def synthesize(frame: pd.DataFrame, rows: int, seed: int = 0) -> pd.DataFrame:
    """Replicate requests until the frame has at least `rows` rows (prompts categorical, as the
    store returns them, so the copies' prompts are held once each)."""
    rng = np.random.default_rng(seed)
    copies = int(np.ceil(rows / len(frame)))
    texts: dict[str, int] = {}
    parts, codes = [], []
    for k in range(copies):
        part = frame.drop(columns=["prompt"]).copy()
        part["request_id"] = part["request_id"] + f"#{k}"
        prompts = {
            p: " ".join(w for w in p.split(" ") if rng.random() > 0.03) if k else p
            for p in frame["prompt"].unique()
        }
        codes.append(np.array([texts.setdefault(p, len(texts)) for p in frame["prompt"].map(prompts)]))
        if k:
            flip = rng.random(len(part)) < 0.05
            part.loc[flip, "score"] = 1.0 - part.loc[flip, "score"]
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out.insert(
        list(frame.columns).index("prompt"),
        "prompt",
        pd.Categorical.from_codes(np.concatenate(codes), categories=list(texts)),
    )
    return out.iloc[:rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=120_000)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--holdout", type=float, default=0.3, help="Held-out fraction (0: one fit, no report).")
    ap.add_argument(
        "--sets",
        type=Path,
        default=None,
        help="Time every sub-folder's train.parquet as it is (the shared sets) instead.",
    )
    args = ap.parse_args()
    if args.sets is not None:
        from routeopt.evals.storage.importer import training_frame_of

        for folder in sorted(d for d in args.sets.iterdir() if (d / "train.parquet").is_file()):
            timed(training_frame_of(folder / "train.parquet"), args.holdout, folder.name)
        return
    timed(synthesize(pd.read_parquet(args.data), args.rows), args.holdout, "synthetic")


def timed(frame: pd.DataFrame, holdout: float, name: str) -> None:
    from routeopt.router_training.train import train_router

    start, cpu = time.perf_counter(), time.process_time()
    result = train_router(frame, holdout_fraction=holdout)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"{name}: rows={len(frame)} requests={frame['request_id'].nunique()} "
        f"candidates={frame['model'].nunique()} holdout={holdout} refit={result.metrics['refit']} "
        f"train_router_wall_s={took:.1f} cpu_s={cpu:.1f} "
        f"peak_rss_gb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} "
        f"knob_points={len(result.policy.knob.points)}",
        flush=True,
    )


if __name__ == "__main__":
    main()
