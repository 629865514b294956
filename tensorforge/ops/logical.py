"""Comparison, logical and bitwise ops, IsNaN/IsInf and Sign.

Comparisons return bool tensors. Integers are compared through `order_key`, so uint64 values of 2**63 and
more keep their order; Equal also compares string tensors (opset 19).
"""

from __future__ import annotations

import numpy as np
import torch

from .elementwise import (
    Fn,
    legacy_broadcast,
    order_key,
    register_binary,
    register_legacy_binary,
    register_unary,
    widened,
)
from .registry import OpContext, register


def _comparison(fn: Fn) -> Fn:
    def compare(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fn(order_key(a), order_key(b))

    return compare


@register("Equal", since=1)
def equal_v1(ctx: OpContext, a, b, *, broadcast=0, axis=None):
    return torch.eq(a, legacy_broadcast(a, b, broadcast, axis))


@register("Equal", since=7)
def equal(ctx: OpContext, a, b):
    if isinstance(a, np.ndarray):  # string tensors
        return torch.from_numpy(np.asarray(a == b, dtype=bool)).to(ctx.device)
    return torch.eq(order_key(a), order_key(b))


for _op, _fn in {
    "Greater": _comparison(torch.gt),
    "Less": _comparison(torch.lt),
    "And": torch.logical_and,
    "Or": torch.logical_or,
    "Xor": torch.logical_xor,
}.items():
    register_legacy_binary(_op, _fn)

register_binary("GreaterOrEqual", _comparison(torch.ge), since=12)
register_binary("LessOrEqual", _comparison(torch.le), since=12)
register_unary("Not", torch.logical_not)

register_binary("BitwiseAnd", widened(torch.bitwise_and), since=18)
register_binary("BitwiseOr", widened(torch.bitwise_or), since=18)
register_binary("BitwiseXor", widened(torch.bitwise_xor), since=18)
register_unary("BitwiseNot", widened(torch.bitwise_not), since=18)


def _as_float(x: torch.Tensor) -> torch.Tensor:
    """Float8 tensors widened to float32 (which keeps NaN and infinity), others unchanged."""
    return x.float() if x.dtype.itemsize == 1 else x


@register("IsNaN", since=9)
def is_nan(ctx: OpContext, x):
    return torch.isnan(_as_float(x))


@register("IsInf", since=10)
def is_inf(ctx: OpContext, x, *, detect_negative=1, detect_positive=1):
    x = _as_float(x)
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_positive:
        return torch.isposinf(x)
    if detect_negative:
        return torch.isneginf(x)
    return torch.zeros_like(x, dtype=torch.bool)


@register("Sign", since=9)
def sign(ctx: OpContext, x):
    """-1, 0 or 1 in x's type; NaN stays NaN."""
    if x.is_floating_point():
        return torch.where(torch.isnan(x), x, torch.sign(x))
    if not x.dtype.is_signed:
        return (x != 0).to(x.dtype)
    return torch.sign(x)
