"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv and CausalConvWithState.

Float convolutions run on torch.nn.functional with asymmetric or automatic pads turned into explicit
zero padding; the integer ones accumulate exactly (see `_integer_conv`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .pool import compute_dtype, window_geometry
from .registry import OpContext, register

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _kernel_fn(table: dict[int, Callable], rank: int) -> Callable:
    try:
        return table[rank]
    except KeyError:
        raise NotImplementedError(f"torch has no {rank}-d convolution (1-d to 3-d only)") from None


def _pad_widths(begin: Sequence[int], end: Sequence[int]) -> list[int]:
    """`F.pad` widths (last axis first) for per-axis `begin`/`end` pads of the spatial axes."""
    return [w for i in reversed(range(len(begin))) for w in (begin[i], end[i])]


def _per_channel(t: torch.Tensor, trailing: int) -> torch.Tensor:
    """A scalar or 1-D per-channel `t` with `trailing` unit axes, to broadcast along the axis that far
    from the end (the channels of `(N, C, *spatial)` for trailing = rank)."""
    return t.reshape(-1, *[1] * trailing)


# -- Conv -----------------------------------------------------------------------------------------------


def convolution(x, w, b, auto_pad, dilations, group, pads, strides, *, algorithm: str = "auto") -> torch.Tensor:
    """ONNX Conv. `algorithm` "auto" picks im2col + GEMM for dense 2-D float convolutions on the CPU (see
    `_use_gemm`) and torch's own convolution otherwise; "direct" always uses torch's (oneDNN, cuDNN)."""
    rank = x.ndim - 2
    strides = list(strides or [1] * rank)
    dilations = list(dilations or [1] * rank)
    begin, end, _ = window_geometry(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    if algorithm == "auto" and _use_gemm(x, rank, group):
        return _conv2d_gemm(F.pad(x, _pad_widths(begin, end)) if any(begin + end) else x, w, b, strides, dilations)
    padding = begin
    if begin != end:
        x = F.pad(x, _pad_widths(begin, end))
        padding = [0] * rank
    return _kernel_fn(_CONV, rank)(x, w, b, strides, padding, dilations, group)


# im2col + GEMM: columns of at most this many elements at a time (64 MiB of float32).
_GEMM_COLUMN_BUDGET = 1 << 24


def _use_gemm(x: torch.Tensor, rank: int, group: int) -> bool:
    """Dense 2-D float convolutions on the CPU run as im2col + GEMM.

    oneDNN's direct fp32 convolution accumulates less accurately than a GEMM over the same products: on
    PP-OCRv6 recognition it put the output 1.0e-4 (relative, max norm) from a float64 evaluation against
    ONNX Runtime's 4.4e-5; im2col + GEMM, which is also how ONNX Runtime's CPU convolution works, gives
    1.8e-5. CUDA keeps cuDNN (with TF32 off), whose fp32 accumulation is accurate.
    """
    return x.device.type == "cpu" and rank == 2 and group == 1 and x.dtype in (torch.float32, torch.float64)


def _conv2d_gemm(x, w, b, strides, dilations) -> torch.Tensor:
    """Unpadded 2-D cross-correlation as W[co, ci·kh·kw] @ im2col(x), over chunks of output rows."""
    n, _, height, width = x.shape
    co, _, kh, kw = w.shape
    spans = [(k - 1) * d + 1 for k, d in zip((kh, kw), dilations, strict=True)]
    out_h = (height - spans[0]) // strides[0] + 1
    out_w = (width - spans[1]) // strides[1] + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"the kernel span {spans} exceeds the padded input {[height, width]}")
    weight = w.reshape(co, -1)
    if (kh, kw) == (1, 1) and strides == [1, 1]:
        y = torch.matmul(weight, x.reshape(n, -1, height * width)).reshape(n, co, out_h, out_w)
    else:
        rows = max(1, _GEMM_COLUMN_BUDGET // max(1, n * weight.shape[1] * out_w))
        chunks = []
        for top in range(0, out_h, rows):
            count = min(rows, out_h - top)
            start = top * strides[0]
            band = x[:, :, start : start + (count - 1) * strides[0] + spans[0]]
            cols = F.unfold(band, (kh, kw), dilation=dilations, stride=strides)
            chunks.append(torch.matmul(weight, cols).reshape(n, co, count, out_w))
        y = torch.cat(chunks, dim=2) if len(chunks) > 1 else chunks[0]
    return y if b is None else y + b.reshape(-1, 1, 1)


@register("Conv", since=22)  # bfloat16
@register("Conv", since=1)
def conv(
    ctx: OpContext,
    x,
    w,
    b=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """N-d cross-correlation; the kernel shape is taken from `w`."""
    return convolution(x, w, b, auto_pad, dilations, group, pads, strides)


# -- ConvTranspose --------------------------------------------------------------------------------------


def _transpose_geometry(
    in_shape, kernel, strides, dilations, output_padding, output_shape, pads, auto_pad
) -> tuple[list[int], list[int]]:
    """Per axis, where the output starts in the full transposed convolution and how long it is.

    The full result has stride * (in - 1) + span + output_padding elements (the output_padding ones
    zero). Explicit pads trim it; `output_shape` sets the length, trimming full - output in total; SAME_*
    aims at in * stride but never trims less than nothing (as onnxruntime does). The larger half of a trim
    comes off the start unless SAME_UPPER (opset 1 states the opposite in one formula and this rule in
    its auto_pad text; onnxruntime follows this rule at every opset). An output longer than the full
    result is zero-extended at the end.
    """
    rank = len(in_shape)
    pads = pads or [0] * (2 * rank)
    begin, out = [], []
    for i in range(rank):
        span = (kernel[i] - 1) * dilations[i] + 1
        full = strides[i] * (in_shape[i] - 1) + span + output_padding[i]
        if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = full - output_shape[i] if output_shape else max(0, full - in_shape[i] * strides[i])
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            begin.append(max(0, head))
            out.append(full - total)
        elif auto_pad == "VALID":
            begin.append(0)
            out.append(full)
        else:
            begin.append(pads[i])
            out.append(full - pads[i] - pads[i + rank])
    return begin, out


def _conv_transpose(x, w, b, auto_pad, dilations, group, output_padding, output_shape, pads, strides) -> torch.Tensor:
    rank = x.ndim - 2
    strides = list(strides or [1] * rank)
    dilations = list(dilations or [1] * rank)
    output_padding = list(output_padding or [0] * rank)
    # output_shape may list the batch and channel axes too
    output_shape = list(output_shape)[-rank:] if output_shape else None
    full = _kernel_fn(_CONV_TRANSPOSE, rank)(x, w, None, strides, 0, 0, group, dilations)
    begin, out = _transpose_geometry(
        x.shape[2:], w.shape[2:], strides, dilations, output_padding, output_shape, pads, auto_pad
    )
    end = [o - (f - s) for o, f, s in zip(out, full.shape[2:], begin, strict=True)]
    y = F.pad(full, _pad_widths([-s for s in begin], end))
    return y if b is None else y + _per_channel(b, rank)


@register("ConvTranspose", since=22)  # bfloat16
@register("ConvTranspose", since=1)
def conv_transpose(
    ctx: OpContext,
    x,
    w,
    b=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
):
    """The transposed (fractionally strided) convolution; the kernel shape is taken from `w`."""
    return _conv_transpose(x, w, b, auto_pad, dilations, group, output_padding, output_shape, pads, strides)


# -- integer convolutions -------------------------------------------------------------------------------


def _integer_conv(x, x_zero_point, w, w_zero_point, auto_pad, dilations, group, pads, strides):
    """sum((x - x_zero_point) * (w - w_zero_point)) over each window, exactly, as integer-valued float64.

    Every product is below 2^16 in magnitude, so every partial sum is an exact float64 integer until
    2^37 terms; the padding is zero after the zero-point shift, as ONNX pads with the zero point.
    `round` undoes any rounding of a transform-based convolution algorithm.
    """
    xf = x.to(torch.float64)
    if x_zero_point is not None:
        xf = xf - x_zero_point.to(torch.float64)
    wf = w.to(torch.float64)
    if w_zero_point is not None:
        wf = wf - _per_channel(w_zero_point.to(torch.float64), w.ndim - 1)
    return convolution(xf, wf, None, auto_pad, dilations, group, pads, strides).round()


@register("ConvInteger", since=10)
def conv_integer(
    ctx: OpContext,
    x,
    w,
    x_zero_point=None,
    w_zero_point=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """int32 result; a sum past the int32 range wraps as int32 accumulation would."""
    acc = _integer_conv(x, x_zero_point, w, w_zero_point, auto_pad, dilations, group, pads, strides)
    return acc.to(torch.int64).to(torch.int32)


@register("QLinearConv", since=10)
def qlinear_conv(
    ctx: OpContext,
    x,
    x_scale,
    x_zero_point,
    w,
    w_scale,
    w_zero_point,
    y_scale,
    y_zero_point=None,
    b=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """y = saturate(round_half_even((acc + B) * x_scale * w_scale / y_scale) + y_zero_point), with the
    exact integer accumulation `acc` and w_scale / w_zero_point per tensor or per output channel."""
    rank = x.ndim - 2
    acc = _integer_conv(x, x_zero_point, w, w_zero_point, auto_pad, dilations, group, pads, strides)
    if b is not None:
        acc = acc + _per_channel(b.to(torch.float64), rank)
    multiplier = (x_scale * w_scale / y_scale).to(torch.float64)
    y = torch.round(acc * _per_channel(multiplier, rank))
    dtype = x.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        y = y + y_zero_point.to(torch.float64)
    info = torch.iinfo(dtype)
    return y.clamp(info.min, info.max).to(dtype)


# -- DeformConv -----------------------------------------------------------------------------------------


def _deform_conv(x, w, offset, b, mask, dilations, group, offset_group, pads, strides) -> torch.Tensor:
    """Sample the input at every kernel cell's position plus its offset, by multilinear interpolation
    (zero outside the input), scale by the mask, then contract with the grouped weights."""
    rank = x.ndim - 2
    batch, channels, in_shape = x.shape[0], x.shape[1], list(x.shape[2:])
    kernel, out_shape = list(w.shape[2:]), list(offset.shape[2:])
    cells, places = math.prod(kernel), math.prod(out_shape)
    strides = list(strides or [1] * rank)
    dilations = list(dilations or [1] * rank)
    pads = list(pads or [0] * (2 * rank))
    dtype = compute_dtype(x)
    device = x.device

    def grid(sizes: Sequence[int]) -> torch.Tensor:
        axes = [torch.arange(s, device=device, dtype=dtype) for s in sizes]
        return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, rank)

    steps = torch.tensor(strides, device=device, dtype=dtype)
    spacing = torch.tensor(dilations, device=device, dtype=dtype)
    start = torch.tensor(pads[:rank], device=device, dtype=dtype)
    # base[k, d, p]: axis-d coordinate of kernel cell k at output place p
    base = (grid(kernel) * spacing)[:, :, None] + (grid(out_shape) * steps - start).T[None]
    offset = offset.to(dtype).reshape(batch, offset_group, cells, rank, places)
    position = base + offset  # (N, G, K, rank, P)
    low = position.floor()
    frac = position - low
    low = low.to(torch.int64)

    x_groups = x.to(dtype).reshape(batch, offset_group, channels // offset_group, -1)
    sampled = x_groups.new_zeros((*x_groups.shape[:3], cells * places))
    for corner in itertools.product((0, 1), repeat=rank):
        weight = torch.ones_like(frac[:, :, :, 0])
        flat = torch.zeros_like(low[:, :, :, 0])
        for d, up in enumerate(corner):
            index = low[:, :, :, d] + up
            inside = (index >= 0) & (index < in_shape[d])
            weight = weight * (frac[:, :, :, d] if up else 1 - frac[:, :, :, d]) * inside
            flat = flat * in_shape[d] + index.clamp(0, in_shape[d] - 1)
        flat = flat.reshape(batch, offset_group, 1, -1).expand(-1, -1, x_groups.shape[2], -1)
        sampled += x_groups.gather(-1, flat) * weight.reshape(batch, offset_group, 1, -1)
    if mask is not None:
        sampled = sampled * mask.to(dtype).reshape(batch, offset_group, 1, -1)
    columns = sampled.reshape(batch, group, (channels // group) * cells, places)
    weights = w.to(dtype).reshape(group, w.shape[0] // group, -1)
    y = torch.einsum("gmk,ngkp->ngmp", weights, columns).reshape(batch, w.shape[0], *out_shape)
    if b is not None:
        y = y + _per_channel(b.to(dtype), rank)
    return y.to(x.dtype)


@register("DeformConv", since=22)  # bfloat16
@register("DeformConv", since=19)
def deform_conv(
    ctx: OpContext,
    x,
    w,
    offset,
    b=None,
    mask=None,
    *,
    dilations=None,
    group=1,
    kernel_shape=None,
    offset_group=1,
    pads=None,
    strides=None,
):
    """N-d deformable convolution; the output spatial shape is the offset's."""
    return _deform_conv(x, w, offset, b, mask, dilations, group, offset_group, pads, strides)


# -- CausalConvWithState --------------------------------------------------------------------------------


@register("CausalConvWithState", since=27)
def causal_conv_with_state(ctx: OpContext, x, weight, bias=None, past_state=None, *, activation="none"):
    """Depthwise causal conv1d over `past_state` (zeros when absent) followed by `x`; present_state is
    the last k - 1 positions of that sequence. SiLU ("silu" or "swish") runs in float32, as the function
    body of the op does."""
    if activation not in ("none", "silu", "swish"):
        raise ValueError(f"unknown activation {activation!r}")
    k = weight.shape[-1]
    if past_state is None:
        past_state = x.new_zeros((*x.shape[:2], k - 1))
    sequence = torch.cat([past_state, x], dim=-1)
    y = F.conv1d(sequence, weight, bias, groups=x.shape[1])
    if activation != "none":
        y = F.silu(y.float()).to(x.dtype)
    return y, sequence[..., sequence.shape[-1] - (k - 1) :]
