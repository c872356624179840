"""Weight-only quantization: each variant's Linear must track the fp32 module closely, take the
fused kernel where one applies (spied: what it was sent), and the dequantizing path elsewhere."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from evals.quantize import (  # noqa: E402
    INT8PACK_MAX_ROWS,
    Fp8Linear,
    Int8Linear,
    QuantizeError,
    apply_variant,
    fp8_supported,
    kernel_runs,
    quantize_linears,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device: the GPU kernels' own rules")


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


@pytest.mark.parametrize("variant,cls", [("int8", Int8Linear), ("fp8", Fp8Linear)])
def test_quantize_linears_replaces_all_but_head(variant: str, cls: type) -> None:
    torch.manual_seed(1)
    model = _Tiny()
    x = torch.randn(4, 16)
    ref = model(x)
    assert quantize_linears(model, variant) == 2
    assert isinstance(model.body[0], cls) and isinstance(model.body[2], cls)
    assert isinstance(model.lm_head, nn.Linear)
    assert _rel_err(model(x), ref) < (0.02 if variant == "int8" else 0.08)


@pytest.mark.parametrize("variant,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                           ("fp32", torch.float32)])
def test_cast_variants(variant: str, dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    model = _Tiny()
    x = torch.randn(4, 16)
    ref = model(x)
    model = apply_variant(model, variant, "cpu")
    assert next(model.parameters()).dtype == dtype
    assert _rel_err(model(x.to(dtype)).float(), ref) < 0.02


def test_unknown_variant_is_named() -> None:
    with pytest.raises(QuantizeError, match="'int4'"):
        apply_variant(_Tiny(), "int4")


def test_fp8_supported_on_cpu() -> None:
    ok, why = fp8_supported("cpu")
    assert ok, why


# ---- int8: the fused kernel where it is faster, what it is sent, the fallback ------------------

def _spy(monkeypatch: pytest.MonkeyPatch, op: str) -> list[tuple[tuple, dict]]:
    """Record every call of torch.<op> (then run the real op)."""
    real = getattr(torch, op)
    calls: list[tuple[tuple, dict]] = []

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, op, spy)
    return calls


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


@pytest.mark.parametrize("dtype,rows", [(torch.float32, 16), (torch.float16, 16),
                                        (torch.bfloat16, INT8PACK_MAX_ROWS + 1)])
def test_int8_where_int8pack_is_slower_dequantizes(monkeypatch: pytest.MonkeyPatch,
                                                   dtype: torch.dtype, rows: int) -> None:
    lin = _linear()
    q = Int8Linear.from_linear(lin)
    calls = _spy(monkeypatch, "_weight_int8pack_mm")
    x = torch.randn(rows, 64)
    assert q.kernel_for(rows, dtype, "cpu") == "dequant"
    assert _rel_err(q(x.to(dtype)).float(), lin(x)) < 0.02
    assert calls == []


# ---- CUDA: the GPU kernels' own rules ---------------------------------------------------------

@needs_cuda
def test_int8_weight_only_cuda_dequantizes() -> None:
    lin = _linear().cuda()
    q = Int8Linear.from_linear(lin).cuda()
    x = torch.randn(64, 64, device="cuda")
    assert q.kernel_for(1, torch.bfloat16, x.device) == "dequant"
    assert _rel_err(q(x.bfloat16()).float(), lin(x)) < 0.02
