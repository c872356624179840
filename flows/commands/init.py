"""`routeopt init`: a starter project a user edits, instead of YAML copied out of the docs."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

STARTER_CONFIG = """\
# routeopt's config: the candidate models, where the suites are, and where results go.
# Paths are relative to this file. `routeopt run` in this folder reads it.
#
# The three candidates below are the demo fleet: tiny Llama models trained by routeopt itself
# (models/zoo/), run in-process on the CPU, so this project runs as it is, with no key.
# Replace them with your own. Keys come from the environment variable a candidate names,
# never from this file:
#
#  - {name: gpt-4o-mini, provider: openai, model: gpt-4o-mini, api_key_env: OPENAI_API_KEY,
#     input_price_per_mtok: 0.15, output_price_per_mtok: 0.60, max_concurrency: 64}
#  - {name: claude-haiku, provider: anthropic, model: claude-3-5-haiku-latest,
#     api_key_env: ANTHROPIC_API_KEY, input_price_per_mtok: 0.8, output_price_per_mtok: 4}
#  - {name: llama-8b, provider: openai, model: meta-llama/Llama-3.1-8B-Instruct,
#     base_url: http://vllm.internal:8000/v1, gpu_hour_usd: 2.5}   # vLLM, TGI, any compatible server
candidates:
  - {name: zoo-s, provider: local, model: models/zoo/zoo-s, variant: fp32, gpu_hour_usd: 0.50,
     gpu_tokens_per_s: 50000}
  - {name: zoo-m, provider: local, model: models/zoo/zoo-m, variant: fp32, gpu_hour_usd: 1.00,
     gpu_tokens_per_s: 30000}
  - {name: zoo-l, provider: local, model: models/zoo/zoo-l, variant: fp32, gpu_hour_usd: 2.00,
     gpu_tokens_per_s: 20000}

suites_dir: suites              # one YAML file per suite: see suites/sort.yaml
db_path: .routeopt/routeopt.duckdb
registry_dir: .routeopt/registry    # or s3://bucket/prefix, where gateways pull policies from

router:
  quality_target: 0.95          # the router keeps 95% of the best single model's pass rate
  holdout_fraction: 0.3
  seed: 0
"""

STARTER_SUITE = """\
# One eval suite: a dataset, a prompt template, how to generate, and how to grade.
# `routeopt suites validate` checks every suite; docs/adding-a-suite.md lists every grader.
name: sort
description: Sort a string of 2 to 7 digits ascending (one of the demo fleet's tasks).
dataset:
  path: ../data/sort.jsonl      # JSONL, CSV, Parquet or a Hugging Face dataset
  id_field: id
prompt:
  template: "sort: {{ input }}="
generation:
  max_tokens: 12
  temperature: 0.0
grader:
  type: exact_match
  target: "{{ answer }}"
"""


def demo_dir() -> Path:
    """The demo shipped in the package: its config, suites' data and model checkpoints."""
    from routeopt.evals.config import DEMO_CONFIG

    return DEMO_CONFIG.parent


def write_starter(folder: Path, force: bool = False) -> list[Path]:
    """Write the starter project into `folder`; refuse to overwrite a file unless `force`."""
    demo = demo_dir()
    files = {folder / "routeopt.yaml": STARTER_CONFIG, folder / "suites" / "sort.yaml": STARTER_SUITE}
    data = folder / "data" / "sort.jsonl"
    zoo = folder / "models" / "zoo"
    existing = [p for p in (*files, data, zoo) if p.exists()]
    if existing and not force:
        raise click.ClickException(
            f"{existing[0]} already exists; pass --force to overwrite the starter files"
        )
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    data.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(demo.parent / "data" / "sort.jsonl", data)
    for name in ("zoo-s", "zoo-m", "zoo-l"):
        shutil.copytree(demo / "zoo" / name, zoo / name, dirs_exist_ok=True)
    return [*files, data, zoo]


@click.command("init")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default=Path("."))
@click.option("--force", is_flag=True, help="Overwrite starter files that already exist.")
def init(folder: Path, force: bool) -> None:
    """Write a starter project into FOLDER (default: here): a routeopt.yaml, one suite and its
    data, and the demo fleet's checkpoints, so `routeopt run` works there at once."""
    for path in write_starter(folder, force):
        click.echo(f"wrote {path}")
    where = "" if folder.resolve() == Path.cwd().resolve() else f"cd {folder} && "
    click.echo(f"next: {where}routeopt run   (then edit routeopt.yaml: your candidates, your suites)")
