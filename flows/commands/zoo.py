"""`routeopt zoo`: build and inspect the demo fleet of tiny self-trained models."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group("zoo")
def zoo() -> None:
    """The demo fleet: real tiny Llama models trained here on synthetic tasks."""


@zoo.command("build")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("zoo"),
    show_default=True,
    help="Where checkpoints are written (the demo config reads evals/demo/zoo/).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds data and training.")
@click.option(
    "--threads",
    type=int,
    default=1,
    show_default=True,
    help="torch CPU threads; keep it fixed for bit-identical rebuilds.",
)
@click.option(
    "--jobs",
    type=int,
    default=2,
    show_default=True,
    help="Models trained in parallel processes (one thread each by default).",
)
@click.option(
    "--only",
    multiple=True,
    help="Rebuild just these models (e.g. --only zoo-s); "
    "the others keep their checkpoints and measured info.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write the held-out eval datasets (<task>.jsonl) here.",
)
def build(
    out_dir: Path, seed: int, threads: int, jobs: int, only: tuple[str, ...], data_dir: Path | None
) -> None:
    """Train zoo-s, zoo-m and zoo-l, save them and print held-out pass rates."""
    from routeopt.evals.selfhost.zoo import build_zoo, write_eval_data

    if data_dir is not None:
        for task, path in write_eval_data(data_dir, seed).items():
            click.echo(f"wrote {task} eval data to {path}")
    try:
        info = build_zoo(out_dir, seed=seed, threads=threads, log=click.echo, only=only or None, jobs=jobs)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    click.echo(format_info(info))


@zoo.command("info")
@click.option(
    "--dir",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A zoo folder; by default the demo's, shipped in the package.",
)
def info(out_dir: Path | None) -> None:
    """Print what the last build measured (zoo_info.json)."""
    if out_dir is None:
        from routeopt.evals.config import DEMO_CONFIG

        out_dir = DEMO_CONFIG.parent / "zoo"
    path = out_dir / "zoo_info.json"
    if not path.exists():
        raise click.ClickException(f"{path}: not found; run `routeopt zoo build --out {out_dir}`")
    click.echo(format_info(json.loads(path.read_text())))


def format_info(info: dict) -> str:
    """A pass-rate table: one row per model x task, one column per difficulty."""
    lines = []
    for name, m in info["models"].items():
        lines.append(
            f"{name}: {m['params']:,} params, trained in {m['train_s']}s ({m.get('threads', '?')} thread(s))"
        )
        for task, row in m["pass_rates"].items():
            ordered = sorted(row.items(), key=lambda kv: int(kv[0]))
            cells = " ".join(f"d{d}={float(v):.2f}" for d, v in ordered)
            lines.append(f"  {task:8s} {cells}")
    if "total_s" in info:
        wall = f"{info['wall_s']}s wall with {info.get('jobs', 1)} job(s); " if "wall_s" in info else ""
        lines.append(f"build time: {wall}{info['total_s']}s summed over models")
    return "\n".join(lines)
