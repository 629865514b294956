"""Reductions: the Reduce* family, ArgMax/ArgMin, TopK, CumSum and CumProd.

A Reduce* op moves the reduced axes last and flattens them into one, so each kernel reduces the last
dimension. An empty `axes` reduces every axis, unless `noop_with_empty_axes` is set (when `axes` became an
input: opset 13 for ReduceSum, 18 for the rest); then each element is its own singleton set, so
ReduceSumSquare squares, ReduceL1 takes |x| and so on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .helpers import narrow, normalize_axis, to_ints, upcast, widen
from .registry import OpContext, register

_SIGN_BIT = -(2**63)


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """A tensor torch can compare whose order matches `x`'s: uint16/32 widen, uint64 flips its sign bit."""
    if x.dtype == torch.uint64:
        return x.view(torch.int64) ^ _SIGN_BIT
    return widen(x)


def _from_order_key(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.uint64:
        return (key ^ _SIGN_BIT).view(torch.uint64)
    return narrow(key, dtype)


def _extreme(dtype: torch.dtype, largest: bool) -> bool | float | int:
    """The largest (or smallest) value of `dtype`: infinity for floats."""
    if dtype == torch.bool:
        return largest
    if dtype.is_floating_point:
        return math.inf if largest else -math.inf
    info = torch.iinfo(dtype)
    return info.max if largest else info.min


# -- Reduce* -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reduction:
    """`kernel` reduces the last dimension.

    `floating`: integers compute in float64 and truncate back (Log, Sqrt are float functions).
    `largest`: for ReduceMax (True) / ReduceMin (False): compare in order-key space; an empty set gives
    the smallest (largest) value of the type, -inf (inf) for floats.
    """

    kernel: Callable[[torch.Tensor], torch.Tensor]
    floating: bool = False
    largest: bool | None = None


def _mean(t: torch.Tensor) -> torch.Tensor:
    """Integer means truncate toward zero, like numpy's `mean(dtype=int)`."""
    if t.dtype.is_floating_point:
        return t.mean(-1)
    return torch.div(t.sum(-1), t.shape[-1], rounding_mode="trunc")


_REDUCTIONS = {
    "ReduceSum": _Reduction(lambda t: t.sum(-1)),
    "ReduceMean": _Reduction(_mean),
    "ReduceMax": _Reduction(lambda t: t.amax(-1), largest=True),
    "ReduceMin": _Reduction(lambda t: t.amin(-1), largest=False),
    "ReduceProd": _Reduction(lambda t: t.prod(-1)),
    "ReduceL1": _Reduction(lambda t: t.abs().sum(-1)),
    "ReduceL2": _Reduction(lambda t: (t * t).sum(-1).sqrt(), floating=True),
    "ReduceLogSum": _Reduction(lambda t: t.sum(-1).log(), floating=True),
    "ReduceLogSumExp": _Reduction(lambda t: torch.logsumexp(t, -1), floating=True),
    "ReduceSumSquare": _Reduction(lambda t: (t * t).sum(-1)),
}
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _reduce(spec: _Reduction, data: torch.Tensor, axes: list[int], keepdims: int, noop: bool):
    rank = data.dim()
    if axes:
        dims = sorted({normalize_axis(a, rank) for a in axes})
    else:
        dims = [] if noop else list(range(rank))
    kept = [d for d in range(rank) if d not in dims]
    size = math.prod(data.shape[d] for d in dims)
    flat = data.permute(kept + dims).reshape(*(data.shape[d] for d in kept), size)
    if keepdims:
        shape = [1 if d in dims else n for d, n in enumerate(data.shape)]
    else:
        shape = [data.shape[d] for d in kept]
    if spec.largest is not None:
        if size == 0:
            fill = _extreme(data.dtype, not spec.largest)
            return torch.full(shape, fill, dtype=data.dtype, device=data.device)
        return _from_order_key(spec.kernel(_order_key(flat)), data.dtype).reshape(shape)
    if spec.floating and not data.dtype.is_floating_point:
        flat = flat.double()
    return narrow(spec.kernel(upcast(widen(flat))), data.dtype).reshape(shape)


def _define_reduction(op_type: str, spec: _Reduction, axes_input_since: int) -> None:
    @register(op_type, since=1)
    def reduce_axes_attribute(ctx: OpContext, data, *, axes=None, keepdims=1):
        return _reduce(spec, data, list(axes or []), keepdims, noop=False)

    @register(op_type, since=axes_input_since)
    def reduce_axes_input(ctx: OpContext, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(spec, data, to_ints(axes), keepdims, noop=bool(noop_with_empty_axes))


for _op_type, _spec in _REDUCTIONS.items():
    _define_reduction(_op_type, _spec, _AXES_INPUT_SINCE.get(_op_type, 18))


# -- ArgMax / ArgMin ---------------------------------------------------------------------------------------


def _arg_extreme(data, axis: int, keepdims: int, select_last_index: int, largest: bool) -> torch.Tensor:
    """int64 index of the first (or last) extreme value along `axis`."""
    axis = normalize_axis(axis, data.dim())
    key = _order_key(data)
    if select_last_index:
        key = key.flip(axis)
    pick = torch.argmax if largest else torch.argmin
    index = pick(key, dim=axis, keepdim=bool(keepdims))
    return data.shape[axis] - 1 - index if select_last_index else index


def _define_arg(op_type: str, largest: bool) -> None:
    @register(op_type, since=1)
    def arg_first(ctx: OpContext, data, *, axis=0, keepdims=1):
        return _arg_extreme(data, axis, keepdims, 0, largest)

    @register(op_type, since=12)
    def arg_select(ctx: OpContext, data, *, axis=0, keepdims=1, select_last_index=0):
        return _arg_extreme(data, axis, keepdims, select_last_index, largest)


_define_arg("ArgMax", largest=True)
_define_arg("ArgMin", largest=False)


# -- TopK --------------------------------------------------------------------------------------------------


def _top_k(x: torch.Tensor, k: int, axis: int, largest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest (smallest) values along `axis`, sorted, and their int64 indices; equal values keep
    index order (lower index first). NaN counts as larger than every number."""
    axis = normalize_axis(axis, x.dim())
    if not 0 <= k <= x.shape[axis]:
        raise ValueError(f"k = {k} is out of range for axis {axis} of size {x.shape[axis]}")
    ranked = torch.sort(_order_key(x), dim=axis, descending=bool(largest), stable=True)
    values = _from_order_key(ranked.values.narrow(axis, 0, k), x.dtype)
    return values, ranked.indices.narrow(axis, 0, k)


@register("TopK", since=1)
def top_k_1(ctx: OpContext, x, *, k, axis=-1):
    return _top_k(x, k, axis, largest=1)


@register("TopK", since=10)
def top_k_10(ctx: OpContext, x, k, *, axis=-1):
    return _top_k(x, to_ints(k)[0], axis, largest=1)


@register("TopK", since=11)
def top_k_11(ctx: OpContext, x, k, *, axis=-1, largest=1, sorted=1):
    """`sorted=0` leaves the order unspecified; the output is sorted anyway."""
    return _top_k(x, to_ints(k)[0], axis, largest)


# -- CumSum / CumProd --------------------------------------------------------------------------------------


def _cumulate(x: torch.Tensor, axis, exclusive: int, reverse: int, scan, identity: int) -> torch.Tensor:
    """Inclusive scan along `axis`; `exclusive` shifts the input by one (first output is the identity),
    `reverse` scans from the end."""
    dim = normalize_axis(to_ints(axis)[0], x.dim())
    y = upcast(widen(x))
    if reverse:
        y = y.flip(dim)
    if exclusive:
        n = y.shape[dim]
        first = torch.full_like(y.narrow(dim, 0, min(n, 1)), identity)
        y = torch.cat([first, y.narrow(dim, 0, max(n - 1, 0))], dim)
    y = scan(y, dim)
    if reverse:
        y = y.flip(dim)
    return narrow(y, x.dtype)


@register("CumSum", since=11)
def cum_sum(ctx: OpContext, x, axis, *, exclusive=0, reverse=0):
    return _cumulate(x, axis, exclusive, reverse, torch.cumsum, 0)


@register("CumProd", since=26)
def cum_prod(ctx: OpContext, x, axis, *, exclusive=0, reverse=0):
    return _cumulate(x, axis, exclusive, reverse, torch.cumprod, 1)
