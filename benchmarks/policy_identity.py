"""Hash the policies the product trains, to show a refactor changes no byte of them.

Trains through the command line a user runs (`routeopt import outcomes`, then `routeopt train`)
on each shared set's train split, and runs `routeopt run` (the demo) in an empty folder; prints
a sha256 per published policy over its policy files (policy.json, arrays.safetensors,
conformance.safetensors). The manifest and its signature are left out: they carry the publish
time, a random publish id and a fresh key.

    PYTHONPATH=. python benchmarks/policy_identity.py --sets /work/shared/data [--demo] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICY_FILES = ("policy.json", "arrays.safetensors", "conformance.safetensors")


def _routeopt(args: list[str], cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "routeopt", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "ROUTEOPT_SIGNING_KEY": ""},
    )
    if done.returncode:
        raise SystemExit(
            f"routeopt {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )


def policy_hashes(registry: Path) -> dict[str, str]:
    """sha256 of each published version's policy files, by version folder name without its digest."""
    out = {}
    for version in sorted((registry / "versions").iterdir()):
        h = hashlib.sha256()
        for name in POLICY_FILES:
            h.update(name.encode() + b"\0" + (version / name).read_bytes())
        out[version.name.split("-")[0]] = h.hexdigest()
    return out


def train_set(folder: Path, work: Path, seed: int) -> dict[str, str]:
    db, registry = work / "outcomes.duckdb", work / "registry"
    _routeopt(["import", "outcomes", str(folder / "train.parquet"), "--db", str(db)], work)
    _routeopt(
        [
            "train",
            "--db",
            str(db),
            "--registry",
            str(registry),
            "--seed",
            str(seed),
            "--signing-key",
            str(work / "key.pem"),
        ],
        work,
    )
    return policy_hashes(registry)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=Path, default=None, help="folder of sets with train.parquet each")
    ap.add_argument("--demo", action="store_true", help="also hash the demo's policies (`routeopt run`)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results: dict[str, dict[str, str]] = {}
    for folder in sorted(
        p for p in (args.sets.iterdir() if args.sets else []) if (p / "train.parquet").exists()
    ):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            _make_key(Path(tmp) / "key.pem")
            results[folder.name] = train_set(folder, Path(tmp), args.seed)
            print(f"{folder.name}: {results[folder.name]} ({time.perf_counter() - t:.0f} s)", flush=True)
    if args.demo:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            _routeopt(["run"], Path(tmp))
            results["demo"] = policy_hashes(Path(tmp) / ".routeopt" / "registry")
            print(f"demo: {results['demo']} ({time.perf_counter() - t:.0f} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def _make_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)


if __name__ == "__main__":
    main()
