"""Wheels the GPU machine lacks for `benchmarks/gpu_check.sh`, gathered here, where pip works.

The device image (Python 3.12) has torch, transformers, numpy, pandas, pyarrow, scikit-learn,
scipy, jinja2, pyyaml, rich, httpx... but not prefect, duckdb, pydantic or cryptography, and it
cannot fetch anything. This downloads, for its platform, the versions installed on this machine
(so the pairs that the tests passed with), keeps only what the image lacks and the gpu_check path
imports, and writes them to `.whl/` (git-ignored), which a device call carries. The working tree
plus the wheels must fit in the 64 MiB a call may carry; the script prints the total.

`--check` runs `gpu_check.py --device cpu --tiny` here with every module made unimportable that
the device would not have (neither in the image nor in `.whl/`), so a missing wheel shows up
here rather than in the device's 15 minutes. That is how NEVER_IMPORTED was chosen: prefect
requires those packages, but neither gpu_check nor `routeopt run` (with its Prefect server)
imports them; the server does need asyncpg, redis and burner_redis.

    python benchmarks/gpu_wheels.py && python benchmarks/gpu_wheels.py --check
    # then on the device, carrying .whl:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && \\
        bash benchmarks/gpu_check.sh --out $OUT/gc
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The device image's packages, as /work/.library/device/KINDS.md listed them on 2026-11-17.
IMAGE = set(
    """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()
)
NEEDED = ("prefect", "duckdb", "pydantic", "cryptography")  # what gpu_check's path imports
# prefect requires these; gpu_check and `routeopt run` run without them (`--check` says so)
NEVER_IMPORTED = {
    "amplitude-analytics",
    "apprise",
    "cyclopts",
    "dateparser",
    "docker",
    "docstring-parser",
    "jsonpatch",
    "oauthlib",
    "readchar",
    "requests-oauthlib",
    "rich-rst",
    "semver",
}
PLATFORMS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
BUDGET_BYTES = 64 * 2**20
DEVICE_COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
    "--upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD "
    "&& bash benchmarks/gpu_check.sh --out $OUT/gc"
)


def project(wheel: str) -> str:
    """A wheel file's normalised project name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def tree_bytes() -> int:
    """Bytes of the files a device call carries besides the wheels: tracked + untracked ones."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return sum((REPO / p).stat().st_size for p in out.decode().split("\0") if p and (REPO / p).is_file())


def download(dest: Path) -> None:
    pins = [f"{name}=={metadata.version(name)}" for name in NEEDED]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "-d",
        str(dest),
        *pins,
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)


def _requires(dist: metadata.Distribution) -> set[str]:
    """Names of what a distribution requires unconditionally (extras and markers for other
    platforms left out)."""
    from packaging.requirements import Requirement

    names = set()
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.add(re.sub(r"[-_.]+", "-", req.name).lower())
    return names


def absent_modules(wheels: Path) -> set[str]:
    """Top-level modules installed here that the device would not have: their distribution is
    neither in the image nor among the wheels, nor a dependency (as installed here) of one that
    is, since the image's own versions bring their own dependencies."""
    dists = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d for d in metadata.distributions()}
    present = {n for n in dists if n in IMAGE} | {project(w.name) for w in wheels.glob("*.whl")}
    todo = [n for n in present if n in IMAGE]
    while todo:  # the image's packages, as installed here, and what they pull in
        for dep in _requires(dists[todo.pop()]):
            if dep in dists and dep not in present:
                present.add(dep)
                todo.append(dep)
    present.add("routeopt")
    kept = {m for n in present if n in dists for m in _top_level(dists[n])}
    gone = {m for n, d in dists.items() if n not in present for m in _top_level(d)}
    return gone - kept - {"_distutils_hack", "pkg_resources", "setuptools"}


def _top_level(dist: metadata.Distribution) -> set[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return set(text.split())
    tops = set()
    for f in dist.files or []:
        head = str(f).split("/")[0]
        name = head[:-3] if head.endswith(".py") else head
        if name.isidentifier() and not head.endswith((".dist-info", ".egg-info")):
            tops.add(name)
    return tops


def check(wheels: Path) -> int:
    """Run gpu_check's CPU path with the modules the device lacks made unimportable."""

    gone = sorted(absent_modules(wheels))
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(
            "import sys\n"
            f"GONE = {set(gone)!r}\n\n"
            "class _NotOnTheDevice:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in GONE:\n"
            "            raise ModuleNotFoundError(f'not on the device: {name}', name=name)\n\n"
            "sys.meta_path.insert(0, _NotOnTheDevice())\n"
        )
        env = {**os.environ, "PYTHONPATH": f"{tmp}:{REPO}"}
        out = Path(tmp) / "gc"
        print(f"gpu_check --device cpu --tiny with {len(gone)} modules unimportable", flush=True)
        rc = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "gpu_check.py"),
                "--device",
                "cpu",
                "--tiny",
                "--out",
                str(out),
            ],
            env=env,
        ).returncode
        report = out / "gpu_check.md"
        missing = sorted(
            set(re.findall(r"not on the device: ([\w.]+)", report.read_text() if report.exists() else ""))
        )
    print(f"gpu_check exit {rc}" + (f"; missing on the device: {missing}" if missing else ""))
    return rc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / ".whl")
    ap.add_argument(
        "--check",
        action="store_true",
        help="do not download: run gpu_check's CPU path as the device would import",
    )
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args.out))
    exclude = REPO / ".git" / "info" / "exclude"
    if exclude.parent.is_dir() and "/.whl/" not in exclude.read_text().split():
        with exclude.open("a") as fh:
            fh.write("/.whl/\n")
    staging = args.out.with_name(args.out.name + ".all")
    shutil.rmtree(staging, ignore_errors=True)
    download(staging)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    for wheel in sorted(staging.glob("*.whl")):
        if project(wheel.name) not in IMAGE | NEVER_IMPORTED:
            shutil.move(str(wheel), args.out / wheel.name)
    shutil.rmtree(staging)
    kept = sum(w.stat().st_size for w in args.out.glob("*.whl"))
    total = kept + tree_bytes()
    print(
        f"{len(list(args.out.glob('*.whl')))} wheels, {kept / 2**20:.1f} MiB; with the working "
        f"tree {total / 2**20:.1f} MiB of {BUDGET_BYTES / 2**20:.0f} MiB"
    )
    if total > BUDGET_BYTES:
        sys.exit("too large to carry: leave out more (see NEVER_IMPORTED) or shrink the tree")
    print(f"device command (carry ['.whl']):\n  {DEVICE_COMMAND}")


if __name__ == "__main__":
    main()
