"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger and
QLinearMatMul.

Scales and zero points are per tensor (a scalar or one element), per axis (1-D along `axis`) or blocked
(the input's shape with `axis` divided into blocks of `block_size`). Quantizing rounds half to even and
saturates to the target's range; float 8 targets follow Cast's `saturate` rules, float4e2m1 always
saturates.
"""

from __future__ import annotations

import torch

from ..ir import DType
from .cast import cast_tensor
from .helpers import normalize_axis
from .registry import OpContext, input_dtype, register

_FLOAT8 = {DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2, DType.FLOAT8E5M2FNUZ}


def expand_param(value: torch.Tensor, shape: torch.Size, axis: int, block_size: int = 0) -> torch.Tensor:
    """A scale or zero point made broadcastable to `shape` (per tensor, per axis or blocked)."""
    if value.numel() == 1:
        return value.reshape(())
    axis = normalize_axis(axis, len(shape))
    if not block_size:
        if value.dim() != 1 or value.shape[0] != shape[axis]:
            raise ValueError(f"per-axis parameter of shape {list(value.shape)} does not fit axis {axis}")
        dims = [1] * len(shape)
        dims[axis] = value.shape[0]
        return value.reshape(dims)
    if block_size < 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    value = value.repeat_interleave(block_size, dim=axis).narrow(axis, 0, shape[axis])
    if value.shape != shape:
        raise ValueError(f"blocked parameter does not match the input shape {list(shape)}")
    return value


def integer_range(dtype: DType) -> tuple[int, int]:
    bits = dtype.bits
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.is_signed else (0, (1 << bits) - 1)


def saturate_to(value: torch.Tensor, target: DType, saturate: bool = True) -> torch.Tensor:
    """Real values as element type `target`: integers round half to even and clip to their range,
    floats convert like Cast."""
    if target.is_integer:
        low, high = integer_range(target)
        return torch.round(value).clamp(low, high).to(target.torch)
    return cast_tensor(value, DType.from_torch(value.dtype), target, saturate=saturate)


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    target: DType,
    *,
    axis: int = 1,
    block_size: int = 0,
    saturate: bool = True,
    precision: DType | None = None,
) -> torch.Tensor:
    """`saturate(round(x / scale) + zero_point)`, dividing in `precision` (default: the scale's type)."""
    if target not in _FLOAT8 and not target.is_integer and target != DType.FLOAT4E2M1:
        raise ValueError(f"{target} is not a quantized type")
    compute = precision.torch if precision else scale.dtype
    if not compute.is_floating_point or compute.itemsize == 1:  # int32 or e8m0 scales
        compute = torch.float32
    scaled = x.to(compute) / expand_param(scale, x.shape, axis, block_size).to(compute)
    if target.is_integer:
        scaled = torch.round(scaled).double()
    if zero_point is not None:
        scaled = scaled + expand_param(zero_point, x.shape, axis, block_size).to(scaled.dtype)
    return saturate_to(scaled, target, saturate)


def dequantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    output: DType,
    *,
    axis: int = 1,
    block_size: int = 0,
) -> torch.Tensor:
    """`(x - zero_point) * scale` computed in float32, as element type `output`."""
    value = x.float()
    if zero_point is not None:
        value = value - expand_param(zero_point, x.shape, axis, block_size).float()
    value = value * expand_param(scale, x.shape, axis, block_size).float()
    return value.to(output.torch)


def _quantize_target(ctx: OpContext, zero_point, output_dtype: int) -> DType:
    if zero_point is not None:
        zero_type = input_dtype(ctx.node.inputs[2])
        if output_dtype and DType(output_dtype) != zero_type:
            raise ValueError(f"output_dtype {DType(output_dtype)} differs from the zero point's {zero_type}")
        return zero_type
    return DType(output_dtype) if output_dtype else DType.UINT8


def _quantize(ctx: OpContext, x, scale, zero_point, *, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
    target = _quantize_target(ctx, zero_point, output_dtype)
    return quantize(
        x,
        scale,
        zero_point,
        target,
        axis=axis,
        block_size=block_size,
        saturate=bool(saturate),
        precision=DType(precision) if precision else None,
    )


@register("QuantizeLinear", since=10)
def quantize_linear_10(ctx: OpContext, x, y_scale, y_zero_point=None):
    return _quantize(ctx, x, y_scale, y_zero_point)


@register("QuantizeLinear", since=13)
def quantize_linear_13(ctx: OpContext, x, y_scale, y_zero_point=None, *, axis=1):
    return _quantize(ctx, x, y_scale, y_zero_point, axis=axis)


@register("QuantizeLinear", since=19)
def quantize_linear_19(ctx: OpContext, x, y_scale, y_zero_point=None, *, axis=1, saturate=1):
    return _quantize(ctx, x, y_scale, y_zero_point, axis=axis, saturate=saturate)


@register("QuantizeLinear", since=21)
def quantize_linear_21(
    ctx: OpContext, x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0
):
    return _quantize(
        ctx, x, y_scale, y_zero_point, axis=axis, saturate=saturate, block_size=block_size, output_dtype=output_dtype
    )


@register("QuantizeLinear", since=23)
def quantize_linear_23(
    ctx: OpContext,
    x,
    y_scale,
    y_zero_point=None,
    *,
    axis=1,
    saturate=1,
    block_size=0,
    output_dtype=0,
    precision=0,
):
    return _quantize(
        ctx,
        x,
        y_scale,
        y_zero_point,
        axis=axis,
        saturate=saturate,
        block_size=block_size,
        output_dtype=output_dtype,
        precision=precision,
    )


def _dequantize(ctx: OpContext, x, scale, zero_point, *, axis=1, block_size=0, output_dtype=0):
    output = DType(output_dtype) if output_dtype else input_dtype(ctx.node.inputs[1])
    return dequantize(x, scale, zero_point, output, axis=axis, block_size=block_size)


@register("DequantizeLinear", since=10)
def dequantize_linear_10(ctx: OpContext, x, x_scale, x_zero_point=None):
    return _dequantize(ctx, x, x_scale, x_zero_point)


@register("DequantizeLinear", since=13)
def dequantize_linear_13(ctx: OpContext, x, x_scale, x_zero_point=None, *, axis=1):
    return _dequantize(ctx, x, x_scale, x_zero_point, axis=axis)


@register("DequantizeLinear", since=21)
def dequantize_linear_21(ctx: OpContext, x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    return _dequantize(ctx, x, x_scale, x_zero_point, axis=axis, block_size=block_size)


@register("DequantizeLinear", since=23)
def dequantize_linear_23(ctx: OpContext, x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    return _dequantize(ctx, x, x_scale, x_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype)


@register("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx: OpContext, x):
    """uint8 quantization with a scale and zero point from the range of `x` widened to include 0."""
    high, low = x.max().clamp(min=0.0), x.min().clamp(max=0.0)
    scale = torch.where(high == low, 1.0, high - low) / 255.0
    zero_point = torch.round((0.0 - low / scale).clamp(0.0, 255.0))
    y = (torch.round(x / scale) + zero_point).clamp(0.0, 255.0)
    return y.to(torch.uint8), scale.to(x.dtype), zero_point.to(torch.uint8)


def _row_param(value: torch.Tensor, rows: int) -> torch.Tensor:
    """A's per-row parameter ([M] or [..., M, 1]) made broadcastable against [..., M, K]."""
    return value.reshape(rows, 1) if value.dim() == 1 and value.numel() == rows > 1 else value


def _centered(x: torch.Tensor, zero_point: torch.Tensor | None, per_row: bool) -> torch.Tensor:
    """`x - zero_point` in float64 (exact for 8-bit data), ready for an exact float64 matmul."""
    value = x.double()
    if zero_point is None:
        return value
    zero_point = zero_point.double()
    if per_row and x.dim() >= 2:
        zero_point = _row_param(zero_point, x.shape[-2])
    return value - zero_point


@register("MatMulInteger", since=10)
def matmul_integer(ctx: OpContext, a, b, a_zero_point=None, b_zero_point=None):
    """int32 `(a - a_zero_point) @ (b - b_zero_point)`; zero points per tensor, per row of a or per column
    of b. The float64 product is exact for 8-bit inputs; the int32 result wraps like 32-bit accumulation."""
    product = _centered(a, a_zero_point, True) @ _centered(b, b_zero_point, False)
    return product.to(torch.int64).to(torch.int32)


def _qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, target: DType):
    product = _centered(a, a_zero_point, True) @ _centered(b, b_zero_point, False)
    rows = a.shape[-2] if a.dim() >= 2 else 1
    multiplier = _row_param(a_scale, rows) * b_scale / y_scale
    value = product * multiplier.double()
    if target.is_integer:
        value = torch.round(value)
    return saturate_to(value + y_zero_point.double(), target)


@register("QLinearMatMul", since=10)
def qlinear_matmul(ctx: OpContext, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """Quantized matmul: dequantize a and b, multiply, requantize with y's scale and zero point."""
    target = input_dtype(ctx.node.inputs[7])
    return _qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, target)
