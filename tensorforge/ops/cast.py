"""Cast, CastLike and BitCast between every element type tensorforge can hold.

Numeric casts follow the Cast spec: float to float rounds to nearest even (infinity when out of range),
int to int wraps, float to int truncates toward zero, anything to bool is `!= 0`. Float 8 targets saturate
to +-max unless `saturate=0`; float4e2m1 always saturates. Float to int4/uint4/int2/uint2 gives 0 when
the truncated value is out of range (ml_dtypes' behaviour, which the ONNX reference follows). Sources
wider than float32 are first rounded to float32 with round-to-odd, so that the second rounding to a
narrower float is exact.
"""

from __future__ import annotations

import numpy as np
import torch

from ..ir import DType
from ..tensors import to_numpy
from .helpers import widen
from .registry import OpContext, input_dtype, register

Tensor = torch.Tensor | np.ndarray

_FLOAT8 = {
    DType.FLOAT8E4M3FN: torch.float8_e4m3fn,
    DType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    DType.FLOAT8E5M2: torch.float8_e5m2,
    DType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
}
# Without saturation, |x| beyond the midpoint between max and the next (absent) value overflows; at the
# midpoint itself round-half-to-even decides (the max of e4m3fn has an even mantissa, the others odd).
_OVERFLOW = {
    DType.FLOAT8E4M3FN: (464.0, False),
    DType.FLOAT8E4M3FNUZ: (248.0, True),
    DType.FLOAT8E5M2: (61440.0, True),
    DType.FLOAT8E5M2FNUZ: (61440.0, True),
}
_SUB_BYTE_INTS = {DType.INT4, DType.UINT4, DType.INT2, DType.UINT2}
# float4e2m1 magnitudes by code (the sign is bit 3) and the midpoints between neighbours.
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def cast_tensor(
    x: Tensor,
    source: DType,
    target: DType,
    *,
    saturate: bool = True,
    round_mode: str = "up",
) -> Tensor:
    """`x` (of element type `source`) converted to element type `target`, following the Cast spec."""
    if source == DType.STRING:
        return _from_strings(x, target, saturate=saturate, round_mode=round_mode)
    if target == DType.STRING:
        return to_numpy(x, source).astype(np.str_).astype(object)
    if target == source:
        return x
    if target == DType.BOOL:
        return _arith(x) != 0
    if target in _SUB_BYTE_INTS:
        return _to_sub_byte_int(x, target)
    if target.is_integer:
        return x.to(target.torch)
    if target in _FLOAT8:
        return _to_float8(x, target, saturate)
    if target == DType.FLOAT8E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if target == DType.FLOAT4E2M1:
        return _to_fp4(x)
    if target.torch.itemsize < 4:
        x = _to_float32_odd(x)
    return x.to(target.torch)


def _arith(x: torch.Tensor) -> torch.Tensor:
    """`x` in a dtype with arithmetic kernels (float8 types compute in float32, uint16+ widen)."""
    if x.dtype.is_floating_point and x.dtype.itemsize == 1:
        return x.float()
    return widen(x)


def _to_float32_odd(x: torch.Tensor) -> torch.Tensor:
    """`x` as float32, rounding to odd when inexact: a later round-to-nearest to a type with at least two
    fewer mantissa bits then equals a direct rounding of `x`. Narrow inputs convert exactly."""
    if x.dtype.is_floating_point and x.dtype.itemsize <= 4:
        return x.float()
    wide = x.double()
    narrow = wide.float()
    inexact = narrow.double() != wide
    finite = torch.isfinite(wide)
    bits = narrow.view(torch.int32)
    bits = torch.where(inexact & finite & (narrow.double().abs() > wide.abs()), bits - 1, bits)
    bits = torch.where(inexact & finite, bits | 1, bits)
    return bits.view(torch.float32)


def _to_sub_byte_int(x: torch.Tensor, target: DType) -> torch.Tensor:
    bits = target.bits
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if target.is_signed else (0, (1 << bits) - 1)
    if x.dtype.is_floating_point:
        value = _arith(x).double().trunc()
        value = torch.where((value >= low) & (value <= high), value, 0.0)
        return value.to(target.torch)
    value = widen(x).to(torch.int64) & ((1 << bits) - 1)
    if target.is_signed:
        value = torch.where(value > high, value - (1 << bits), value)
    return value.to(target.torch)


def _to_float8(x: torch.Tensor, target: DType, saturate: bool) -> torch.Tensor:
    dtype = _FLOAT8[target]
    wide = _to_float32_odd(_arith(x))
    limit = torch.finfo(dtype).max
    result = wide.clamp(-limit, limit).to(dtype)
    if saturate:
        return result
    threshold, tie_overflows = _OVERFLOW[target]
    magnitude = wide.abs()
    overflow = (magnitude >= threshold) if tie_overflows else (magnitude > threshold)
    if target == DType.FLOAT8E5M2:
        special = torch.copysign(torch.full_like(wide, float("inf")), wide)
    else:
        special = torch.full_like(wide, float("nan"))
    return torch.where(overflow, special.to(dtype), result)


