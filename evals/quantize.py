"""Weight-only quantization for in-process checkpoints, so one checkpoint can be served (and
evaluated) as several cost/quality variants: fp32, bf16/fp16 casts, int8 and fp8 weights.

int8 and fp8 keep one scale per output channel and dequantize inside `forward`: activations stay
in the model's dtype, so the numbers differ from fp32 only by weight rounding. torch is imported
lazily by the callers; this module imports it at top level and is only imported on first use.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VARIANTS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8", "int8")
_CASTS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8_MAX = 448.0  # largest finite float8_e4m3fn


class QuantizeError(ValueError):
    """A variant that cannot run here; the message says which and why."""


def _per_channel_scale(weight: torch.Tensor, qmax: float) -> torch.Tensor:
    amax = weight.detach().abs().amax(dim=1).float()
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


class _WeightOnlyLinear(nn.Module):
    """A Linear whose weight is stored quantized with a per-output-channel fp32 scale.

    The scale is per output channel, so it applies after the matmul: x(qs)^T = (xq^T)s.
    Subclasses say how a scaled fp32 weight becomes the stored dtype.
    """

    QMAX: float
    LABEL: str

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = qweight.shape[1]
        self.out_features = qweight.shape[0]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @staticmethod
    def _quantize(scaled: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "_WeightOnlyLinear":
        w = linear.weight.detach().float()
        scale = _per_channel_scale(w, cls.QMAX)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(cls._quantize(w / scale[:, None]), scale, bias)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.to(torch.float32) * self.scale[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.LABEL}"


class Int8Linear(_WeightOnlyLinear):
    """int8 weights, rounded to the nearest step of the channel's scale."""

    QMAX, LABEL = 127.0, "int8"

    @staticmethod
    def _quantize(scaled: torch.Tensor) -> torch.Tensor:
        return torch.clamp(torch.round(scaled), -127, 127).to(torch.int8)


class Fp8Linear(_WeightOnlyLinear):
    """float8_e4m3fn weights (Hopper's fp8), the channel's range mapped onto fp8's."""

    QMAX, LABEL = FP8_MAX, "fp8_e4m3fn"

    @staticmethod
    def _quantize(scaled: torch.Tensor) -> torch.Tensor:
        return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


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
    cls = {"int8": Int8Linear, "fp8": Fp8Linear}[variant]
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
            raise QuantizeError(f"variant 'fp8' cannot run on {device}: {why}")
    model = model.to(dtype=torch.float32)
    quantize_linears(model, variant)
    return model.to(device)
