"""Quantized Linear kernels against their dequantizing fallback, per layer shape, rows and dtype.

Each row times one `routeopt.evals.providers.local.quantize` module's matmul both ways (`_matmul(x, kernel)`, the call
forward makes), interleaved and best of several rounds, so background load hits both alike.
`INT8PACK_MAX_ROWS` in evals/providers/local/quantize.py comes from the int8 rows of this table on CPU.

    python benchmarks/quant_kernels.py                  # int8 weight-only and both -dyn variants
    python benchmarks/quant_kernels.py --modules Int8Linear --threads 1
    python benchmarks/quant_kernels.py --device cuda    # the same table on a GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from routeopt.evals.providers.local.quantize import Fp8DynLinear, Int8DynLinear, Int8Linear  # noqa: E402

FUSED = {Int8Linear: "int8pack", Int8DynLinear: "int_mm", Fp8DynLinear: "scaled_mm"}


def best_us(fns: list[Callable[[], object]], rounds: int, sync: Callable[[], None]) -> list[float]:
    """Best mean time per call (us) of each fn, rounds interleaved; ~50 ms of calls a round."""
    for fn in fns:
        fn(), fn()
    sync()
    t0 = time.perf_counter()
    fns[0]()
    sync()
    n = max(3, int(0.05 / max(time.perf_counter() - t0, 1e-7)))
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            best[i] = min(best[i], (time.perf_counter() - t0) / n)
    return [b * 1e6 for b in best]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="2048,256", help="square layer sizes")
    ap.add_argument("--rows", default="1,8,16,32")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--modules", default=",".join(c.__name__ for c in FUSED))
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads")
    print("| module | layer | dtype | rows | dequant us | fused us | fused kernel | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for cls, fused in FUSED.items():
        if cls.__name__ not in args.modules.split(","):
            continue
        for size in (int(s) for s in args.sizes.split(",")):
            torch.manual_seed(0)
            mod = cls.from_linear(nn.Linear(size, size, bias=False)).to(dev)
            for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
                for rows in (int(r) for r in args.rows.split(",")):
                    x = torch.randn(rows, size, dtype=dtype, device=dev)
                    try:
                        slow, fast = best_us(
                            [partial(mod._matmul, x, "dequant"), partial(mod._matmul, x, fused)],
                            args.rounds,
                            sync,
                        )
                    except RuntimeError as exc:
                        print(
                            f"| {cls.__name__} | {size}x{size} | {dtype} | {rows} | - | - | "
                            f"{fused}: {str(exc).splitlines()[0][:60]} | - |"
                        )
                        continue
                    print(
                        f"| {cls.__name__} | {size}x{size} | {str(dtype)[6:]} | {rows} | "
                        f"{slow:,.1f} | {fast:,.1f} | {fused} | x{slow / fast:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
