"""Small utilities shared by the op implementations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..ir import DType

# torch implements few kernels for these; ops compute in a wider type and cast back.
_WIDEN = {torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}


def widen(x: torch.Tensor) -> torch.Tensor:
    """`x` in a dtype torch has kernels for (uint16/32/64 go to a wider signed type)."""
    wider = _WIDEN.get(x.dtype)
    return x if wider is None else x.to(wider)


def narrow(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast a widened result back to `dtype` (wrapping like the narrow type would)."""
    if x.dtype == dtype:
        return x
    if dtype == torch.uint64 and x.dtype == torch.int64:
        return x.view(torch.uint64)
    return x.to(dtype)


_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MOVABLE = {torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
_MOVABLE |= {torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}


def bits(x: torch.Tensor) -> torch.Tensor:
    """`x`, or a same-width integer view of it for dtypes torch lacks gather/scatter/where kernels for
    (uint16/32/64, bf16, float8): copy data through it and `.view(x.dtype)` back, bit-exactly."""
    return x if x.dtype in _MOVABLE else x.view(_BIT_VIEWS[x.element_size()])


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def to_ints(value: Any) -> list[int]:
    """A list of Python ints from a 1-D tensor, a scalar tensor or a sequence."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def to_dtype(onnx_type: int) -> torch.dtype:
    """The torch dtype (or carrier) for an ONNX element-type number from an attribute."""
    return DType(onnx_type).torch


def onnx_dtype(onnx_type: int) -> DType:
    return DType(onnx_type)


def same_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    return tuple(a) == tuple(b)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32 when it is a float narrower than that (fp16, bf16, fp8): ops compute there and cast
    the result back, as GPU kernels accumulate in float32."""
    return x.float() if x.dtype.is_floating_point and x.dtype.itemsize < 4 else x
