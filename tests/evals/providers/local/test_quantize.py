"""Quantized variants: each Linear must track the fp32 module closely, take the fused kernel
where one applies (spied: what it was sent), and the dequantizing fallback where none does."""

from __future__ import annotations

import copy
from typing import Any, get_args

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from routeopt.evals.config import Variant  # noqa: E402
from routeopt.evals.providers.local.quantize import (  # noqa: E402
    INT8PACK_MAX_ROWS,
    VARIANTS,
    Fp8DynLinear,
    Fp8Linear,
    Int8DynLinear,
    Int8Linear,
    QuantizeError,
    apply_variant,
    compute_dtype,
    fp8_supported,
    kernel_counts,
    kernel_runs,
    quantize_linears,
)

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: the GPU kernels' own rules"
)


@pytest.fixture(autouse=True)
def _fresh_kernel_probes():
    """Each test probes the kernels anew, so one that breaks an op cannot leak into the next."""
    kernel_runs.cache_clear()
    yield
    kernel_runs.cache_clear()


def _linear(seed: int = 0, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(64, 48, bias=bias)
    with torch.no_grad():
        lin.weight[3] *= 20.0  # one loud channel: per-channel scales must keep the others precise
    return lin


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).norm() / b.norm()).detach())


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_matches_fp32(bias: bool) -> None:
    lin = _linear(bias=bias)
    q = Int8Linear.from_linear(lin)
    x = torch.randn(5, 7, 64)
    assert q.qweight.dtype == torch.int8
    assert _rel_err(q(x), lin(x)) < 0.01
    # per-channel rounding error is at most half a step of that channel's scale
    step = q.scale[:, None]
    assert torch.all((q.dequantized() - lin.weight).abs() <= step / 2 + 1e-7)


def test_int8_quiet_channel_keeps_precision() -> None:
    lin = _linear()
    q = Int8Linear.from_linear(lin)
    quiet = [i for i in range(48) if i != 3]
    x = torch.randn(32, 64)
    assert _rel_err(q(x)[:, quiet], lin(x)[:, quiet]) < 0.01


def test_fp8_linear_matches_fp32() -> None:
    lin = _linear()
    q = Fp8Linear.from_linear(lin)
    x = torch.randn(9, 64)
    assert q.qweight.dtype == torch.float8_e4m3fn
    err = _rel_err(q(x), lin(x))
    assert 0 < err < 0.05  # e4m3 has 3 mantissa bits: visibly lossy, still close


def test_zero_weight_row_is_safe() -> None:
    lin = _linear()
    with torch.no_grad():
        lin.weight[0] = 0
    for cls in (Int8Linear, Fp8Linear):
        out = cls.from_linear(lin)(torch.randn(2, 64))
        assert torch.isfinite(out).all()


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.lm_head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.body(x))


@pytest.mark.parametrize(
    "variant,cls",
    [("int8", Int8Linear), ("fp8", Fp8Linear), ("int8-dyn", Int8DynLinear), ("fp8-dyn", Fp8DynLinear)],
)
def test_quantize_linears_replaces_all_but_head(variant: str, cls: type) -> None:
    torch.manual_seed(1)
    model = _Tiny()
    x = torch.randn(4, 16)
    ref = model(x)
    assert quantize_linears(model, variant) == 2
    assert isinstance(model.body[0], cls) and isinstance(model.body[2], cls)
    assert isinstance(model.lm_head, nn.Linear)
    assert _rel_err(model(x), ref) < (0.02 if variant.startswith("int8") else 0.08)


