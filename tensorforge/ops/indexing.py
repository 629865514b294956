"""Indexing ops: gathers, scatters, selections and Unique.

Negative indices count from the end of their axis; Gather also takes string tensors. Pure data movement
runs on `helpers.bits` views, so every dtype is moved bit-exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .helpers import bits, narrow, normalize_axis, widen
from .registry import OpContext, register


def _wrap(indices: torch.Tensor, size: int | torch.Tensor) -> torch.Tensor:
    """int64 `indices` with negatives counted from `size`."""
    indices = indices.to(torch.int64)
    return torch.where(indices < 0, indices + size, indices)


# -- Gathers -------------------------------------------------------------------------------------------


@register("Gather", since=1)
def gather(ctx: OpContext, data, indices, *, axis=0):
    """output[i..., j..., k...] = data[i..., indices[j...], k...] along `axis`."""
    axis = normalize_axis(axis, data.ndim)
    if isinstance(data, np.ndarray):
        return np.take(data, _wrap(indices, data.shape[axis]).cpu().numpy(), axis=axis)
    flat = _wrap(indices, data.shape[axis]).reshape(-1)
    picked = bits(data).index_select(axis, flat).view(data.dtype)
    return picked.reshape((*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :]))


@register("GatherElements", since=11)
def gather_elements(ctx: OpContext, data, indices, *, axis=0):
    """output[i][j] = data[indices[i][j]][j] for axis 0 (likewise for other axes)."""
    axis = normalize_axis(axis, data.dim())
    index = _wrap(indices, data.shape[axis])
    return torch.gather(bits(data), axis, index).view(data.dtype)


def _gather_nd(data: torch.Tensor, indices: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """Index the dims after the `batch_dims` leading ones by the tuples in the last axis of `indices`."""
    depth = indices.shape[-1]
    batch_shape = data.shape[:batch_dims]
    indexed, tail = data.shape[batch_dims : batch_dims + depth], data.shape[batch_dims + depth :]
    batches = math.prod(batch_shape)
    rows = _linear(indices.reshape(batches, -1, depth), indexed)
    table = bits(data).reshape(batches, math.prod(indexed), *tail)
    picked = table[torch.arange(batches, device=data.device)[:, None], rows].view(data.dtype)
    return picked.reshape((*indices.shape[:-1], *tail))


def _linear(indices: torch.Tensor, dims) -> torch.Tensor:
    """Row-major linear positions of the index tuples in the last axis of `indices` into `dims`."""
    position = torch.zeros(indices.shape[:-1], dtype=torch.int64, device=indices.device)
    for i, dim in enumerate(dims):
        position = position * dim + _wrap(indices[..., i], dim)
    return position


@register("GatherND", since=11)
def gather_nd_v11(ctx: OpContext, data, indices):
    return _gather_nd(data, indices, 0)


@register("GatherND", since=12)
def gather_nd(ctx: OpContext, data, indices, *, batch_dims=0):
    return _gather_nd(data, indices, batch_dims)


# -- Scatters ------------------------------------------------------------------------------------------

_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _check_reduction(reduction: str, allowed: tuple[str, ...]) -> None:
    if reduction not in allowed:
        raise ValueError(f"reduction {reduction!r} is not one of {list(allowed)}")


def _scatter_elements(
    data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, axis: int, reduction: str
) -> torch.Tensor:
    """output[indices[i][j]][j] = f(output[...], updates[i][j]) for axis 0 (likewise other axes), with f
    replacing for `none`, else the named reduction applied in index order."""
    axis = normalize_axis(axis, data.dim())
    index = _wrap(indices, data.shape[axis])
    if reduction == "none":
        return bits(data).scatter(axis, index, bits(updates)).view(data.dtype)
    wide = widen(data)
    out = wide.scatter_reduce(axis, index, updates.to(wide.dtype), _REDUCE[reduction], include_self=True)
    return narrow(out, data.dtype)


@register("Scatter", since=9)
def scatter(ctx: OpContext, data, indices, updates, *, axis=0):
    """The deprecated name of ScatterElements without reduction."""
    return _scatter_elements(data, indices, updates, axis, "none")


@register("ScatterElements", since=11)
def scatter_elements_v11(ctx: OpContext, data, indices, updates, *, axis=0):
    return _scatter_elements(data, indices, updates, axis, "none")


@register("ScatterElements", since=16)
def scatter_elements_v16(ctx: OpContext, data, indices, updates, *, axis=0, reduction="none"):
    _check_reduction(reduction, ("none", "add", "mul"))
    return _scatter_elements(data, indices, updates, axis, reduction)


@register("ScatterElements", since=18)
def scatter_elements(ctx: OpContext, data, indices, updates, *, axis=0, reduction="none"):
    _check_reduction(reduction, ("none", "add", "mul", "max", "min"))
    return _scatter_elements(data, indices, updates, axis, reduction)


def _scatter_nd(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, reduction: str):
    """output[indices[idx]] = f(output[indices[idx]], updates[idx]) over the index tuples in the last
    axis of `indices` (f as in `_scatter_elements`)."""
    depth = indices.shape[-1]
    indexed, tail = data.shape[:depth], data.shape[depth:]
    rows = _linear(indices, indexed).reshape(-1)
    if reduction == "none":
        table = bits(data).reshape(math.prod(indexed), *tail).clone()
        table[rows] = bits(updates).reshape(-1, *tail)
        return table.view(data.dtype).reshape(data.shape)
    table = widen(data).reshape(math.prod(indexed), -1)
    values = updates.to(table.dtype).reshape(rows.numel(), -1)
    index = rows[:, None].expand_as(values)
    out = table.scatter_reduce(0, index, values, _REDUCE[reduction], include_self=True)
    return narrow(out, data.dtype).reshape(data.shape)


@register("ScatterND", since=11)
def scatter_nd_v11(ctx: OpContext, data, indices, updates):
    return _scatter_nd(data, indices, updates, "none")


@register("ScatterND", since=16)
def scatter_nd_v16(ctx: OpContext, data, indices, updates, *, reduction="none"):
    _check_reduction(reduction, ("none", "add", "mul"))
    return _scatter_nd(data, indices, updates, reduction)


@register("ScatterND", since=18)
def scatter_nd(ctx: OpContext, data, indices, updates, *, reduction="none"):
    _check_reduction(reduction, ("none", "add", "mul", "max", "min"))
    return _scatter_nd(data, indices, updates, reduction)


@register("TensorScatter", since=24)
def tensor_scatter(ctx: OpContext, past_cache, update, write_indices=None, *, mode="linear", axis=-2):
    """Write `update` into `past_cache` along the sequence `axis`, sample b from `write_indices[b]`
    (0 by default); `circular` wraps positions modulo the cache length."""
    axis = normalize_axis(axis, past_cache.dim())
    if axis == 0:
        raise ValueError("TensorScatter's axis cannot be the batch axis")
    if mode not in ("linear", "circular"):
        raise ValueError(f"unknown mode {mode!r}")
    batch, length, capacity = update.shape[0], update.shape[axis], past_cache.shape[axis]
    device = past_cache.device
    starts = torch.zeros(batch, dtype=torch.int64, device=device)
    if write_indices is not None:
        starts = write_indices.to(torch.int64)
    positions = starts[:, None] + torch.arange(length, device=device)
    if mode == "circular":
        positions = positions.remainder(capacity)
    elif length and int(positions.max()) >= capacity:
        raise ValueError(f"linear TensorScatter writes past the cache length {capacity}")
    shape = [batch if a == 0 else length if a == axis else 1 for a in range(update.dim())]
    index = positions.reshape(shape).expand(update.shape)
    return bits(past_cache).scatter(axis, index, bits(update)).view(past_cache.dtype)


# -- Selections ----------------------------------------------------------------------------------------


@register("Compress", since=9)
def compress(ctx: OpContext, input, condition, *, axis=None):
    """The slices along `axis` (of the flattened input when None) where `condition` is true; a shorter
    condition selects from the first entries only (numpy.compress)."""
    if axis is None:
        input, axis = input.reshape(-1), 0
    axis = normalize_axis(axis, input.dim())
    chosen = torch.nonzero(condition.reshape(-1)).reshape(-1)
    return input.index_select(axis, chosen)


@register("NonZero", since=9)
def nonzero(ctx: OpContext, X):
    """The indices of the non-zero elements, int64 [rank, count], in row-major order."""
    return torch.nonzero(X != 0).T.contiguous()


def _one_hot(indices, depth, values, axis: int, wrap_negative: bool) -> torch.Tensor:
    """`values[1]` where the new `axis` position equals the index, else `values[0]`; out-of-range indices
    give all `values[0]`. With `wrap_negative`, indices in [-depth, -1] count from the end."""
    size = int(depth.reshape(-1)[0])
    positions = indices.to(torch.int64)
    if wrap_negative:
        positions = torch.where(positions < 0, positions + size, positions)
    hot = positions[..., None] == torch.arange(size, device=indices.device)
    hot = hot.movedim(-1, normalize_axis(axis, indices.dim() + 1))
    off, on = bits(values).reshape(-1)[0], bits(values).reshape(-1)[1]
    return torch.where(hot, on, off).view(values.dtype)


@register("OneHot", since=9)
def one_hot_v9(ctx: OpContext, indices, depth, values, *, axis=-1):
    return _one_hot(indices, depth, values, axis, wrap_negative=False)


@register("OneHot", since=11)
def one_hot(ctx: OpContext, indices, depth, values, *, axis=-1):
    return _one_hot(indices, depth, values, axis, wrap_negative=True)


@register("ReverseSequence", since=10)
def reverse_sequence(ctx: OpContext, input, sequence_lens, *, batch_axis=1, time_axis=0):
    """For each batch entry b, reverse the first `sequence_lens[b]` steps along `time_axis`."""
    moved = input.movedim((time_axis, batch_axis), (0, 1))
    steps = torch.arange(moved.shape[0], device=input.device)[:, None]
    lengths = sequence_lens.to(torch.int64)[None, :]
    source = torch.where(steps < lengths, lengths - 1 - steps, steps)
    index = source.reshape(*source.shape, *[1] * (moved.dim() - 2)).expand(moved.shape)
    return torch.gather(bits(moved), 0, index).view(input.dtype).movedim((0, 1), (time_axis, batch_axis))


# -- Unique --------------------------------------------------------------------------------------------


@register("Unique", since=11)
def unique(ctx: OpContext, X, *, axis=None, sorted=1):
    """Unique elements (or slices along `axis`), ascending or in order of first occurrence, with the
    first-occurrence indices, each input entry's position in the result and the counts (all int64)."""
    moved = X.reshape(-1, 1) if axis is None else X.movedim(normalize_axis(axis, X.dim()), 0)
    rows = moved.reshape(moved.shape[0], -1)
    keys = rows.float() if rows.dtype in (torch.float16, torch.bfloat16) else widen(rows)
    values, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    count, device = rows.shape[0], X.device
    first = torch.full((values.shape[0],), count, dtype=torch.int64, device=device)
    first = first.scatter_reduce(0, inverse, torch.arange(count, device=device), "amin")
    if not sorted:
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=device)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    result = moved.index_select(0, first)
    if axis is not None:
        result = result.movedim(0, normalize_axis(axis, X.dim()))
    else:
        result = result.reshape(-1)
    return result, first, inverse, counts.to(torch.int64)
