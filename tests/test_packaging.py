"""What a user installs: one import name, the demo inside the wheel, and a starter project.

The wheel test builds the wheel from this checkout, installs it in a clean virtualenv beside
OpenAI's `evals` and the `common` distribution (two of the generic names routeopt once put into
site-packages), and runs the demo from an empty folder, as a platform team's image would: it
prints, figure for figure, the sample output the README's quickstart shows.
"""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
import tomllib
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest
from click.testing import CliRunner

from routeopt.evals.config import DEMO_CONFIG, default_config_path, load_config
from routeopt.evals.suite.spec import load_suite
from routeopt.flows.cli import cli
from tests import FOLDERS, REPO
from tests.installer import install, make_venv
from tests.test_readme_sample import README, sample_window, figures, readme_sample


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_and_mapped() -> None:
    """The wheel's package list is explicit (the stage folders are mapped under `routeopt.`):
    a new sub-package left out of it would be missing from every install."""
    conf = _setuptools()
    assert {k: REPO / v for k, v in conf["package-dir"].items()} == FOLDERS
    on_disk = set()
    for package, folder in FOLDERS.items():
        for init in folder.rglob("__init__.py"):
            parts = init.parent.relative_to(folder).parts
            if package == "routeopt" and parts and f"routeopt.{parts[0]}" in FOLDERS:
                continue  # a mapped folder of its own
            on_disk.add(".".join((package, *parts)))
    assert set(conf["packages"]) == on_disk


def test_the_demo_and_its_data_are_package_data() -> None:
    """Every file the demo reads (config, suites, datasets, checkpoints) lives inside the
    package and matches a package-data pattern."""
    patterns = _setuptools()["package-data"]["routeopt.evals"]
    evals = FOLDERS["routeopt.evals"]
    for sub in ("demo", "suites", "data"):
        for path in (evals / sub).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(evals)
                assert any(fnmatch(str(rel), p.replace("**/", "")) for p in patterns), (
                    f"{rel} is not package data"
                )
    assert DEMO_CONFIG.is_relative_to(evals)


def test_the_packaged_demo_keeps_its_state_in_the_current_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROUTEOPT_CONFIG", raising=False)
    assert default_config_path() == DEMO_CONFIG
    cfg = load_config(DEMO_CONFIG)
    assert cfg.db_path == tmp_path.resolve() / ".routeopt" / "routeopt.duckdb"
    assert cfg.registry_dir.is_relative_to(tmp_path.resolve())
    assert cfg.signing_key_path().is_relative_to(tmp_path.resolve())
    assert cfg.suites_dir == (REPO / "evals" / "suites").resolve()
    assert all(Path(c.model).is_dir() for c in cfg.candidates)  # checkpoints found beside it


def test_init_writes_a_project_that_loads_and_refuses_to_overwrite(tmp_path) -> None:
    runner = CliRunner()
    done = runner.invoke(cli, ["init", str(tmp_path / "proj")])
    assert done.exit_code == 0, done.output
    cfg = load_config(tmp_path / "proj" / "routeopt.yaml")
    assert [c.name for c in cfg.candidates] == ["zoo-s", "zoo-m", "zoo-l"]
    assert all((Path(c.model) / "model.safetensors").is_file() for c in cfg.candidates)
    assert cfg.db_path.is_relative_to(tmp_path / "proj")
    suite = load_suite(cfg.suites_dir / "sort.yaml", cfg)
    assert len(suite.items) == 400
    again = runner.invoke(cli, ["init", str(tmp_path / "proj")])
    assert again.exit_code != 0 and "already exists" in again.output and "--force" in again.output
    assert runner.invoke(cli, ["init", str(tmp_path / "proj"), "--force"]).exit_code == 0


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.slow  # builds a wheel and a virtualenv with the pipeline's dependencies
@pytest.mark.timeout(3600)  # about 570 packages to install: with pip on a busy machine, long
def test_the_wheel_runs_the_demo_from_an_empty_folder_beside_evals_and_common(tmp_path) -> None:
    dist = tmp_path / "dist"
    # the bytecode a checkout gathers where Python writes it (a test run, a custom grader
    # imported), in a folder the package data takes whole: it must stay out of the wheel
    py_compile.compile(str(REPO / "evals" / "suites" / "examples" / "example_graders.py"), doraise=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    wheel = next(dist.glob("routeopt-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"routeopt", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]

    venv = make_venv(tmp_path / "venv")
    # as a user's shell has it: no test settings, no forced colour, an 80-column terminal
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "ROUTEOPT_"))
        and k not in ("PYTHONPATH", "VIRTUAL_ENV", "FORCE_COLOR")
    }
    env["COLUMNS"] = "80"
    installed = install(venv, f"{wheel}[local]", "evals", "common", timeout=1800, env=env, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    site = next((venv / "lib").glob("python3*/site-packages"))
    before = _tree(site / "routeopt")

    empty = tmp_path / "empty"
    empty.mkdir()
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    run = subprocess.run(
        [str(venv / "bin" / "routeopt"), "run", "--no-progress"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "published policy v1" in run.stdout
    sample = readme_sample(README.read_text(encoding="utf-8"))  # what the README says it prints
    ran = sample_window(run.stdout + "\n" + run.stderr, sample)
    assert figures(sample) == figures(ran), (
        "README.md's sample output differs from a run of the demo; paste this run's output:\n" + ran
    )
    assert (empty / ".routeopt" / "routeopt.duckdb").is_file()
    assert list((empty / ".routeopt" / "registry" / "versions").iterdir())
    assert _tree(site / "routeopt") == before  # nothing written into site-packages

    env["OPENAI_API_KEY"] = "sk-not-used"  # OpenAI's evals makes an OpenAI client when imported
    both = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import json, common, evals, routeopt.evals.config as ours; "
            "print(json.dumps([common.__file__, evals.__file__, ours.__file__]))",
        ],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert both.returncode == 0, both.stderr[-2000:]
    common_file, evals_file, ours_file = map(Path, json.loads(both.stdout))
    assert common_file.is_relative_to(site / "common") and evals_file.is_relative_to(site / "evals")
    assert ours_file.is_relative_to(site / "routeopt")

    starter = subprocess.run(
        [str(venv / "bin" / "routeopt"), "init", "proj"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert starter.returncode == 0, starter.stderr
    checked = subprocess.run(
        [str(venv / "bin" / "routeopt"), "suites", "validate"],
        cwd=empty / "proj",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_webassembly_kernel_is_package_data_of_both_distributions() -> None:
    """The gateway's kernel (router_training/policy/kernel.wasm) ships in the wheel and in the
    gateway-only install, whose decisions would otherwise silently take the numpy path."""
    gateway = tomllib.loads((REPO / "gateways" / "python" / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    for conf in (_setuptools(), gateway):
        assert conf["package-data"]["routeopt.router_training.policy"] == ["kernel.wasm"]
    assert (FOLDERS["routeopt.router_training"] / "policy" / "kernel.wasm").is_file()
