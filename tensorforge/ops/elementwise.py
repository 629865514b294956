"""Elementwise math: unary functions, arithmetic, variadic Sum/Mean/Max/Min, Clip, Where, Mod, Pow,
BitShift, rounding and Bernoulli sampling.

torch has few kernels for uint16/32/64, so integer math runs in a wider signed type (`helpers.widen`).
Where a uint64 value of 2**63 or more would turn negative there (ordering, division, right shifts), the
uint64 helpers below work on the raw bits instead. Opset-1/6 binary ops broadcast only with `broadcast=1`
(see `legacy_broadcast`); from opset 7 they broadcast like numpy, as torch does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

from .helpers import narrow, normalize_axis, to_dtype, widen
from .registry import OpContext, register

Fn = Callable[..., torch.Tensor]

_HALF = (torch.float16, torch.bfloat16)
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_FLT_MAX = 3.4028234663852886e38


# -- shared helpers -------------------------------------------------------------------------------------


def in_float32(fn: Fn) -> Fn:
    """Run `fn(x, *args)` in float32 when `x` is fp16/bf16 and cast the result back, so that a composite
    formula rounds once instead of after every step."""

    @functools.wraps(fn)
    def wrapped(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if x.dtype not in _HALF:
            return fn(x, *args, **kwargs)
        args = tuple(a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in args)
        return fn(x.float(), *args, **kwargs).to(x.dtype)

    return wrapped


def order_key(x: torch.Tensor) -> torch.Tensor:
    """`x` in a dtype torch can compare (floats unchanged), with the same order; uint64 becomes int64
    with its sign bit flipped."""
    if x.dtype == torch.uint64:
        return x.view(torch.int64) ^ _INT64_MIN
    return widen(x)


def from_order_key(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of `order_key`."""
    if dtype == torch.uint64:
        return (key ^ _INT64_MIN).view(torch.uint64)
    return narrow(key, dtype)


def legacy_broadcast(a: torch.Tensor, b: torch.Tensor, broadcast: int, axis: int | None) -> torch.Tensor:
    """`b` shaped for an opset-1/6 binary op: without `broadcast` both shapes must be equal; with it, `b`'s
    dims line up with `a`'s from `axis` (by default the trailing ones) and are repeated over the rest."""
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(f"shapes {list(a.shape)} and {list(b.shape)} differ and broadcast=0")
        return b
    if b.numel() == 1:
        return b.reshape(())
    if axis is None:
        return b
    start = normalize_axis(axis, a.dim())
    trailing = a.dim() - start - b.dim()
    if trailing < 0 or a.shape[start : start + b.dim()] != b.shape:
        raise ValueError(f"shape {list(b.shape)} does not match {list(a.shape)} at axis {axis}")
    return b.reshape(*b.shape, *([1] * trailing))


def register_unary(op_type: str, fn: Fn, since: int = 1, *, consumed_inputs: bool = False) -> None:
    """Register `fn(x)` as `op_type`; with `consumed_inputs`, also opset 1's form that carries that
    (ignored) legacy attribute, which opset 6 removed."""

    def unary(ctx: OpContext, x):
        return fn(x)

    if not consumed_inputs:
        register(op_type, since=since)(unary)
        return

    def unary_v1(ctx: OpContext, x, *, consumed_inputs=None):
        return fn(x)

    register(op_type, since=1)(unary_v1)
    register(op_type, since=6)(unary)


def register_binary(op_type: str, fn: Fn, since: int = 7) -> None:
    """Register `fn(a, b)` as `op_type` from opset `since`, broadcasting like numpy."""

    def binary(ctx: OpContext, a, b):
        return fn(a, b)

    register(op_type, since=since)(binary)


def register_legacy_binary(op_type: str, fn: Fn, *, consumed_inputs: bool = False) -> None:
    """Register `fn(a, b)` as `op_type`: numpy broadcasting from opset 7, the `broadcast`/`axis` form
    before (opset 1 also has `consumed_inputs` when asked, until opset 6)."""

    def legacy(ctx: OpContext, a, b, *, broadcast=0, axis=None):
        return fn(a, legacy_broadcast(a, b, broadcast, axis))

    def legacy_v1(ctx: OpContext, a, b, *, broadcast=0, axis=None, consumed_inputs=None):
        return legacy(ctx, a, b, broadcast=broadcast, axis=axis)

    register_binary(op_type, fn, since=7)
    if consumed_inputs:
        register(op_type, since=1)(legacy_v1)
        register(op_type, since=6)(legacy)
    else:
        register(op_type, since=1)(legacy)


