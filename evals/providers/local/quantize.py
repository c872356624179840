"""Quantized variants of in-process checkpoints, so one checkpoint can be served (and evaluated)
as several cost/quality variants: fp32, bf16/fp16 casts, int8 and fp8 weights (weight-only), and
int8/fp8 weights with activations rounded per token on the fly (`int8-dyn`, `fp8-dyn`: W8A8).

Every quantized Linear keeps its weight [out, in] row-major with one fp32 scale per output channel.
Each forward picks a kernel (`kernel_for` says which): a fused torch kernel where one takes the
layer, the input and the device, else `"dequant"`, a fallback with the same numerics. Weight-only
variants keep activations in the model's dtype, so they differ from fp32 only by weight rounding;
the -dyn variants also round each activation row to 8 bits. torch is imported lazily by the
callers; this module imports it at top level and is only imported on first use.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

VARIANTS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8", "int8", "fp8-dyn", "int8-dyn")
_CASTS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# _weight_int8pack_mm on CPU beats the dequant path only for bf16 activations and few rows: it is
# slower for fp32 and fp16 at every size, and for bf16 from ~12-16 rows (quant_kernels benchmark).
INT8PACK_MAX_ROWS = 8
INT_MM_MIN_ROWS_CUDA = 17  # cuBLASLt's int8 GEMM behind torch._int_mm refuses M <= 16


class QuantizeError(ValueError):
    """A variant that cannot run here; the message says which and why."""


def _per_channel_scale(weight: torch.Tensor, qmax: float) -> torch.Tensor:
    amax = weight.detach().abs().amax(dim=1).float()
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def _to_int8(scaled: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(scaled), -127, 127).to(torch.int8)


def _to_fp8(scaled: torch.Tensor) -> torch.Tensor:
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _probe_int8pack(device: torch.device) -> None:
    x = torch.zeros(1, 32, dtype=torch.bfloat16, device=device)
    w = torch.zeros(16, 32, dtype=torch.int8, device=device)
    torch._weight_int8pack_mm(x, w, torch.ones(16, dtype=torch.bfloat16, device=device))


def _probe_int_mm(device: torch.device) -> None:
    a = torch.zeros(INT_MM_MIN_ROWS_CUDA, 32, dtype=torch.int8, device=device)
    torch._int_mm(a, torch.zeros(32, 32, dtype=torch.int8, device=device).t())


def _probe_scaled_mm(device: torch.device) -> None:
    a = torch.zeros(1, 32, device=device).to(torch.float8_e4m3fn)
    b = torch.zeros(32, 32, device=device).to(torch.float8_e4m3fn)
    torch._scaled_mm(
        a,
        b.t(),
        scale_a=torch.ones(1, 1, device=device),
        scale_b=torch.ones(1, 32, device=device),
        out_dtype=torch.bfloat16,
    )


_PROBES: dict[str, Callable[[torch.device], None]] = {
    "int8pack": _probe_int8pack,
    "int_mm": _probe_int_mm,
    "scaled_mm": _probe_scaled_mm,
}


@functools.cache
def kernel_runs(kernel: str, device: str) -> bool:
    """Whether a fused kernel runs on `device` at all, from one tiny call (cached): torch builds
    and GPUs without it raise, and every layer there takes the dequantizing path instead."""
    try:
        _PROBES[kernel](torch.device(device))
    except Exception:  # noqa: BLE001 - any refusal (no op, arch, layout, dtype) means "don't use"
        return False
    return True


class _QuantizedLinear(nn.Module):
    """A Linear whose weight is stored quantized with a per-output-channel fp32 scale.

    The weight stays [out, in] row-major: _weight_int8pack_mm takes it as is, and _int_mm and
    _scaled_mm want their second operand column-major, which its `.t()` is without a copy.
    Subclasses say how a scaled fp32 weight becomes the stored dtype and how forward multiplies.
    """

    QMAX: float
    LABEL: str
    _quantize: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = qweight.shape[1]
        self.out_features = qweight.shape[0]
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> _QuantizedLinear:
        w = linear.weight.detach().float()
        scale = _per_channel_scale(w, cls.QMAX)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(cls._quantize(w / scale[:, None]), scale, bias)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.to(torch.float32) * self.scale[:, None]).to(dtype)

    def kernel_for(self, rows: int, dtype: torch.dtype, device: torch.device | str) -> str:
        """The matmul forward runs for an input of `rows` rows (tokens) in `dtype` on `device`."""
        return "dequant"

    def _matmul(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        y = self._matmul(x2d, self.kernel_for(x2d.shape[0], x.dtype, x.device))
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.LABEL}"


class _WeightOnlyLinear(_QuantizedLinear):
    """Weight-only: activations stay in the model's dtype. The scale is per output channel, so
    it applies after the matmul: x(qs)^T = (xq^T)s."""

    def _matmul(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        return F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)


class Int8Linear(_WeightOnlyLinear):
    """int8 weights, rounded to the nearest step of the channel's scale. On CPU, bf16 inputs of
    few rows use torch._weight_int8pack_mm, which reads the int8 weight without a widened copy."""

    QMAX, LABEL, _quantize = 127.0, "int8", staticmethod(_to_int8)

    def kernel_for(self, rows: int, dtype: torch.dtype, device: torch.device | str) -> str:
        device = torch.device(device)
        if (
            device.type == "cpu"
            and dtype == torch.bfloat16
            and rows <= INT8PACK_MAX_ROWS
            and kernel_runs("int8pack", str(device))
        ):
            return "int8pack"
        return "dequant"

    def _matmul(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        if kernel == "int8pack":
            return torch._weight_int8pack_mm(x.contiguous(), self.qweight, self.scale.to(x.dtype))
        return super()._matmul(x, kernel)


class Fp8Linear(_WeightOnlyLinear):
    """float8_e4m3fn weights (Hopper's fp8), the channel's range mapped onto fp8's. torch has no
    weight-only fp8 matmul (_scaled_mm wants both operands in fp8: that is `fp8-dyn`), so forward
    always casts the weight up to the activation dtype."""

    QMAX, LABEL, _quantize = FP8_MAX, "fp8_e4m3fn", staticmethod(_to_fp8)


def _row_scale(x: torch.Tensor, qmax: float) -> torch.Tensor:
    amax = x.detach().abs().amax(dim=1, keepdim=True).float()
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


class _DynamicLinear(_QuantizedLinear):
    """W8A8: each activation row (token) is rounded to the weight's 8-bit format on the fly with a
    scale from that row's amax, the product runs on 8-bit operands, and the result is rescaled by
    act_scale * weight_scale. `KERNEL` runs where both dimensions are multiples of `ALIGN` (the
    CUDA kernel's rule, kept on every device so the CPU takes the path a GPU would) and the device
    runs it; elsewhere `"dequant"` widens both 8-bit operands to fp32: the same numbers, slower."""

    KERNEL: str
    ALIGN: int

    def kernel_for(self, rows: int, dtype: torch.dtype, device: torch.device | str) -> str:
        aligned = self.in_features % self.ALIGN == 0 and self.out_features % self.ALIGN == 0
        return self.KERNEL if aligned and kernel_runs(self.KERNEL, str(device)) else "dequant"

    def _fused(self, xq: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _matmul(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        x_scale = _row_scale(x, self.QMAX)
        xq = self._quantize(x.float() / x_scale)
        if kernel == "dequant":
            y = F.linear(xq.float(), self.qweight.float()) * x_scale * self.scale
        else:
            y = self._fused(xq, x_scale)
        return y.to(x.dtype)


class Int8DynLinear(_DynamicLinear):
    """int8 weights and per-token int8 activations through torch._int_mm (int32 accumulation)."""

    QMAX, LABEL = 127.0, "int8 weights, per-token int8 activations"
    _quantize = staticmethod(_to_int8)
    KERNEL, ALIGN = "int_mm", 8

    def _fused(self, xq: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        rows = xq.shape[0]
        if xq.is_cuda and rows < INT_MM_MIN_ROWS_CUDA:  # zero rows in, ignored rows out
            xq = F.pad(xq, (0, 0, 0, INT_MM_MIN_ROWS_CUDA - rows))
        acc = torch._int_mm(xq, self.qweight.t())[:rows]
        return acc.float() * x_scale * self.scale


class Fp8DynLinear(_DynamicLinear):
    """fp8 e4m3 weights and per-token e4m3 activations through torch._scaled_mm with rowwise
    scales. Its output is bf16 (the only dtype rowwise scaling allows on sm90), then cast to the
    activation dtype: a rounding far below the activations' own e4m3 rounding. On CPU the kernel
    is slower than the fallback (quant_kernels benchmark); it runs there anyway so that CPU tests
    exercise the call a GPU makes: fp8 is for GPUs."""

    QMAX, LABEL = FP8_MAX, "fp8_e4m3fn weights, per-token e4m3 activations"
    _quantize = staticmethod(_to_fp8)
    KERNEL, ALIGN = "scaled_mm", 16

    def _fused(self, xq: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(
            xq, self.qweight.t(), scale_a=x_scale, scale_b=self.scale[None, :], out_dtype=torch.bfloat16
        )


_LINEARS: dict[str, type[_QuantizedLinear]] = {
    "int8": Int8Linear,
    "fp8": Fp8Linear,
    "int8-dyn": Int8DynLinear,
    "fp8-dyn": Fp8DynLinear,
}


def fp8_supported(device: torch.device | str) -> tuple[bool, str]:
    """Whether float8 weights can be used on a device, and if not, why."""
    if not hasattr(torch, "float8_e4m3fn"):
        return False, f"torch {torch.__version__} has no float8_e4m3fn dtype"
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(device)
            return False, (f"{name} (compute capability {major}.{minor}) has no fp8 support; need 8.9+")
    return True, ""


def quantize_linears(model: nn.Module, variant: str, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every nn.Linear (except names ending in `skip`) in place; return how many."""
    cls = _LINEARS[variant]
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not name.endswith(skip)
    ]
    for name, mod in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, cls.from_linear(mod))
    return len(targets)


