"""What the JavaScript gateway benchmarks share: a shared set's policy published through the
command line exactly as a user publishes it, and the built JavaScript package.

    routeopt import outcomes SET/train.parquet --db D
    routeopt train --db D --registry R --signing-key K

Published versions are kept under ~/.cache/routeopt/bench-policies/<set>-<code digest> so the
three benchmarks train each set once per version of the code that trains it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "gateways" / "js"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_data import data_dir  # noqa: E402

CACHE = Path(os.environ.get("ROUTEOPT_TEST_CACHE", Path.home() / ".cache" / "routeopt")) / "bench-policies"


def code_digest() -> str:
    """A digest of the code that trains and writes policies, every module under router_training/
    with its path (a change retrains)."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "router_training").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def cli(*args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "routeopt.flows.cli", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"routeopt {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def published(name: str, data: Path | None = None) -> tuple[Path, Path]:
    """(version folder, public key) of the set's policy, trained and published via the CLI;
    `data`: the folder holding the set (default: the shared sets)."""
    from routeopt.artifacts.publish.signing_keys import generate_keys

    folder = CACHE / f"{name}-{code_digest()}"
    done = folder / "done.json"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        keys = folder / "keys"
        if not keys.exists():
            keys.mkdir()
            generate_keys(keys)
        train = (data or data_dir()) / name / "train.parquet"
        if not train.is_file():
            raise SystemExit(f"{train}: no such shared set")
        cli("import", "outcomes", str(train), "--db", str(folder / "outcomes.duckdb"), cwd=folder)
        cli(
            "train",
            "--db",
            str(folder / "outcomes.duckdb"),
            "--registry",
            str(folder / "registry"),
            "--signing-key",
            str(keys / "signing_key.pem"),
            cwd=folder,
        )
        (version,) = (folder / "registry" / "versions").iterdir()
        done.write_text(json.dumps({"version": str(version)}))
    return Path(json.loads(done.read_text())["version"]), folder / "keys" / "public_key.pem"


def build_js() -> None:
    """npm ci (once per lock file) and npm run build, as the tests do."""
    from tests.gateways.node import package

    package()


def node(*args: str, public_key: Path | None = None, env: dict[str, str] | None = None) -> str:
    env = {**os.environ, **(env or {}), **({"ROUTEOPT_PUBLIC_KEY": str(public_key)} if public_key else {})}
    done = subprocess.run(["node", *args], cwd=JS, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"node {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def test_requests(
    name: str, targets: tuple[float | None, ...] = (None,), data: Path | None = None
) -> list[dict]:
    """The set's test prompts (never trained on) as requests, each at every target."""
    import pandas as pd

    frame = pd.read_parquet((data or data_dir()) / name / "test.parquet").drop_duplicates("request_id")
    return [
        {"id": f"{r.request_id}@{t}", "prompt": r.prompt, "suite": r.suite, "quality_target": t}
        for r in frame.itertuples()
        for t in targets
    ]


def requests_file(requests: list[dict], folder: Path) -> Path:
    """The requests as JSON lines in `folder`, as gateways/js/bench/*.mjs read them."""
    path = folder / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def load_average() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def budget_set(
    name: str, budget: str | None, latency_data: Path | None
) -> tuple[str, Path | None, dict[str, float]]:
    """(set name, data folder, route() keyword arguments) for `--set`, `--budget KIND=SECONDS` and
    `--latency-data DIR`: a budget routes the latency-annotated variant of the set that
    benchmarks/latency_data.py wrote into DIR."""
    if budget is None:
        return name, None, {}
    kind, _, seconds = budget.partition("=")
    if kind not in ("ttft", "latency") or not seconds:
        raise SystemExit(f"--budget {budget!r}: give KIND=SECONDS, KIND ttft or latency")
    if latency_data is None:
        raise SystemExit("--budget needs --latency-data DIR (python benchmarks/latency_data.py --out DIR)")
    return f"{name}-latency", latency_data, {f"{kind}_budget_s": float(seconds)}
