"""Shape manipulation ops: reshaping, slicing, concatenation, padding and shape-derived constants.

These ops move data without arithmetic, so they work on every dtype torch can hold (sub-byte carriers
included); Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Shape and Size also take string tensors.
Attribute-to-input moves in the opset history are separate registrations over shared helpers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .helpers import bits, normalize_axis, to_dtype, to_ints
from .registry import OpContext, register

# -- Reshape, Flatten, Transpose, Squeeze, Unsqueeze ---------------------------------------------------


def _reshape(x: torch.Tensor, shape: Sequence[int], allowzero: int) -> torch.Tensor:
    """numpy reshape where a 0 copies the input dim at that index (unless `allowzero`) and -1 is inferred."""
    dims = [x.shape[i] if dim == 0 and not allowzero else dim for i, dim in enumerate(shape)]
    return x.reshape(dims)


@register("Reshape", since=1)
def reshape_v1(ctx: OpContext, data, *, shape=None, consumed_inputs=None):
    return _reshape(data, to_ints(shape), allowzero=0)


@register("Reshape", since=5)
def reshape_v5(ctx: OpContext, data, shape):
    return _reshape(data, to_ints(shape), allowzero=0)


@register("Reshape", since=14)
def reshape(ctx: OpContext, data, shape, *, allowzero=0):
    return _reshape(data, to_ints(shape), allowzero)


@register("Flatten", since=1)
def flatten(ctx: OpContext, x, *, axis=1):
    """A 2-D view: dims before `axis` (in [-r, r]) become the rows, the rest the columns."""
    rank = x.ndim
    if not -rank <= axis <= rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    axis += rank if axis < 0 else 0
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@register("Transpose", since=1)
def transpose(ctx: OpContext, data, *, perm=None):
    """Permute the axes by `perm`; without it, reverse them."""
    perm = list(range(data.ndim - 1, -1, -1)) if perm is None else perm
    return data.transpose(perm) if isinstance(data, np.ndarray) else data.permute(perm)


def _squeeze(x: torch.Tensor, axes: list[int] | None) -> torch.Tensor:
    """Drop the size-1 `axes` (all size-1 axes when None)."""
    if axes is None:
        return x.reshape([d for d in x.shape if d != 1])
    axes = {normalize_axis(a, x.ndim) for a in axes}
    if any(x.shape[a] != 1 for a in axes):
        raise ValueError(f"cannot squeeze axes {sorted(axes)} of shape {list(x.shape)}")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


@register("Squeeze", since=1)
def squeeze_v1(ctx: OpContext, data, *, axes=None):
    return _squeeze(data, axes)


@register("Squeeze", since=13)
def squeeze(ctx: OpContext, data, axes=None):
    return _squeeze(data, None if axes is None else to_ints(axes))


def _unsqueeze(x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    """Insert size-1 dims at `axes`, which index the output shape."""
    rank = x.ndim + len(axes)
    axes = sorted(normalize_axis(a, rank) for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"repeated axes {axes}")
    shape = list(x.shape)
    for axis in axes:
        shape.insert(axis, 1)
    return x.reshape(shape)


@register("Unsqueeze", since=1)
def unsqueeze_v1(ctx: OpContext, data, *, axes):
    return _unsqueeze(data, axes)


@register("Unsqueeze", since=13)
def unsqueeze(ctx: OpContext, data, axes):
    return _unsqueeze(data, to_ints(axes))


# -- Concat, Split, Slice ------------------------------------------------------------------------------


def _concat(inputs: Sequence[torch.Tensor], axis: int) -> torch.Tensor:
    axis = normalize_axis(axis, inputs[0].ndim)
    if isinstance(inputs[0], np.ndarray):
        return np.concatenate(inputs, axis=axis)
    return torch.cat(list(inputs), dim=axis)


@register("Concat", since=1)
def concat_v1(ctx: OpContext, *inputs, axis=1):
    return _concat(inputs, axis)


@register("Concat", since=4)
def concat(ctx: OpContext, *inputs, axis):
    return _concat(inputs, axis)


def _split(
    x: torch.Tensor, axis: int, sizes: list[int] | None, parts: int, uneven: bool = False
) -> tuple[torch.Tensor, ...]:
    """Split `x` along `axis` into `sizes`, or else into `parts` equal parts. With `uneven` the parts
    have size ceil(dim / parts) and the last one is smaller; otherwise `parts` must divide the dim."""
    axis = normalize_axis(axis, x.dim())
    dim = x.shape[axis]
    if not sizes:
        chunk = -(-dim // parts) if uneven else dim // parts
        if not uneven and chunk * parts != dim:
            raise ValueError(f"cannot split size {dim} into {parts} equal parts")
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
    if sum(sizes) != dim or min(sizes) < 0:
        raise ValueError(f"split sizes {sizes} do not fit size {dim}")
    return tuple(torch.split(x, sizes, dim=axis))


@register("Split", since=1)
def split_v1(ctx: OpContext, input, split_input=None, *, axis=0, split=None):
    """Opset 1 takes the sizes from the optional second input or from the `split` attribute."""
    sizes = to_ints(split_input) if split_input is not None else split
    return _split(input, axis, sizes, ctx.num_outputs)


@register("Split", since=2)
def split_v2(ctx: OpContext, input, *, axis=0, split=None):
    return _split(input, axis, split, ctx.num_outputs)


@register("Split", since=13)
def split_v13(ctx: OpContext, input, split=None, *, axis=0):
    return _split(input, axis, to_ints(split), ctx.num_outputs)


@register("Split", since=18)
def split(ctx: OpContext, input, split=None, *, axis=0, num_outputs=None):
    if split is not None and num_outputs is not None:
        raise ValueError("Split takes either the split input or num_outputs, not both")
    parts = ctx.num_outputs if num_outputs is None else num_outputs
    return _split(input, axis, to_ints(split), parts, uneven=num_outputs is not None)


def _slice(
    x: torch.Tensor,
    starts: list[int],
    ends: list[int],
    axes: list[int] | None,
    steps: list[int] | None,
) -> torch.Tensor:
    """numpy-style slicing: negative starts/ends count from the end and are clamped to the dim
    (to [0, dim] for positive steps, [-1, dim - 1] for negative ones)."""
    axes = list(range(len(starts))) if not axes else axes
    steps = steps or [1] * len(starts)
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        axis = normalize_axis(axis, x.dim())
        dim = x.shape[axis]
        if step == 0:
            raise ValueError("slice step cannot be 0")
        start += dim if start < 0 else 0
        end += dim if end < 0 else 0
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            x, start, end, step = x.flip(axis), dim - 1 - start, dim - 1 - end, -step
        x = x[(slice(None),) * axis + (slice(start, end, step),)]
    return x


@register("Slice", since=1)
def slice_v1(ctx: OpContext, data, *, starts, ends, axes=None):
    return _slice(data, starts, ends, axes, None)


@register("Slice", since=10)
def slice_(ctx: OpContext, data, starts, ends, axes=None, steps=None):
    return _slice(data, to_ints(starts), to_ints(ends), to_ints(axes), to_ints(steps))


# -- Expand, Tile --------------------------------------------------------------------------------------


@register("Expand", since=8)
def expand(ctx: OpContext, input, shape):
    """Broadcast `input` against `shape` (numpy rules: either side may hold the 1)."""
    return input.expand(torch.broadcast_shapes(tuple(input.shape), tuple(to_ints(shape))))


@register("Tile", since=1)
def tile_v1(ctx: OpContext, input, tiles, axis):
    """Opset 1 repeats along the single `axis` input, `tiles` times."""
    repeats = [1] * input.dim()
    repeats[normalize_axis(to_ints(axis)[0], input.dim())] = to_ints(tiles)[0]
    return input.repeat(repeats)


@register("Tile", since=6)
def tile(ctx: OpContext, input, repeats):
    return input.repeat(to_ints(repeats))


# -- Shape-derived tensors: Shape, Size, ConstantOfShape, Range, EyeLike ---------------------------------


def _int64(values, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


@register("Shape", since=1)
def shape_v1(ctx: OpContext, data):
    return _int64(list(data.shape), ctx.device)


@register("Shape", since=15)
def shape(ctx: OpContext, data, *, start=0, end=None):
    """The dims in [start, end), both counted from the back when negative and clamped to [0, rank]."""
    return _int64(list(data.shape)[start:end], ctx.device)


@register("Size", since=1)
def size(ctx: OpContext, data):
    return _int64(math.prod(data.shape), ctx.device)


@register("ConstantOfShape", since=9)
def constant_of_shape(ctx: OpContext, input, *, value=None):
    """A tensor of shape `input` filled with the one-element `value` (float32 zero by default)."""
    fill = torch.zeros((), dtype=torch.float32) if value is None else value
    return fill.reshape(()).to(ctx.device).expand(to_ints(input)).clone()


def _range(start, limit, delta, compute: torch.dtype | None = None) -> torch.Tensor:
    """start + i * delta for i < max(ceil((limit - start) / delta), 0), computed in `compute` (default:
    the input dtype; integers in int64) and returned in the input dtype."""
    dtype = start.dtype
    first, stop, step = (v.item() for v in (start, limit, delta))
    if dtype.is_floating_point:
        count = max(math.ceil((stop - first) / step), 0)
        compute = compute or dtype
    else:
        count = max(-((first - stop) // step), 0)
        compute = torch.int64
    steps = torch.arange(count, dtype=compute, device=start.device)
    return (start.to(compute) + steps * delta.to(compute)).to(dtype)


@register("Range", since=11)
def range_v11(ctx: OpContext, start, limit, delta):
    return _range(start, limit, delta)


@register("Range", since=27)
def range_(ctx: OpContext, start, limit, delta, *, stash_type=1):
    """float16/bfloat16 inputs are computed in the `stash_type` (float or double)."""
    compute = None
    if start.dtype in (torch.float16, torch.bfloat16):
        if stash_type not in (1, 11):
            raise ValueError(f"stash_type {stash_type} is not float (1) or double (11)")
        compute = to_dtype(stash_type)
    return _range(start, limit, delta, compute)


@register("EyeLike", since=9)
def eye_like(ctx: OpContext, input, *, dtype=None, k=0):
    """Ones on diagonal `k` (positive: above the main one) of a matrix shaped like `input`."""
    rows, cols = input.shape
    out_dtype = input.dtype if dtype is None else to_dtype(dtype)
    diagonal = _offsets(rows, cols, input.device) == k
    return diagonal.to(out_dtype)


def _offsets(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """col - row for every element of a rows x cols matrix."""
    return torch.arange(cols, device=device) - torch.arange(rows, device=device)[:, None]


@register("Trilu", since=14)
def trilu(ctx: OpContext, input, k=None, *, upper=1):
    """Keep the elements on and above (`upper`) or on and below diagonal `k` of the last two axes."""
    offset = to_ints(k)[0] if k is not None else 0
    offsets = _offsets(input.shape[-2], input.shape[-1], input.device)
    keep = offsets >= offset if upper else offsets <= offset
    data = bits(input)
    return torch.where(keep, data, torch.zeros((), dtype=data.dtype, device=data.device)).view(input.dtype)


# -- DepthToSpace, SpaceToDepth ------------------------------------------------------------------------


def _depth_to_space(x: torch.Tensor, blocksize: int, mode: str) -> torch.Tensor:
    """DCR takes the depth as (block row, block col, channel), CRD as (channel, block row, block col)."""
    b, c, h, w = x.shape
    bs = blocksize
    if mode == "DCR":
        tmp = x.reshape(b, bs, bs, c // bs**2, h, w).permute(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        tmp = x.reshape(b, c // bs**2, bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return tmp.reshape(b, c // bs**2, h * bs, w * bs)


@register("DepthToSpace", since=1)
def depth_to_space_v1(ctx: OpContext, input, *, blocksize):
    return _depth_to_space(input, blocksize, "DCR")


@register("DepthToSpace", since=11)
def depth_to_space(ctx: OpContext, input, *, blocksize, mode="DCR"):
    return _depth_to_space(input, blocksize, mode)


def _space_to_depth(x: torch.Tensor, blocksize: int, mode: str) -> torch.Tensor:
    """The inverse of `_depth_to_space` in the same mode."""
    b, c, h, w = x.shape
    bs = blocksize
    tmp = x.reshape(b, c, h // bs, bs, w // bs, bs)
    if mode == "DCR":
        tmp = tmp.permute(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        tmp = tmp.permute(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return tmp.reshape(b, c * bs**2, h // bs, w // bs)


@register("SpaceToDepth", since=1)
def space_to_depth_v1(ctx: OpContext, input, *, blocksize):
    return _space_to_depth(input, blocksize, "DCR")


@register("SpaceToDepth", since=28)
def space_to_depth(ctx: OpContext, input, *, blocksize, mode="DCR"):
    return _space_to_depth(input, blocksize, mode)


# -- Pad, CenterCropPad --------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "edge")


def _pad(
    x: torch.Tensor,
    pads: list[int],
    mode: str,
    value=0,
    axes: list[int] | None = None,
    modes: Sequence[str] = _PAD_MODES,
) -> torch.Tensor:
    """Pad (or, for negative pads, crop) `axes` by pads = [begin..., end...].

    Crops happen first; `constant` then fills with `value`, `edge` repeats the border, `reflect`
    mirrors about the border element (numpy's reflect) and `wrap` repeats the data periodically.
    """
    if mode not in modes:
        raise ValueError(f"pad mode {mode!r} is not one of {list(modes)}")
    rank = x.dim()
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"{len(pads)} pads for {len(axes)} axes")
    widths = dict.fromkeys(range(rank), (0, 0))
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + len(axes)])
    for axis, (begin, end) in widths.items():
        x = x.narrow(axis, max(-begin, 0), x.shape[axis] - max(-begin, 0) - max(-end, 0))
    widths = {axis: (max(begin, 0), max(end, 0)) for axis, (begin, end) in widths.items()}
    if mode == "constant":
        shape = [x.shape[a] + sum(widths[a]) for a in range(rank)]
        out = torch.full(shape, value, dtype=x.dtype, device=x.device)
        region = tuple(slice(widths[a][0], widths[a][0] + x.shape[a]) for a in range(rank))
        out[region] = x
        return out
    for axis, (begin, end) in widths.items():
        if begin or end:
            x = x.index_select(axis, _source_index(x.shape[axis], begin, end, mode, x.device))
    return x


def _source_index(dim: int, begin: int, end: int, mode: str, device: torch.device) -> torch.Tensor:
    """For each output position along a padded axis, the input position it copies."""
    if dim == 0:
        raise ValueError(f"cannot {mode}-pad an empty axis")
    index = torch.arange(-begin, dim + end, device=device)
    if mode == "edge":
        return index.clamp(0, dim - 1)
    if mode == "wrap":
        return index.remainder(dim)
    if dim == 1:
        return torch.zeros_like(index)
    period = 2 * (dim - 1)
    index = index.remainder(period)
    return torch.where(index < dim, index, period - index)


def _fill_value(x: torch.Tensor, value) -> int | float | bool:
    """A constant pad value as a Python scalar of `x`'s kind (a tensor input or a float attribute)."""
    if value is None:
        return 0
    scalar = value.item() if isinstance(value, torch.Tensor) else value
    if x.dtype == torch.bool:
        return bool(scalar)
    return scalar if x.dtype.is_floating_point or x.dtype.is_complex else int(scalar)


@register("Pad", since=1)
def pad_v1(ctx: OpContext, data, *, paddings, mode="constant", value=0.0):
    return _pad(data, paddings, mode, _fill_value(data, value))


@register("Pad", since=2)
def pad_v2(ctx: OpContext, data, *, pads, mode="constant", value=0.0):
    return _pad(data, pads, mode, _fill_value(data, value))


@register("Pad", since=11)
def pad_v11(ctx: OpContext, data, pads, constant_value=None, *, mode="constant"):
    return _pad(data, to_ints(pads), mode, _fill_value(data, constant_value))


@register("Pad", since=18)
def pad_v18(ctx: OpContext, data, pads, constant_value=None, axes=None, *, mode="constant"):
    axes = None if axes is None else to_ints(axes)
    return _pad(data, to_ints(pads), mode, _fill_value(data, constant_value), axes)


@register("Pad", since=19)
def pad(ctx: OpContext, data, pads, constant_value=None, axes=None, *, mode="constant"):
    """Opset 19 adds the `wrap` mode."""
    axes = None if axes is None else to_ints(axes)
    value = _fill_value(data, constant_value)
    return _pad(data, to_ints(pads), mode, value, axes, modes=(*_PAD_MODES, "wrap"))


@register("CenterCropPad", since=18)
def center_crop_pad(ctx: OpContext, input_data, shape, *, axes=None):
    """Crop or zero-pad `axes` to `shape`, centred; an odd excess is cropped from (or padded on) the end."""
    rank = input_data.dim()
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    begins, ends = [], []
    for axis, target in zip(axes, to_ints(shape), strict=True):
        excess = input_data.shape[axis] - target
        begin = -(excess // 2) if excess >= 0 else -excess // 2
        begins.append(begin)
        ends.append(target - input_data.shape[axis] - begin)
    return _pad(input_data, begins + ends, "constant", 0, axes)


# -- Col2Im --------------------------------------------------------------------------------------------


@register("Col2Im", since=18)
def col2im(ctx: OpContext, input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """Sum the column blocks of `input` [N, C * prod(block), L] back into an image [N, C, *image_shape]
    (N-D torch.nn.functional.fold): block l, offset k lands at l * stride + k * dilation - pad_begin."""
    image, block = to_ints(image_shape), to_ints(block_shape)
    ndim = len(image)
    dilations = dilations or [1] * ndim
    strides = strides or [1] * ndim
    pads = pads or [0] * (2 * ndim)
    padded = [image[i] + pads[i] + pads[i + ndim] for i in range(ndim)]
    counts = [(padded[i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(ndim)]
    batch, rows, length = input.shape
    channels = rows // math.prod(block)
    if length != math.prod(counts):
        raise ValueError(f"{length} blocks, expected {math.prod(counts)} for image {image}")
    device = input.device
    target = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(ndim):
        offset = _along(torch.arange(block[i], device=device) * dilations[i], i, 2 * ndim)
        start = _along(torch.arange(counts[i], device=device) * strides[i], ndim + i, 2 * ndim)
        target = target * padded[i] + offset + start
    out = torch.zeros(batch, channels, math.prod(padded), dtype=input.dtype, device=device)
    columns = input.reshape(batch, channels, -1)
    out.index_add_(2, target.reshape(-1), columns)
    out = out.reshape(batch, channels, *padded)
    for i in range(ndim):
        out = out.narrow(2 + i, pads[i], image[i])
    return out


def _along(values: torch.Tensor, axis: int, rank: int) -> torch.Tensor:
    """1-D `values` laid along `axis` of a rank-`rank` broadcastable shape."""
    return values.reshape([-1 if a == axis else 1 for a in range(rank)])
