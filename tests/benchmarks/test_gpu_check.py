"""benchmarks/gpu_check.py: its pieces, and its CPU path end to end (`--device cpu --tiny`).

The real run needs an NVIDIA GPU; that test is marked `gpu` and skipped without CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import duckdb
import pytest

from tests import REPO
from tests.benchmarks import load

gc = load("gpu_check")


@pytest.mark.parametrize(
    "name,tbs",
    [
        ("NVIDIA H200", 4.8),
        ("NVIDIA H100 80GB HBM3", 3.35),
        ("NVIDIA H100 PCIe", 2.0),
        ("NVIDIA A100-SXM4-80GB", 2.039),
        ("NVIDIA L4", 0.3),
        ("NVIDIA GH200 480GB", 4.0),
        ("Some Future GPU", None),
    ],
)
def test_bandwidth_table(name, tbs):
    assert gc.bandwidth_tbs(name) == tbs
    assert gc.bandwidth_tbs(name, override=1.5) == 1.5


def test_tokenizer_has_the_model_vocab_and_round_trips():
    tok = gc.build_tokenizer(32000, 4096)
    assert len(tok) == 32000
    ids = list(range(4, 32000, 997))
    text = tok.decode(ids)
    assert tok(text, add_special_tokens=False)["input_ids"] == ids
    assert tok("add: 1+2=", add_special_tokens=False)["input_ids"] == [
        tok.convert_tokens_to_ids(c) for c in "add: 1+2="
    ]


def _expected_weight_bytes(a: dict, per_param: int) -> int:
    h, i, v, layers = a["hidden_size"], a["intermediate_size"], a["vocab_size"], a["num_hidden_layers"]
    kv = h // a["num_attention_heads"] * a["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return per_param * (layers * per_layer + h + v * h)  # + final norm + lm_head, no embedding


def test_checkpoint_and_weight_bytes(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    info = gc.build_checkpoint(tmp_path / "ck", gc.ARCH_TINY)
    model = AutoModelForCausalLM.from_pretrained(info["path"], dtype=torch.bfloat16)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.vocab_size) == (64, 2, 512)
    assert model.lm_head.weight[:4].abs().sum() == 0  # pad/bos/eos/unk can never be chosen
    want = _expected_weight_bytes(gc.ARCH_TINY, 2)
    got = gc.weight_bytes_per_token(model)
    assert want <= got <= want + 4096  # plus the rotary frequency buffer


def test_decode_vs_bandwidth_arithmetic():
    level = SimpleNamespace(concurrency=1, tpot_s={"p50": 0.01})
    report = SimpleNamespace(levels=[SimpleNamespace(concurrency=8, tpot_s={"p50": 1.0}), level])
    out = gc.decode_vs_bandwidth(report, wbytes=2_000_000_000, bw_tbs=4.0, raw_tok_s=500.0)
    assert out["limit_tok_s"] == pytest.approx(2000.0)
    assert out["provider_batch1_tok_s"] == pytest.approx(100.0)
    assert out["provider_ratio"] == pytest.approx(0.05)
    assert out["forward_loop_ratio"] == pytest.approx(0.25)
    assert gc.decode_vs_bandwidth(report, 10, None, None)["provider_ratio"] is None


def test_cuda_request_without_cuda_is_one_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(SystemExit, match="--device cpu --tiny"):
        gc.check_device("cuda")


def test_cpu_tiny_end_to_end(tmp_path):
    out = tmp_path / "gc"
    res = gc.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
            "--skip-pipeline",
            "--concurrency",
            "1,3",
            "--requests",
            "3",
            "--raw-steps",
            "4",
            "--bandwidth-tbs",
            "0.05",
            "--static-compile",
            "bf16",
        ]
    )
    assert [v["variant"] for v in res["variants"]] == ["bf16", "fp8", "fp8-dyn"]
    for v in res["variants"]:
        assert "error" not in v, v
        levels = v["serving"]["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 3]
        for lv in levels:
            assert lv["errors"] == 0 and lv["max_in_flight"] == lv["concurrency"]
            assert lv["mean_output_tokens"] == 8  # every request decodes exactly max_tokens
        by_c = v["engine"]["by_concurrency"]
        assert by_c[1]["max_batch"] == 1 and by_c[3]["max_batch"] <= 3
        assert by_c[3]["mean_batch"] > 1  # three requests in flight share decode steps
        bw = v["bandwidth"]
        assert bw["limit_tok_s"] == pytest.approx(0.05e12 / bw["weight_bytes_per_token"])
        assert bw["provider_ratio"] > 0
    bf16, fp8, dyn = (v["bandwidth"] for v in res["variants"])
    # the static-cache path (compiled only on GPUs) ran for bf16 alone
    assert bf16["static_compiled_batch1_tok_s"] > 0 and bf16["static_compiled_ratio"] > 0
    assert "static_compiled_batch1_tok_s" not in fp8
    assert fp8["weight_bytes_per_token"] != bf16["weight_bytes_per_token"]
    assert dyn["weight_bytes_per_token"] == fp8["weight_bytes_per_token"]  # same stored weights
    # what ran, asked of each loaded model: 7 Linears in each of 2 layers, lm_head unquantized
    assert [v["kernels_batch1"] for v in res["variants"]] == [{}, {"dequant": 14}, {"scaled_mm": 14}]
    report = (out / "gpu_check.md").read_text()
    assert "torch._scaled_mm" in report and "scaled_mm x14" in report
    assert "Activations and unquantized layers: float32" in report
    stored = json.loads((out / "gpu_check.json").read_text())
    assert stored["variants"][0]["candidate"] == "rand-tiny-bf16"
    assert "of the limit" in (out / "gpu_check.md").read_text()
    assert "mean decode batch (rows per engine step) by concurrency: c=1: 1.0, c=3: " in report
    con = duckdb.connect(str(out / "serving.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT candidate, count(*) FROM serving_runs WHERE candidate NOT LIKE "
        "'%-spec-%' AND candidate NOT LIKE '%-prefix-%' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    spec_rows = con.execute(
        "SELECT candidate, concurrency, acceptance_rate FROM serving_runs "
        "WHERE candidate LIKE '%-spec-%' ORDER BY 1, 2"
    ).fetchall()
    con.close()
    assert rows == [("rand-tiny-bf16", 2), ("rand-tiny-fp8", 2), ("rand-tiny-fp8-dyn", 2)]
    assert len(spec_rows) == 8 and ("rand-tiny-spec-self", 3, 1.0) in spec_rows
    _check_levers(res, report)


def _check_levers(res: dict, report: str) -> None:
    """Speculative decoding with three drafts, and prefix caching off and on."""
    spec = res["speculative"]
    runs = {r["draft"]: r for r in spec["runs"]}
    assert list(runs) == ["target alone", "self", "first-1-layers", "small-random"]
    assert not spec["skipped"] and all("error" not in r for r in runs.values())
    for r in runs.values():
        assert [lv["concurrency"] for lv in r["levels"]] == [1, 3]
        assert all(lv["errors"] == 0 and lv["speedup"] > 0 for lv in r["levels"])
    assert all(lv["acceptance_rate"] is None for lv in runs["target alone"]["levels"])
    for lv in runs["self"]["levels"]:  # greedy self-drafting: every proposal is accepted
        assert lv["acceptance_rate"] == 1.0 and lv["mean_accepted_length"] == 5.0
    assert all(lv["acceptance_rate"] < 0.2 for lv in runs["small-random"]["levels"])
    assert all(0 <= lv["acceptance_rate"] <= 1 for lv in runs["first-1-layers"]["levels"])
    sizes = spec["weight_bytes"]
    assert sizes["self"] == sizes["target alone"] > sizes["first-1-layers"] > 0
    assert "weights on the device (the draft's are added to the target's)" in report
    off, on = res["prefix_cache"]["runs"]
    assert (off["prefix_cache"], on["prefix_cache"]) == (False, True)
    for a, b in zip(off["levels"], on["levels"]):
        assert a["prompt_tokens"] == b["prompt_tokens"] == a["prefilled"] and a["reused"] == 0
        assert b["reused"] == b["prompt_tokens"] - b["prefilled"] > 0.8 * b["prompt_tokens"]
    assert "## Speculative decoding (bf16 target)" in report and "| self | 3 |" in report
    assert "## Prefix caching (bf16)" in report and "| on | 3 |" in report


@pytest.mark.slow
def test_shell_script_runs_the_pipeline_on_cpu(tmp_path, prefect_api):
    """The wrapper script, including `routeopt run` of the generated suite (reporting to the
    session's Prefect server); the levers are test_cpu_tiny_end_to_end's."""
    out = tmp_path / "gc"
    env = dict(os.environ, OMP_NUM_THREADS="1", PREFECT_API_URL=prefect_api)
    proc = subprocess.run(
        [
            "bash",
            str(REPO / "benchmarks" / "gpu_check.sh"),
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
            "--variants",
            "bf16",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--raw-steps",
            "2",
            "--skip-levers",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    pipe = res["pipeline"]
    assert pipe["rc"] == 0, pipe["output_tail"]
    by_name = {o["candidate"]: o for o in pipe["outcomes"]}
    assert by_name["rand-tiny-bf16"]["items"] == 6 and by_name["rand-tiny-bf16"]["errors"] == 0


@pytest.mark.gpu
def test_gpu_tiny_run(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (torch sees none)")
    res = gc.main(
        [
            "--device",
            "cuda",
            "--tiny",
            "--out",
            str(tmp_path / "gc"),
            "--skip-pipeline",
            "--concurrency",
            "1,4",
            "--requests",
            "4",
        ]
    )
    assert all("error" not in v for v in res["variants"]), res["variants"]
    assert res["variants"][0]["bandwidth"]["provider_ratio"] is not None
