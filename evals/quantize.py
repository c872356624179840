"""Weight-only quantization for in-process checkpoints, so one checkpoint can be served (and
evaluated) as several cost/quality variants: fp32, bf16/fp16 casts, int8 and fp8 weights.

Every quantized Linear keeps its weight [out, in] row-major with one fp32 scale per output channel.
Each forward picks a kernel (`kernel_for` says which): a fused torch kernel where one takes the
layer, the input and the device, else `"dequant"`, a fallback with the same numerics. Weight-only
variants keep activations in the model's dtype, so they differ from fp32 only by weight rounding.
torch is imported lazily by the callers; this module imports it at top level and is only imported
on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

VARIANTS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8", "int8")
_CASTS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# _weight_int8pack_mm on CPU beats the dequant path only for bf16 activations and few rows: it is
# slower for fp32 and fp16 at every size, and for bf16 from ~12-16 rows (quant_kernels benchmark).
INT8PACK_MAX_ROWS = 8


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


_PROBES: dict[str, Callable[[torch.device], None]] = {"int8pack": _probe_int8pack}


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

    The weight stays [out, in] row-major, as _weight_int8pack_mm takes it.
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
        if (device.type == "cpu" and dtype == torch.bfloat16 and rows <= INT8PACK_MAX_ROWS
                and kernel_runs("int8pack", str(device))):
            return "int8pack"
        return "dequant"

    def _matmul(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        if kernel == "int8pack":
            return torch._weight_int8pack_mm(x.contiguous(), self.qweight, self.scale.to(x.dtype))
        return super()._matmul(x, kernel)


class Fp8Linear(_WeightOnlyLinear):
    """float8_e4m3fn weights (Hopper's fp8), the channel's range mapped onto fp8's. torch has no
    weight-only fp8 matmul (_scaled_mm wants both operands in fp8), so forward always casts the
    weight up to the activation dtype."""

    QMAX, LABEL, _quantize = FP8_MAX, "fp8_e4m3fn", staticmethod(_to_fp8)


_LINEARS: dict[str, type[_QuantizedLinear]] = {"int8": Int8Linear, "fp8": Fp8Linear}


def fp8_supported(device: torch.device | str) -> tuple[bool, str]:
    """Whether float8 weights can be used on a device, and if not, why."""
    if not hasattr(torch, "float8_e4m3fn"):
        return False, f"torch {torch.__version__} has no float8_e4m3fn dtype"
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(device)
            return False, (f"{name} (compute capability {major}.{minor}) has no fp8 "
                           "support; need 8.9+")
    return True, ""


def quantize_linears(model: nn.Module, variant: str, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every nn.Linear (except names ending in `skip`) in place; return how many."""
    cls = _LINEARS[variant]
    targets = [
        (name, mod) for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not name.endswith(skip)
    ]
    for name, mod in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, cls.from_linear(mod))
    return len(targets)


def apply_variant(model: nn.Module, variant: str, device: torch.device | str = "cpu") -> nn.Module:
    """Turn a loaded fp32 model into the requested variant on `device` (in place; returned)."""
    if variant not in VARIANTS:
        raise QuantizeError(f"unknown variant {variant!r}; known: {list(VARIANTS)}")
    if variant in _CASTS:
        return model.to(device=device, dtype=_CASTS[variant])
    if variant == "fp8":
        ok, why = fp8_supported(device)
        if not ok:
            raise QuantizeError(f"variant {variant!r} cannot run on {device}: {why}")
    model = model.to(dtype=torch.float32)
    quantize_linears(model, variant)
    return model.to(device)
