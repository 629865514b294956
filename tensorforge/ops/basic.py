"""Graph plumbing ops: Constant and Identity."""

from __future__ import annotations

import numpy as np
import torch

from .registry import OpContext, register


@register("Identity", since=1)
def identity(ctx: OpContext, x):
    return x


@register("Constant", since=1)
def constant(
    ctx: OpContext,
    *,
    value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
    sparse_value=None,
):
    if value is not None:
        return value.to(ctx.device) if isinstance(value, torch.Tensor) else value
    if sparse_value is not None:
        return sparse_value.to(ctx.device)
    if value_float is not None:
        return torch.tensor(value_float, dtype=torch.float32, device=ctx.device)
    if value_floats is not None:
        return torch.tensor(value_floats, dtype=torch.float32, device=ctx.device)
    if value_int is not None:
        return torch.tensor(value_int, dtype=torch.int64, device=ctx.device)
    if value_ints is not None:
        return torch.tensor(value_ints, dtype=torch.int64, device=ctx.device)
    if value_string is not None:
        return np.array(value_string, dtype=object)
    if value_strings is not None:
        return np.array(value_strings, dtype=object)
    raise ValueError("Constant node has no value attribute")