def kernel_counts(
    model: nn.Module, rows: int, dtype: torch.dtype, device: torch.device | str
) -> dict[str, int]:
    """How many quantized Linears would run each kernel for inputs of `rows` rows: what a report
    can state as measured rather than assumed (e.g. rows=1 for batch-1 decode)."""
    return dict(
        Counter(m.kernel_for(rows, dtype, device) for m in model.modules() if isinstance(m, _QuantizedLinear))
    )


def compute_dtype(variant: str, device: torch.device | str) -> torch.dtype:
    """The dtype a variant computes in: the cast's own, and for quantized weights bf16 on a GPU
    (as serving stacks run them; fp32 activations would waste the bandwidth the 8-bit weights
    save) but fp32 on a CPU, where bf16 matmuls are mostly slower."""
    if variant in _CASTS:
        return _CASTS[variant]
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def apply_variant(model: nn.Module, variant: str, device: torch.device | str = "cpu") -> nn.Module:
    """Turn a loaded fp32 model into the requested variant on `device` (in place; returned)."""
    if variant not in VARIANTS:
        raise QuantizeError(f"unknown variant {variant!r}; known: {list(VARIANTS)}")
    if variant in _CASTS:
        return model.to(device=device, dtype=_CASTS[variant])
    if variant.startswith("fp8"):
        ok, why = fp8_supported(device)
        if not ok:
            raise QuantizeError(f"variant {variant!r} cannot run on {device}: {why}")
    # cast first: Module.to(dtype) would also cast the float8 weights, which are floating point
    model = model.to(dtype=compute_dtype(variant, device))
    quantize_linears(model, variant)
    return model.to(device)
