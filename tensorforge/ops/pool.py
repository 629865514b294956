"""Pooling ops (MaxPool, AveragePool, LpPool, their global forms, MaxUnpool) and the sliding-window
geometry they share with the convolutions.

Pools run on an explicit-padding view of every window, `sliding_windows`, so any rank, asymmetric pads,
dilations and ceil mode follow the ONNX definitions exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .registry import OpContext, register


def window_geometry(
    in_shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    same_crops: bool = False,
) -> tuple[list[int], list[int], list[int]]:
    """`(pads_begin, pads_end, out_shape)` of a window sliding over the spatial `in_shape`.

    With span = (kernel - 1) * dilation + 1: SAME_UPPER/SAME_LOWER give out = ceil(in / stride) and pad
    (out - 1) * stride + span - in in total, the odd element at the end (UPPER) or the beginning (LOWER);
    a negative total (span < stride) crops with `same_crops`, as the pooling ops' formula and onnxruntime
    do, and pads nothing otherwise, as convolutions do. VALID pads nothing. Explicit pads give
    out = floor((in + pads - span) / stride) + 1, or in ceil mode the ceiling, dropping a last window
    that would start in the end padding.
    """
    n = len(in_shape)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    pads = list(pads or [0] * (2 * n))
    begin, end, out = [], [], []
    for i in range(n):
        size, stride = in_shape[i], strides[i]
        span = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            length = -(-size // stride)
            total = (length - 1) * stride + span - size
            if not same_crops:
                total = max(total, 0)
            # the smaller (UPPER) or larger half, rounded toward zero as onnxruntime does when cropping
            head = int(total / 2) if auto_pad == "SAME_UPPER" else int((total + 1) / 2)
            begin.append(head)
            end.append(total - head)
        elif auto_pad == "VALID":
            length = (size - span) // stride + 1
            begin.append(0)
            end.append(0)
        elif auto_pad == "NOTSET":
            begin.append(pads[i])
            end.append(pads[i + n])
            room = size + pads[i] + pads[i + n] - span
            length = (-(-room // stride) if ceil_mode else room // stride) + 1
            if ceil_mode and (length - 1) * stride >= size + pads[i]:
                length -= 1
        else:
            raise ValueError(f"unknown auto_pad {auto_pad!r}")
        out.append(max(length, 0))
    return begin, end, out


def sliding_windows(
    x: torch.Tensor,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads_begin: Sequence[int],
    out_shape: Sequence[int],
    fill: float,
) -> torch.Tensor:
    """A `(N, C, *out, *kernel)` view with `[n, c, o, k] = x[n, c, o * stride + k * dilation - pad]`,
    reading `fill` outside `x`."""
    n = len(kernel)
    if 0 in out_shape:
        return x.new_empty((*x.shape[:2], *out_shape, *kernel))
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    widths: list[int] = []
    for i in reversed(range(n)):  # F.pad lists the last axis first
        needed = (out_shape[i] - 1) * strides[i] + spans[i]
        widths += [pads_begin[i], needed - x.shape[2 + i] - pads_begin[i]]
    x = F.pad(x, widths, value=fill)
    for i in range(n):
        x = x.unfold(2 + i, spans[i], strides[i])
    return x[(..., *(slice(None, None, d) for d in dilations))]


@dataclass(frozen=True)
class ConvWindows:
    """A 2-D convolution node's window attributes, resolved; the kernel size comes from its weight, so
    `at(spatial, kernel)` gives the padding and the output size for one input and weight."""

    strides: list[int]
    dilations: list[int]
    pads: list[int] | None
    auto_pad: str
    groups: int

    @classmethod
    def of(cls, attributes: dict) -> ConvWindows:
        return cls(
            list(attributes.get("strides") or [1, 1]),
            list(attributes.get("dilations") or [1, 1]),
            attributes.get("pads"),
            attributes.get("auto_pad", "NOTSET"),
            attributes.get("group", 1),
        )

    def at(self, spatial, kernel) -> tuple[list[int], list[int], list[int]]:
        return window_geometry(spatial, kernel, self.strides, self.dilations, self.pads, self.auto_pad)


@dataclass(frozen=True)
class PoolWindows:
    """A pooling node's window, resolved from its ONNX attributes; `at(spatial)` gives the padding and the
    output size for one input size (auto-padding depends on it)."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int] | None
    auto_pad: str
    ceil_mode: int

    @classmethod
    def of(cls, attributes: dict) -> PoolWindows:
        kernel = list(attributes["kernel_shape"])
        return cls(
            kernel,
            list(attributes.get("strides") or [1] * len(kernel)),
            list(attributes.get("dilations") or [1] * len(kernel)),
            attributes.get("pads"),
            attributes.get("auto_pad", "NOTSET"),
            attributes.get("ceil_mode", 0),
        )

    def at(self, spatial) -> tuple[list[int], list[int], list[int]]:
        return window_geometry(
            spatial, self.kernel, self.strides, self.dilations, self.pads, self.auto_pad, self.ceil_mode,
            same_crops=True,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Windows:
    """The resolved window geometry of one pooling node."""

    in_shape: list[int]
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    begin: list[int]
    end: list[int]
    out: list[int]
    device: torch.device

    @classmethod
    def of(cls, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode) -> _Windows:
        n = x.ndim - 2
        in_shape, kernel = list(x.shape[2:]), list(kernel_shape)
        strides = list(strides or [1] * n)
        dilations = list(dilations or [1] * n)
        geometry = window_geometry(in_shape, kernel, strides, dilations, pads, auto_pad, ceil_mode, same_crops=True)
        return cls(in_shape, kernel, strides, dilations, *geometry, x.device)

    @property
    def dims(self) -> tuple[int, ...]:
        """The kernel axes of a window view."""
        return tuple(range(-len(self.kernel), 0))

    def view(self, x: torch.Tensor, fill: float) -> torch.Tensor:
        return sliding_windows(x, self.kernel, self.strides, self.dilations, self.begin, self.out, fill)

    def inside(self, include_pads: bool = False) -> torch.Tensor:
        """`(1, 1, *out, *kernel)` float mask of window cells inside the input (or its explicit pads)."""
        if include_pads:
            extent = [s + b + e for s, b, e in zip(self.in_shape, self.begin, self.end, strict=True)]
            begin = [0] * len(extent)
        else:
            extent, begin = self.in_shape, self.begin
        ones = torch.ones((1, 1, *extent), device=self.device)
        return sliding_windows(ones, self.kernel, self.strides, self.dilations, begin, self.out, 0.0)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype to compute in: float32 for float16/bfloat16, else the input's own."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


# -- MaxPool --------------------------------------------------------------------------------------------


def _lowest(dtype: torch.dtype) -> float:
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def _max_pool(ctx, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, storage_order):
    if x.is_floating_point() and x.element_size() == 1:  # an fp8 activation a max pool passes on: torch has no
        y, indices = _max_pool(  # maximum in it; float32 holds its values exactly, and the maximum is one of them
            ctx, x.float(), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, storage_order
        )
        return y.to(x.dtype), indices
    win = _Windows.of(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    values = win.view(x, _lowest(x.dtype))
    y = values.amax(dim=win.dims)
    if not ctx.output_present(1):
        return y, None
    return y, _argmax_indices(win, values, y, x.shape[:2], storage_order)


def _argmax_indices(win: _Windows, values, y, batch_channels, storage_order: int) -> torch.Tensor:
    """ONNX MaxPool indices: the first maximum of each window (cells in the padding never count),
    flattened over the whole input tensor, the spatial axes row-major (storage_order 0) or column-major."""
    n = len(win.kernel)
    flat = values.flatten(-n)
    best = y.unsqueeze(-1)
    hit = (flat == best) | (flat.isnan() & best.isnan())
    hit &= win.inside().flatten(-n).bool()
    choice = hit.to(torch.uint8).argmax(dim=-1)
    device = win.device
    axis_steps = [math.prod(win.in_shape[d + 1 :]) for d in range(n)]
    if storage_order:
        axis_steps = [math.prod(win.in_shape[:d]) for d in range(n)]
    batch, channels = batch_channels
    plane = torch.arange(batch * channels, device=device).reshape(batch, channels, *[1] * n)
    index = plane * math.prod(win.in_shape)
    for d in range(n):
        offset = (choice // math.prod(win.kernel[d + 1 :])) % win.kernel[d]
        start = torch.arange(win.out[d], device=device).reshape(-1, *[1] * (n - 1 - d)) * win.strides[d]
        position = start + offset * win.dilations[d] - win.begin[d]
        index = index + position * axis_steps[d]
    return index


@register("MaxPool", since=1)
def max_pool_1(ctx: OpContext, x, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    return _max_pool(ctx, x, kernel_shape, strides, None, pads, auto_pad, 0, 0)[0]


@register("MaxPool", since=8)
def max_pool_8(ctx: OpContext, x, *, auto_pad="NOTSET", kernel_shape, pads=None, storage_order=0, strides=None):
    return _max_pool(ctx, x, kernel_shape, strides, None, pads, auto_pad, 0, storage_order)


@register("MaxPool", since=22)  # bfloat16
@register("MaxPool", since=12)  # int8, uint8
@register("MaxPool", since=10)
def max_pool_10(
    ctx: OpContext,
    x,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape,
    pads=None,
    storage_order=0,
    strides=None,
):
    return _max_pool(ctx, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, storage_order)


# -- AveragePool and LpPool -----------------------------------------------------------------------------


def _average_pool(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, count_include_pad):
    """Window sums over the count of cells inside the input (or, with count_include_pad, inside the
    explicitly padded input: cells a ceil-mode window hangs past the end padding never count)."""
    win = _Windows.of(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    total = win.view(x.to(compute_dtype(x)), 0.0).sum(dim=win.dims)
    count = win.inside(include_pads=bool(count_include_pad)).sum(dim=win.dims)
    return (total / count).to(x.dtype)


@register("AveragePool", since=1)
def average_pool_1(ctx: OpContext, x, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    return _average_pool(x, kernel_shape, strides, None, pads, auto_pad, 0, 0)


@register("AveragePool", since=7)
def average_pool_7(ctx: OpContext, x, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape, pads=None, strides=None):
    return _average_pool(x, kernel_shape, strides, None, pads, auto_pad, 0, count_include_pad)


@register("AveragePool", since=10)
def average_pool_10(
    ctx: OpContext,
    x,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    kernel_shape,
    pads=None,
    strides=None,
):
    return _average_pool(x, kernel_shape, strides, None, pads, auto_pad, ceil_mode, count_include_pad)


@register("AveragePool", since=22)  # bfloat16
@register("AveragePool", since=19)
def average_pool_19(
    ctx: OpContext,
    x,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape,
    pads=None,
    strides=None,
):
    return _average_pool(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, count_include_pad)


def _lp_pool(x, p, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """(sum of |x|^p over the window) ^ (1/p); padding adds nothing."""
    win = _Windows.of(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    powers = x.to(compute_dtype(x)).abs().pow(p)
    return win.view(powers, 0.0).sum(dim=win.dims).pow(1.0 / p).to(x.dtype)


@register("LpPool", since=1)
def lp_pool_1(ctx: OpContext, x, *, auto_pad="NOTSET", kernel_shape, p=2.0, pads=None, strides=None):
    return _lp_pool(x, p, kernel_shape, strides, None, pads, auto_pad, 0)


@register("LpPool", since=2)
def lp_pool_2(ctx: OpContext, x, *, auto_pad="NOTSET", kernel_shape, p=2, pads=None, strides=None):
    return _lp_pool(x, p, kernel_shape, strides, None, pads, auto_pad, 0)


@register("LpPool", since=22)  # bfloat16
@register("LpPool", since=18)
def lp_pool_18(
    ctx: OpContext,
    x,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape,
    p=2,
    pads=None,
    strides=None,
):
    return _lp_pool(x, p, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)


# -- global pools and MaxUnpool -------------------------------------------------------------------------


@register("GlobalAveragePool", since=22)  # bfloat16
@register("GlobalAveragePool", since=1)
def global_average_pool(ctx: OpContext, x):
    dims = tuple(range(2, x.ndim))
    return x.mean(dim=dims, keepdim=True, dtype=compute_dtype(x)).to(x.dtype)


@register("GlobalMaxPool", since=22)  # bfloat16
@register("GlobalMaxPool", since=1)
def global_max_pool(ctx: OpContext, x):
    return x.amax(dim=tuple(range(2, x.ndim)), keepdim=True)


@register("MaxUnpool", since=22)  # bfloat16
@register("MaxUnpool", since=9)
def max_unpool(ctx: OpContext, x, indices, output_shape=None, *, kernel_shape, pads=None, strides=None):
    """Scatter `x` to the flat `indices` (as MaxPool returns them) of a zero tensor of the pooled-from
    shape, (in - 1) * stride - pads + kernel per axis; an `output_shape` input then zero-extends (or crops)
    it at the end of each spatial axis, as the ONNX reference does."""
    n = x.ndim - 2
    strides = strides or [1] * n
    pads = pads or [0] * (2 * n)
    shape = [
        *x.shape[:2],
        *((x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[i + n] + kernel_shape[i] for i in range(n)),
    ]
    y = x.new_zeros(math.prod(shape))
    y[indices.reshape(-1)] = x.reshape(-1)
    y = y.reshape(shape)
    if output_shape is None:
        return y
    target = output_shape.tolist()[-n:]
    widths = [w for i in reversed(range(n)) for w in (0, target[i] - shape[2 + i])]
    return F.pad(y, widths)
