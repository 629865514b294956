"""Softmax, LogSoftmax and Hardmax.

Before opset 13 the input is coerced to 2-D, [prod(shape[:axis]), prod(shape[axis:])], and the op runs
over the second dimension (default axis 1); from opset 13 it runs along the single axis (default -1).
fp16/bf16 compute in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .helpers import normalize_axis, upcast
from .registry import OpContext, register

Kernel = Callable[[torch.Tensor, int], torch.Tensor]


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """1 at the first maximum along `dim`, 0 elsewhere."""
    if x.numel() == 0:
        return torch.zeros_like(x)
    return torch.zeros_like(x).scatter_(dim, x.argmax(dim, keepdim=True), 1)


_KERNELS: dict[str, Kernel] = {
    "Softmax": lambda x, dim: torch.softmax(x, dim),
    "LogSoftmax": lambda x, dim: torch.log_softmax(x, dim),
    "Hardmax": _hardmax,
}


def _per_axis(kernel: Kernel, x: torch.Tensor, axis: int) -> torch.Tensor:
    return kernel(upcast(x), normalize_axis(axis, x.dim())).to(x.dtype)


def _coerced_2d(kernel: Kernel, x: torch.Tensor, axis: int) -> torch.Tensor:
    axis = normalize_axis(axis, x.dim())
    rows = math.prod(x.shape[:axis])
    flat = x.reshape(rows, math.prod(x.shape[axis:]))
    return _per_axis(kernel, flat, 1).reshape(x.shape)


def _define(op_type: str, kernel: Kernel) -> None:
    @register(op_type, since=1)
    def coerced(ctx: OpContext, x, *, axis=1):
        return _coerced_2d(kernel, x, axis)

    @register(op_type, since=13)
    def per_axis(ctx: OpContext, x, *, axis=-1):
        return _per_axis(kernel, x, axis)


for _op_type, _kernel in _KERNELS.items():
    _define(_op_type, _kernel)
