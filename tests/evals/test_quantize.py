"""Weight-only quantization: each variant's Linear must track the fp32 module closely."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from evals.quantize import (  # noqa: E402
    Fp8Linear,
    Int8Linear,
    QuantizeError,
    apply_variant,
    fp8_supported,
    quantize_linears,
)


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