@pytest.mark.parametrize(
    "variant,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)]
)
def test_cast_variants(variant: str, dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    model = _Tiny()
    x = torch.randn(4, 16)
    ref = model(x)
    model = apply_variant(model, variant, "cpu")
    assert next(model.parameters()).dtype == dtype
    assert _rel_err(model(x.to(dtype)).float(), ref) < 0.02


@pytest.mark.parametrize("variant", ["int8", "fp8", "int8-dyn", "fp8-dyn"])
def test_quantized_variants_compute_in_bf16_on_gpus_and_fp32_on_cpus(variant: str) -> None:
    assert compute_dtype(variant, "cuda:0") == torch.bfloat16
    assert compute_dtype(variant, "cpu") == torch.float32
    model = apply_variant(_Tiny(), variant, "cpu")
    assert {b.dtype for n, b in model.named_buffers() if n.endswith("qweight")} == {
        torch.int8 if variant.startswith("int8") else torch.float8_e4m3fn
    }
    assert model.lm_head.weight.dtype == torch.float32


@needs_cuda
@pytest.mark.parametrize("variant", ["int8", "int8-dyn"])
def test_quantized_variant_on_cuda_keeps_8bit_weights_and_bf16_rest(variant: str) -> None:
    model = apply_variant(_Tiny(), variant, "cuda")
    assert {b.dtype for n, b in model.named_buffers() if n.endswith("qweight")} == {torch.int8}
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert model(torch.randn(4, 16, device="cuda", dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_unknown_variant_is_named() -> None:
    with pytest.raises(QuantizeError, match="'int4'"):
        apply_variant(_Tiny(), "int4")


def test_fp8_supported_on_cpu() -> None:
    ok, why = fp8_supported("cpu")
    assert ok, why


def test_config_variants_are_the_quantize_variants() -> None:
    assert set(get_args(Variant)) == {"api", *VARIANTS}


def test_fp8_dyn_checks_fp8_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "routeopt.evals.providers.local.quantize.fp8_supported", lambda device: (False, "no fp8 here")
    )
    with pytest.raises(QuantizeError, match="'fp8-dyn' cannot run on cpu: no fp8 here"):
        apply_variant(_Tiny(), "fp8-dyn")


# ---- kernels: which one runs, what it is sent, and the fallback -------------------------------


def _spy(monkeypatch: pytest.MonkeyPatch, op: str) -> list[tuple[tuple, dict]]:
    """Record every call of torch.<op> (then run the real op)."""
    real = getattr(torch, op)
    calls: list[tuple[tuple, dict]] = []

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, op, spy)
    return calls


def _is_weight_transposed(t: torch.Tensor, q: nn.Module) -> bool:
    """The column-major view of the stored weight, not a per-forward copy."""
    return t.data_ptr() == q.qweight.data_ptr() and t.stride() == (1, q.in_features)


@pytest.mark.parametrize("rows", [1, INT8PACK_MAX_ROWS])
def test_int8_bf16_few_rows_uses_int8pack(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    lin = _linear()
    q = Int8Linear.from_linear(lin)
    kernel_runs("int8pack", "cpu")
    calls = _spy(monkeypatch, "_weight_int8pack_mm")
    x = torch.randn(rows, 64)
    assert q.kernel_for(rows, torch.bfloat16, "cpu") == "int8pack"
    out = q(x.bfloat16())
    assert len(calls) == 1
    sent_x, sent_w, sent_scale = calls[0][0]
    assert sent_x.dtype == torch.bfloat16 and sent_x.shape == (rows, 64)  # activations unquantized
    assert sent_w is q.qweight and sent_scale.shape == (48,)
    assert out.dtype == torch.bfloat16
    # the dequant path's numbers up to bf16 rounding (worst row seen in 4,000: 0.011)
    assert _rel_err(out.float(), q._matmul(x.bfloat16(), "dequant").float() + lin.bias) < 0.02
    if rows > 1:  # one row's error against fp32 is heavy-tailed; a few rows' is not
        assert _rel_err(out.float(), lin(x)) < 0.02


@pytest.mark.parametrize(
    "dtype,rows", [(torch.float32, 16), (torch.float16, 16), (torch.bfloat16, INT8PACK_MAX_ROWS + 1)]
)
def test_int8_where_int8pack_is_slower_dequantizes(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int
) -> None:
    lin = _linear()
    q = Int8Linear.from_linear(lin)
    calls = _spy(monkeypatch, "_weight_int8pack_mm")
    x = torch.randn(rows, 64)
    assert q.kernel_for(rows, dtype, "cpu") == "dequant"
    assert _rel_err(q(x.to(dtype)).float(), lin(x)) < 0.02
    assert calls == []


DYN = [(Int8DynLinear, "_int_mm", 0.02), (Fp8DynLinear, "_scaled_mm", 0.08)]


@pytest.mark.parametrize("cls,op,tol", DYN)
def test_dyn_linear_tracks_fp32(cls: type, op: str, tol: float) -> None:
    lin = _linear()
    q = cls.from_linear(lin)
    x = torch.randn(64, 64)  # many rows: one row's error is heavy-tailed (cancelling outputs)
    assert q.kernel_for(64, torch.float32, "cpu") == cls.KERNEL
    # tolerance: weight and activation rounding together (fp8 e4m3 keeps 3 mantissa bits)
    assert _rel_err(q(x), lin(x)) < tol


@pytest.mark.parametrize("cls,op,tol", DYN)
@pytest.mark.parametrize("shape", [(1, 64), (5, 7, 64)])
def test_dyn_linear_sends_its_kernel_8bit_operands(
    monkeypatch: pytest.MonkeyPatch, cls: type, op: str, tol: float, shape: tuple
) -> None:
    q = cls.from_linear(_linear())
    kernel_runs(cls.KERNEL, "cpu")
    calls = _spy(monkeypatch, op)
    x = torch.randn(*shape)
    out = q(x)
    assert out.dtype == x.dtype and out.shape == (*shape[:-1], 48)
    assert len(calls) == 1
    (a, b), kw = calls[0]
    rows = x.numel() // 64
    assert a.dtype == q.qweight.dtype and a.shape == (rows, 64)  # activations quantized
    assert _is_weight_transposed(b, q)
    if cls is Fp8DynLinear:
        assert kw["scale_a"].shape == (rows, 1) and kw["scale_b"].shape == (1, 48)
        assert kw["out_dtype"] == torch.bfloat16
    fallback = q._matmul(x.reshape(rows, 64), "dequant") + q.bias
    assert _rel_err(out.reshape(rows, 48), fallback) < 0.01


@pytest.mark.parametrize("cls,op,tol", DYN)
def test_dyn_fallback_has_the_kernels_numbers(cls: type, op: str, tol: float) -> None:
    q = cls.from_linear(_linear())
    x = torch.randn(9, 64)
    fused, fallback = q._matmul(x, cls.KERNEL), q._matmul(x, "dequant")
    # int8: exact integer sums either way; fp8: the kernel's bf16 output is the only difference
    assert _rel_err(fused, fallback) < (1e-6 if cls is Int8DynLinear else 0.01)


@pytest.mark.parametrize("cls,op,tol", DYN)
def test_dyn_unaligned_layer_falls_back(
    monkeypatch: pytest.MonkeyPatch, cls: type, op: str, tol: float
) -> None:
    torch.manual_seed(3)
    lin = nn.Linear(60, 36)  # 60 is a multiple of neither 8 nor 16: the CUDA kernels refuse it
    q = cls.from_linear(lin)
    calls = _spy(monkeypatch, op)
    x = torch.randn(64, 60)
    assert q.kernel_for(64, torch.float32, "cpu") == "dequant"
    assert _rel_err(q(x), lin(x)) < tol
    assert calls == []


@pytest.mark.parametrize("cls,op,tol", DYN)
def test_dyn_device_that_refuses_the_kernel_falls_back(
    monkeypatch: pytest.MonkeyPatch, cls: type, op: str, tol: float
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("not supported on this device")

    monkeypatch.setattr(torch, op, refuse)
    lin = _linear()
    q = cls.from_linear(lin)
    x = torch.randn(64, 64)
    assert not kernel_runs(cls.KERNEL, "cpu")
    assert q.kernel_for(64, torch.float32, "cpu") == "dequant"
    assert _rel_err(q(x), lin(x)) < tol


# ---- a real architecture: tiny random Llama ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


LLAMA_TOL = {
    "fp32": 1e-6,
    "bf16": 0.02,
    "fp16": 0.01,
    "int8": 0.03,
    "int8-dyn": 0.03,
    "fp8": 0.1,
    "fp8-dyn": 0.1,
}
LLAMA_KERNELS = {
    "int8": "dequant",
    "fp8": "dequant",
    "int8-dyn": "int_mm",
    "fp8-dyn": "scaled_mm",
}  # fp32 activations at batch-1 decode, on CPU


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_llama_variant_tracks_fp32_and_generates(tiny_llama: nn.Module, variant: str) -> None:
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = tiny_llama(ids).logits
        model = apply_variant(copy.deepcopy(tiny_llama), variant, "cpu")
        logits = model(ids).logits.float()
    assert _rel_err(logits, ref) < LLAMA_TOL[variant]
    counts = kernel_counts(model, 1, torch.float32, "cpu")
    if variant in LLAMA_KERNELS:  # q k v o gate up down in each of 2 layers; lm_head stays fp32
        assert counts == {LLAMA_KERNELS[variant]: 14}
    else:
        assert counts == {}
    prompt = ids[:1]
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False, pad_token_id=0
    )
    assert out.shape == (1, 16) and torch.equal(out[:, :12], prompt)


# ---- CUDA: the GPU kernels' own rules ---------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("rows", [1, 16, 17, 40])
def test_int8_dyn_cuda_pads_small_batches(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    lin = _linear().cuda()
    q = Int8DynLinear.from_linear(lin).cuda()
    assert kernel_runs("int_mm", "cuda:0"), "torch._int_mm does not run on this GPU"
    calls = _spy(monkeypatch, "_int_mm")
    x = torch.randn(rows, 64, device="cuda")
    out = q(x)
    assert calls[0][0][0].shape == (max(rows, 17), 64)  # cuBLASLt's int8 GEMM wants M > 16
    assert out.shape == (rows, 48)
    assert _rel_err(out, q._matmul(x, "dequant") + q.bias) < 1e-5  # padding rows change nothing


@needs_cuda
def test_fp8_dyn_cuda_uses_scaled_mm_where_fp8_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    ok, why = fp8_supported("cuda")
    if not ok:
        pytest.skip(why)
    lin = _linear().cuda()
    q = Fp8DynLinear.from_linear(lin).cuda()
    calls = _spy(monkeypatch, "_scaled_mm")
    x = torch.randn(64, 64, device="cuda")
    assert q.kernel_for(64, torch.float32, x.device) == "scaled_mm"
    assert _rel_err(q(x), lin(x)) < 0.08 and len(calls) == 1
    assert _rel_err(q(x.bfloat16()).float(), lin(x)) < 0.08


@needs_cuda
def test_int8_weight_only_cuda_dequantizes() -> None:
    lin = _linear().cuda()
    q = Int8Linear.from_linear(lin).cuda()
    x = torch.randn(64, 64, device="cuda")
    assert q.kernel_for(1, torch.bfloat16, x.device) == "dequant"
    assert _rel_err(q(x.bfloat16()).float(), lin(x)) < 0.02
