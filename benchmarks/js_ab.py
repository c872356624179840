"""Decision latency of the JavaScript gateway before and after a change, in one process.

On these shared machines a figure moves by a third between minutes, so a change is judged by
running the old and the new build side by side on the same requests, alternating which goes
first (gateways/js/bench/ab.mjs), not by two runs of js_latency.py. The base build is
`--base` (a git revision) built in a temporary worktree; the new one is this checkout. Both route
the RouterBench policy of this checkout (benchmarks/js_common.py) unless `--base-policy` names
another version folder (to compare two policies with one build, give `--base HEAD` and it).

    python benchmarks/js_ab.py --base HEAD~1 [--rounds 9] [--set routerbench]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from js_common import JS, ROOT, build_js, load_average, node, published, requests_file, test_requests


def build_at(rev: str, into: Path) -> Path:
    """gateways/js of `rev`, built in a worktree under `into` with this checkout's node_modules."""
    tree = into / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), rev],
        check=True,
        capture_output=True,
    )
    js = tree / "gateways" / "js"
    (js / "node_modules").symlink_to(JS / "node_modules")
    subprocess.run(["npm", "run", "build"], cwd=js, check=True, capture_output=True)
    return js / "dist"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD~1", help="git revision of the base build")
    ap.add_argument("--base-policy", type=Path, help="version folder the base build routes with")
    ap.add_argument("--set", default="routerbench")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    build_js()
    version, key = published(args.set)
    requests = test_requests(args.set)
    print(load_average())
    with tempfile.TemporaryDirectory() as tmp:
        try:
            base = build_at(args.base, Path(tmp))
            path = requests_file(requests, Path(tmp))
            out = node(
                "bench/ab.mjs",
                str(base),
                str(JS / "dist"),
                str(args.base_policy or version),
                str(version),
                str(path),
                str(args.rounds),
                public_key=None if args.base_policy else key,
            )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(tmp) / "tree")],
                capture_output=True,
            )
    a, b = (json.loads(line) for line in out.splitlines())
    print(
        f"{args.set}: {len(requests)} requests per round, {args.rounds} rounds, alternating (medians of rounds)"
    )
    for name, r in ((f"base ({args.base})", a), ("this checkout", b)):
        print(
            f"  {name:24s} p50 {r['p50_us']:6.1f} us   p99 {r['p99_us']:6.1f} us   longest 10 {r['longest10_us']:6.1f} us"
        )
    print(
        f"  ratio (this / base)      p50 {b['p50_us'] / a['p50_us']:6.3f}      p99 {b['p99_us'] / a['p99_us']:6.3f}      "
        f"longest 10 {b['longest10_us'] / a['longest10_us']:6.3f}"
    )
    print(load_average())


if __name__ == "__main__":
    main()