def _to_e8m0(x: torch.Tensor, saturate: bool, round_mode: str) -> torch.Tensor:
    """float8e8m0 (a bare exponent) from the float32 bits of `x`: NaN/Inf keep the all-ones exponent,
    `round_mode` decides how a nonzero mantissa moves the exponent; `saturate` stops at 2**127."""
    bits = _arith(x).float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exponent = (bits >> 23) & 0xFF
    special = exponent == 0xFF
    if round_mode == "up":
        round_up = (bits & 0x7FFFFF) > 0
    elif round_mode == "nearest":
        guard, rest = (bits & 0x400000) > 0, (bits & 0x3FFFFF) > 0
        round_up = guard & (rest | (exponent > 0))
    elif round_mode == "down":
        round_up = torch.zeros_like(special)
    else:
        raise ValueError(f"unknown round_mode {round_mode!r}")
    if saturate:
        round_up &= exponent != 0xFE
    exponent = torch.where(special, 0xFF, exponent + (round_up & ~special).to(torch.int64))
    return exponent.to(torch.uint8).view(torch.float8_e8m0fnu)


def _to_fp4(x: torch.Tensor) -> torch.Tensor:
    """float4e2m1 values (in a float32 carrier): round half to even, saturate at +-6, NaN to 0."""
    wide = _arith(x).double()
    magnitude = wide.abs().clamp(max=6.0)
    midpoints = torch.tensor(_FP4_MIDPOINTS, dtype=wide.dtype, device=wide.device)
    code = torch.bucketize(magnitude, midpoints)
    tie = magnitude == midpoints[code.clamp(max=len(_FP4_MIDPOINTS) - 1)]
    code = torch.where(tie & (code % 2 == 1), code + 1, code)
    values = torch.tensor(_FP4_VALUES, dtype=torch.float32, device=wide.device)[code]
    return torch.where(torch.isnan(wide), 0.0, torch.copysign(values, wide.float()))


def _from_strings(x: np.ndarray, target: DType, **options) -> Tensor:
    """Parse decimal/scientific literals and case-insensitive INF/+INF/-INF/NaN; integer targets accept
    integer literals exactly and truncate others."""
    if target == DType.STRING:
        return x
    flat = [str(s) for s in x.reshape(-1)]
    if target.is_integer:
        parsed = torch.tensor([_parse_int(s) for s in flat], dtype=torch.int64).reshape(x.shape)
        return cast_tensor(parsed, DType.INT64, target, **options)
    parsed = torch.tensor([float(s) for s in flat], dtype=torch.float64).reshape(x.shape)
    return cast_tensor(parsed, DType.DOUBLE, target, **options)


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return int(float(text))


def _cast(ctx: OpContext, x: Tensor, target: DType, saturate: int, round_mode: str) -> Tensor:
    result = cast_tensor(x, input_dtype(ctx.node.inputs[0]), target, saturate=bool(saturate), round_mode=round_mode)
    return result.to(ctx.device) if isinstance(result, torch.Tensor) else result


@register("Cast", since=1)
def cast_1(ctx: OpContext, x, *, to):
    """Opset 1 names the target type by string ("FLOAT", "INT64", ...)."""
    return _cast(ctx, x, DType[to.upper()], 1, "up")


@register("Cast", since=6)
def cast_6(ctx: OpContext, x, *, to):
    return _cast(ctx, x, DType(to), 1, "up")


@register("Cast", since=19)
def cast_19(ctx: OpContext, x, *, to, saturate=1):
    return _cast(ctx, x, DType(to), saturate, "up")


@register("Cast", since=24)
def cast_24(ctx: OpContext, x, *, to, saturate=1, round_mode="up"):
    return _cast(ctx, x, DType(to), saturate, round_mode)


@register("CastLike", since=15)
def cast_like_15(ctx: OpContext, x, like):
    return _cast(ctx, x, input_dtype(ctx.node.inputs[1]), 1, "up")


@register("CastLike", since=19)
def cast_like_19(ctx: OpContext, x, like, *, saturate=1):
    return _cast(ctx, x, input_dtype(ctx.node.inputs[1]), saturate, "up")


@register("CastLike", since=24)
def cast_like_24(ctx: OpContext, x, like, *, saturate=1, round_mode="up"):
    return _cast(ctx, x, input_dtype(ctx.node.inputs[1]), saturate, round_mode)


@register("BitCast", since=26)
def bitcast(ctx: OpContext, x, *, to):
    """Reinterpret the bits of `x` as element type `to` of the same width (little endian)."""
    source, target = input_dtype(ctx.node.inputs[0]), DType(to)
    if DType.STRING in (source, target):
        raise ValueError("BitCast does not support strings")
    if source.bits != target.bits:
        raise ValueError(f"BitCast needs equal widths, got {source} ({source.bits} bits) and {target}")
    if source in _SUB_BYTE:
        return _from_code(_to_code(x, source), target)
    return x.view(target.torch)


# Sub-byte types: conversions between a carrier's value and its bit pattern (an int64 code).
_SUB_BYTE = _SUB_BYTE_INTS | {DType.FLOAT4E2M1}


def _to_code(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    if dtype == DType.FLOAT4E2M1:
        values = torch.tensor(_FP4_VALUES, device=x.device)
        magnitude = (x.abs().unsqueeze(-1) == values).to(torch.int64).argmax(-1)
        return magnitude | (torch.signbit(x).to(torch.int64) << 3)
    return x.to(torch.int64) & ((1 << dtype.bits) - 1)


def _from_code(code: torch.Tensor, dtype: DType) -> torch.Tensor:
    if dtype == DType.FLOAT4E2M1:
        values = torch.tensor(_FP4_VALUES, device=code.device)[code & 7]
        return torch.where((code & 8) > 0, -values, values)
    return _to_sub_byte_int(code, dtype)