def widened(fn: Fn) -> Fn:
    """`fn` over integers computed in a dtype torch has kernels for, wrapping back to the input dtype."""

    def apply(a: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return narrow(fn(widen(a), *(widen(r) for r in rest)), a.dtype)

    return apply


def _udivmod64(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsigned quotient and remainder of uint64 tensors, on their int64 bit patterns."""
    a, b = torch.broadcast_tensors(a.view(torch.int64), b.view(torch.int64))
    half = ((a >> 1) & _INT64_MAX) // torch.where(b < 0, 1, b)  # b < 0: divisor >= 2**63, quotient 0 or 1
    quotient = torch.where(b < 0, 0, half << 1)
    remainder = a - quotient * b
    carry = (remainder ^ _INT64_MIN) >= (b ^ _INT64_MIN)
    quotient = quotient + carry
    remainder = torch.where(carry, remainder - b, remainder)
    return quotient.view(torch.uint64), remainder.view(torch.uint64)


# -- unary math -----------------------------------------------------------------------------------------


def _abs(x: torch.Tensor) -> torch.Tensor:
    return torch.abs(x) if x.dtype.is_signed else x


def _erf(x: torch.Tensor) -> torch.Tensor:
    """erf; integer inputs are computed in float64 and truncated back to their type."""
    return torch.erf(x) if x.is_floating_point() else torch.erf(x.double()).to(x.dtype)


for _op, _fn in {
    "Abs": _abs,
    "Ceil": torch.ceil,
    "Exp": torch.exp,
    "Floor": torch.floor,
    "Log": torch.log,
    "Neg": torch.neg,
    "Reciprocal": torch.reciprocal,
    "Sqrt": torch.sqrt,
}.items():
    register_unary(_op, _fn, consumed_inputs=True)

for _op, _fn, _since in [
    ("Acos", torch.acos, 7),
    ("Asin", torch.asin, 7),
    ("Atan", torch.atan, 7),
    ("Cos", torch.cos, 7),
    ("Sin", torch.sin, 7),
    ("Tan", torch.tan, 7),
    ("Acosh", torch.acosh, 9),
    ("Asinh", torch.asinh, 9),
    ("Atanh", torch.atanh, 9),
    ("Cosh", torch.cosh, 9),
    ("Sinh", torch.sinh, 9),
    ("Erf", _erf, 9),
    ("Round", torch.round, 11),  # torch rounds halves to even, as ONNX does
]:
    register_unary(_op, _fn, _since)


# -- arithmetic -----------------------------------------------------------------------------------------


def _divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """True division for floats; integer division truncates toward zero."""
    if a.is_floating_point() or a.is_complex():
        return torch.div(a, b)
    if a.dtype == torch.uint64:
        return _udivmod64(a, b)[0]
    return narrow(torch.div(widen(a), widen(b), rounding_mode="trunc"), a.dtype)


def _pow(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x ** y in x's type; an integer base with a float exponent is computed in float64 and truncated."""
    if x.is_floating_point():
        return torch.pow(x, y if y.is_floating_point() else widen(y)).to(x.dtype)
    if y.is_floating_point():
        return torch.pow(x.double(), y.double()).to(x.dtype)
    return narrow(torch.pow(widen(x), widen(y).to(widen(x).dtype)), x.dtype)


for _op, _fn in {
    "Add": widened(torch.add),
    "Sub": widened(torch.sub),
    "Mul": widened(torch.mul),
    "Div": _divide,
}.items():
    register_legacy_binary(_op, _fn, consumed_inputs=True)
register_legacy_binary("Pow", _pow)


@in_float32
def _float_mod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a - floor(a / b) * b: the remainder takes b's sign, a zero remainder too."""
    rem = torch.fmod(a, b)
    rem = torch.where((rem != 0) & ((rem < 0) != (b < 0)), rem + b, rem)
    return torch.where(rem == 0, torch.copysign(rem, b), rem)


@register("Mod", since=10)
def mod(ctx: OpContext, a, b, *, fmod=0):
    """fmod=0: the remainder has the divisor's sign (floor division); fmod=1: the dividend's (C fmod)."""
    if a.is_floating_point():
        return torch.fmod(a, b) if fmod else _float_mod(a, b)
    if a.dtype == torch.uint64:
        return _udivmod64(a, b)[1]
    return widened(torch.fmod if fmod else torch.remainder)(a, b)


@register("BitShift", since=11)
def bit_shift(ctx: OpContext, x, y, *, direction):
    """Shift X by Y bits; a right shift of a signed type is arithmetic. A shift amount that is negative
    or at least the bit width gives what the sign fill alone gives (-1 for a negative X shifted right,
    else 0)."""
    bits = x.dtype.itemsize * 8
    value, amount = widen(x), widen(y)
    valid = (amount >= 0) & (amount < bits)
    amount = amount.clamp(0, bits - 1).to(value.dtype)
    if direction == "LEFT":
        shifted, fill = value << amount, torch.zeros_like(value)
    elif direction == "RIGHT":
        if x.dtype == torch.uint64:  # logical shift of the int64 bit pattern
            logical = ((value >> 1) & _INT64_MAX) >> (amount - 1).clamp(min=0)
            shifted = torch.where(amount == 0, value, logical)
        else:
            shifted = value >> amount
        fill = torch.where(value < 0, -1, 0).to(value.dtype) if x.dtype.is_signed else 0
    else:
        raise ValueError(f"direction must be LEFT or RIGHT, not {direction!r}")
    return narrow(torch.where(valid, shifted, fill), x.dtype)


# -- variadic -------------------------------------------------------------------------------------------


def _maximum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return from_order_key(torch.maximum(order_key(a), order_key(b)), a.dtype)


def _minimum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return from_order_key(torch.minimum(order_key(a), order_key(b)), a.dtype)


def _folding(fn: Fn) -> Fn:
    """The variadic form of binary `fn`, folded left to right."""

    def fold(*inputs: torch.Tensor) -> torch.Tensor:
        return functools.reduce(fn, inputs)

    return fold


def _mean(*inputs: torch.Tensor) -> torch.Tensor:
    return functools.reduce(torch.add, inputs) / len(inputs)


def _register_variadic(op_type: str, fn: Fn) -> None:
    """Register `fn(*inputs)` with opset 1's `consumed_inputs` and without from opset 6. Opset 6 wanted
    equal shapes and opset 8 broadcasts; broadcasting serves both."""

    def variadic(ctx: OpContext, *inputs):
        return fn(*inputs)

    def variadic_v1(ctx: OpContext, *inputs, consumed_inputs=None):
        return fn(*inputs)

    register(op_type, since=1)(variadic_v1)
    register(op_type, since=6)(variadic)


for _op, _fn in {
    "Sum": _folding(widened(torch.add)),
    "Mean": _mean,
    "Max": _folding(_maximum),
    "Min": _folding(_minimum),
}.items():
    _register_variadic(_op, _fn)


# -- Clip, Where, Bernoulli -----------------------------------------------------------------------------


def _clip(x: torch.Tensor, low, high) -> torch.Tensor:
    """max(x, low) then min(., high): when low > high every element becomes high. NaN stays NaN."""
    key = order_key(x)
    if low is not None:
        key = torch.maximum(key, order_key(low).to(key.dtype))
    if high is not None:
        key = torch.minimum(key, order_key(high).to(key.dtype))
    return from_order_key(key, x.dtype)


def _bound(value: float | None, like: torch.Tensor) -> torch.Tensor | None:
    return None if value is None else torch.full((), value, dtype=like.dtype, device=like.device)


@register("Clip", since=1)
def clip_v1(ctx: OpContext, x, *, min=None, max=None, consumed_inputs=None):
    return _clip(x, _bound(min, x), _bound(max, x))


@register("Clip", since=6)
def clip_v6(ctx: OpContext, x, *, min=-_FLT_MAX, max=_FLT_MAX):
    return _clip(x, _bound(min, x), _bound(max, x))


@register("Clip", since=11)
def clip(ctx: OpContext, x, min=None, max=None):
    """Bounds are optional scalar inputs from opset 11."""
    return _clip(x, min, max)


@register("Where", since=9)
def where(ctx: OpContext, condition, x, y):
    if isinstance(x, np.ndarray):  # string tensors
        return np.where(condition.cpu().numpy(), x, y)
    return torch.where(condition, x, y)


@register("Bernoulli", since=15)
def bernoulli(ctx: OpContext, x, *, dtype=None, seed=None):
    """1 with probability x, else 0, in `dtype` (default: x's type). A `seed` makes runs repeatable;
    the values need not match other runtimes'."""
    generator = None
    if seed is not None:
        generator = torch.Generator(device=x.device)
        generator.manual_seed(int(seed))
    sample = torch.bernoulli(x.float() if x.dtype in _HALF else x, generator=generator)
    return sample.to(x.dtype if dtype is None else to_dtype(dtype))
