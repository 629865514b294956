"""Symmetric quantization of tensors for the quantized kernels (int8 and float8 E4M3, zero point 0).

Weights quantize per output channel (axis 0 of a (Cout, Cin/G, KH, KW) convolution weight):
`scale[c] = max |W[c]| / QMAX` computed in float64, never below `MIN_SCALE`, stored as float32, with QMAX 127
for int8 and 448 for E4M3 (the largest finite E4M3FN value). These are the numbers of
`quant.weights.weight_scales` (whose int8 scales calibration uses), so a calibrated model and its kernels
agree. `W_q = clip(round(W / scale))` divides in float32, as the reference QuantizeLinear does with float32
scales: int8 rounds half to even and saturates to [−128, 127]; E4M3 clips to ±448 and rounds to nearest even.

Activations quantize per tensor as the kernels do it on load, multiplying by `1/scale` in float32
(`quantize_activation`): its result is bit for bit what a kernel that quantizes its input would read, and what
the reference QuantizedConv computes (`ops.fused.quantize_activation`, which states it for the graph; the two are
tested bit for bit). QuantizeLinear divides instead; the two differ only where x / scale lies within one float32
rounding of a rounding tie.
"""

from __future__ import annotations

import torch

KINDS: dict[str, tuple[torch.dtype, float]] = {
    "int8": (torch.int8, 127.0),
    "fp8e4m3": (torch.float8_e4m3fn, 448.0),
}
MIN_SCALE = 1e-12
_INT8_LOW, _INT8_HIGH = -128, 127


def _kind(kind: str) -> tuple[torch.dtype, float]:
    if kind not in KINDS:
        raise ValueError(f"unknown quantization kind {kind!r}; known: {sorted(KINDS)}")
    return KINDS[kind]


def _saturate(scaled: torch.Tensor, dtype: torch.dtype, qmax: float) -> torch.Tensor:
    """Real values (float32) as `dtype`: int8 rounds half to even and saturates, E4M3 clips and rounds."""
    if dtype == torch.int8:
        return torch.round(scaled).clamp(_INT8_LOW, _INT8_HIGH).to(torch.int8)
    return scaled.clamp(-qmax, qmax).to(dtype)


def weight_scales(weight: torch.Tensor, kind: str) -> torch.Tensor:
    """float32 per-output-channel scales (axis 0) of `weight` for `kind` ("int8" or "fp8e4m3")."""
    _, qmax = _kind(kind)
    if weight.dim() < 1 or weight.shape[0] == 0:
        raise ValueError(f"weight_scales: the weight needs an output-channel axis, got shape {list(weight.shape)}")
    amax = weight.detach().abs().double().reshape(weight.shape[0], -1).amax(dim=1)
    return (amax / qmax).clamp(min=MIN_SCALE).float()


def quantize_weight(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_q, scale): `weight` quantized per output channel (int8 or float8_e4m3fn, same shape) and its float32
    (Cout,) scales. Pack W_q with `triton.conv.pack_weight` for `conv2d_nhwc_quantized`."""
    dtype, qmax = _kind(kind)
    if not weight.dtype.is_floating_point:
        raise ValueError(f"quantize_weight: the weight must be float, got {weight.dtype}")
    scale = weight_scales(weight, kind)
    shape = (-1,) + (1,) * (weight.dim() - 1)
    return _saturate(weight.float() / scale.reshape(shape), dtype, qmax), scale


def quantize_activation(x: torch.Tensor, scale: float, kind: str) -> torch.Tensor:
    """`x` quantized per tensor as a kernel quantizes it on load: `x · (1/scale)` in float32, then rounded and
    saturated to `kind`'s type (int8 half to even, E4M3 to nearest even)."""
    dtype, qmax = _kind(kind)
    if not scale > 0:
        raise ValueError(f"quantize_activation: the scale must be positive, got {scale!r}")
    inverse = torch.tensor(1.0 / scale, dtype=torch.float32)
    return _saturate(x.float() * inverse.to(x.device), dtype, qmax)
