"""2-D max and average pooling, and global average pooling, over channels-innermost tiles.

Window pools (`max_pool2d`, `avg_pool2d`): a program computes a tile of BLOCK_P output pixels × BLOCK_C
channels, channels innermost, so on a channels_last (NHWC) tensor every window cell is one coalesced load of
contiguous channel runs; any strides work. The output size and the begin pads come from the caller (ONNX's
ceil mode and auto-padding rules live in `ops.pool.window_geometry`).

- MaxPool: cells outside the input never win (they read as -inf, or an integer type's lowest value); NaN
  propagates, as the reference's amax does. A maximum is exact in any precision: it is taken in the input's type
  (an fp8 input's in float16, which holds its values exactly).
- AveragePool: the window's float32 sum over the count of its cells inside the input, or with
  count_include_pad inside the explicitly padded input, rows [-pads_begin, H + pads_end) (cells a ceil-mode
  window hangs past the end padding never count), rounded once. The count of a window is the product of its
  row and column counts.

`global_avg_pool`: mean over H×W per (image, channel) in float32, for NHWC or NCHW inputs. A program reduces
a block of channels over a range of pixels; when N·C/BLOCK_C programs would not fill the device (batch 1),
the pixels are split into ranges whose float32 partial sums a second kernel adds in order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .tiles import wave_slots

_MIN_BLOCKS_PER_SPLIT = 2  # pixel blocks a split of the global pool reduces at least
_MAX_SPLITS = 64
_FINISH_BLOCK_C = 128


@triton.jit
def _pool2d(
    x, y,
    P, H, W, C, OH, OW,
    sxn, sxc, sxh, sxw,
    syn, syc, syh, syw,
    SH, SW, PH, PW, DH, DW,
    COUNT_H0, COUNT_H1, COUNT_W0, COUNT_W1,
    KH: tl.constexpr, KW: tl.constexpr, AVERAGE: tl.constexpr, FILL: tl.constexpr, WIDEN: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_P, BLOCK_C] tile: output pixels `program_id(0)` (flattened n, oh, ow), channels `program_id(1)`.
    AVERAGE: the window sum over the count of its cells in rows [COUNT_H0, COUNT_H1) × [COUNT_W0, COUNT_W1);
    else the maximum. FILL: what a cell outside the input reads (0 or -inf). WIDEN: the maximum of an fp8 input
    taken in float16, which holds its values exactly (the type has no maximum instruction, nor an infinity)."""
    pixels = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pixel_ok = pixels < P
    channel_ok = channels < C
    ow = pixels % OW
    rest = pixels // OW
    oh = rest % OH
    image = (rest // OH).to(tl.int64)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    x_tile = x + (image * sxn + ih0 * sxh + iw0 * sxw)[:, None] + (channels * sxc)[None, :]  # window cell (0, 0)
    acc = tl.full([BLOCK_P, BLOCK_C], FILL, tl.float32 if AVERAGE else tl.float16 if WIDEN else x.dtype.element_ty)
    for kh in tl.static_range(KH):
        ih = ih0 + kh * DH
        row_ok = pixel_ok & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            iw = iw0 + kw * DW
            ok = row_ok & (iw >= 0) & (iw < W)
            mask = ok[:, None] & channel_ok[None, :]
            cell = x_tile + (kh * DH * sxh + kw * DW * sxw)
            if WIDEN:
                value = tl.where(mask, tl.load(cell, mask=mask, other=0.0).to(tl.float16), FILL)
            else:
                value = tl.load(cell, mask=mask, other=FILL)
            if AVERAGE:
                acc += value.to(tl.float32)
            else:  # in the input's own type (fp8's in float16): exact, and no conversion instruction per cell
                acc = tl.maximum(acc, value, propagate_nan=tl.PropagateNan.ALL)
    if AVERAGE:
        rows = tl.zeros([BLOCK_P], dtype=tl.float32)
        for kh in tl.static_range(KH):
            ih = ih0 + kh * DH
            rows += ((ih >= COUNT_H0) & (ih < COUNT_H1)).to(tl.float32)
        cols = tl.zeros([BLOCK_P], dtype=tl.float32)
        for kw in tl.static_range(KW):
            iw = iw0 + kw * DW
            cols += ((iw >= COUNT_W0) & (iw < COUNT_W1)).to(tl.float32)
        acc = acc / (rows * cols)[:, None]
    out = image * syn + oh * syh + ow * syw
    mask = pixel_ok[:, None] & channel_ok[None, :]
    tl.store(y + out[:, None] + (channels * syc)[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _pixel_offsets(p, W, sh, sw, FLAT: tl.constexpr):
    """Element offsets of flattened pixels `p`: p · sw when H and W merge (FLAT), else (p // W) · sh + (p % W) · sw."""
    if FLAT:
        offsets = p * sw
    else:
        h = p // W
        offsets = h * sh + (p - h * W) * sw
    return offsets


@triton.jit
def _channel_sums(
    x_channels, channel_ok, first, last, W, sxh, sxw,
    FLAT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Σ over pixels [first, last) of the channels at pointers `x_channels` (one image), in float32: [BLOCK_C],
    0 for the channels not `channel_ok`."""
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for start in range(first, last, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        offsets = _pixel_offsets(p, W, sxh, sxw, FLAT)
        mask = (p < last)[:, None] & channel_ok[None, :]
        acc += tl.load(x_channels[None, :] + offsets[:, None], mask=mask, other=0.0).to(tl.float32)
    return tl.sum(acc, axis=0)


@triton.jit
def _global_sum(
    x, y, partial,
    HW, W, C, pixels_per_split,
    sxn, sxc, sxh, sxw, syn, syc,
    FLAT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Channels `program_id(1)` of image `program_id(0)` summed over pixel range `program_id(2)`: the mean into Y,
    or (SPLIT) the float32 partial sum into `partial[split, image, channel]`. FLAT: pixel p sits at p · sxw
    (H and W merge), else at (p // W) · sxh + (p % W) · sxw."""
    image = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(2)
    channel_ok = channels < C
    x_channels = x + image.to(tl.int64) * sxn + channels * sxc
    first = split * pixels_per_split
    last = tl.minimum(first + pixels_per_split, HW)
    total = _channel_sums(x_channels, channel_ok, first, last, W, sxh, sxw, FLAT, BLOCK_P, BLOCK_C)
    if SPLIT:
        slab = (split * tl.num_programs(0) + image).to(tl.int64) * C
        tl.store(partial + slab + channels, total, mask=channel_ok)
    else:
        out = y + image.to(tl.int64) * syn + channels * syc
        tl.store(out, (total / HW).to(y.dtype.element_ty), mask=channel_ok)


@triton.jit
def _global_mean_of_partials(partial, y, splits, N, C, HW, syn, syc, BLOCK_C: tl.constexpr):
    """Y[image, channels] = (Σ over splits, in order, of the partial sums) / HW, rounded once."""
    image = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    channel_ok = channels < C
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for s in range(splits):
        slab = (s * N + image).to(tl.int64) * C
        acc += tl.load(partial + slab + channels, mask=channel_ok, other=0.0)
    out = y + image.to(tl.int64) * syn + channels * syc
    tl.store(out, (acc / HW).to(y.dtype.element_ty), mask=channel_ok)


# -- configurations --------------------------------------------------------------------------------------


def _config(block_p: int, block_c: int, num_warps: int) -> dict[str, int]:
    return {"block_p": block_p, "block_c": block_c, "num_warps": num_warps}


# Window pools: effort 0 is a tile for 64-channel stems (ResNet's 3×3/2 max pool) and one for wide layers.
_WINDOW_EFFORT = [
    [_config(32, 64, 4), _config(16, 128, 4)],
    [_config(64, 64, 4), _config(128, 32, 4), _config(8, 128, 2)],
    [_config(128, 64, 8), _config(64, 128, 8), _config(256, 16, 4), _config(32, 32, 2)],
]
# Global pools: wide channel blocks on NHWC; long pixel blocks with few channels suit NCHW (pixels contiguous).
_GLOBAL_EFFORT = [
    [_config(32, 64, 4), _config(128, 16, 4)],
    [_config(16, 128, 4), _config(64, 32, 4), _config(512, 4, 4)],
    [_config(8, 256, 4), _config(64, 64, 8), _config(256, 8, 4), _config(32, 128, 8)],
]


def _levels(table: list[list[dict[str, int]]], effort: int) -> list[dict[str, int]]:
    return [dict(c) for c in itertools.chain.from_iterable(table[: max(0, min(effort, 2)) + 1])]


def pool_configs(effort: int) -> list[dict[str, int]]:
    """Tiles worth timing for `max_pool2d` / `avg_pool2d` at `effort`: 2 at 0, 5 at 1, 9 at 2 (each adds)."""
    return _levels(_WINDOW_EFFORT, effort)


def global_pool_configs(effort: int) -> list[dict[str, int]]:
    """Tiles worth timing for `global_avg_pool` at `effort`: 2 at 0, 5 at 1, 9 at 2 (each adds)."""
    return _levels(_GLOBAL_EFFORT, effort)


# -- host side --------------------------------------------------------------------------------------------


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


def _check_tile(name: str, block_p: int, block_c: int, num_warps: int) -> None:
    if any(v < 1 or v & (v - 1) for v in (block_p, block_c, num_warps)):
        raise ValueError(
            f"{name}: block_p, block_c and num_warps must be powers of two, got {block_p}, {block_c}, {num_warps}"
        )


def _output(
    name: str, x: torch.Tensor, shape: Sequence[int], out: torch.Tensor | None, quantized: bool = False
) -> torch.Tensor:
    """`out` after checking it against `shape` and x's dtype and device, or a new tensor in x's memory format
    (`quantized`: an int8 or fp8 x is allowed too)."""
    if x.dim() != 4 or not (quantized if x.dtype == torch.int8 or _fp8(x) else x.is_floating_point()):
        kinds = "float, int8 or fp8" if quantized else "float"
        raise ValueError(f"{name}: x must be a 4-D {kinds} tensor (N, C, H, W), got {x.dtype} {list(x.shape)}")
    shape = tuple(int(s) for s in shape)
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=_memory_format(x))
    if tuple(out.shape) != shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"{name}: out is {out.dtype} {list(out.shape)} on {out.device}, needs {x.dtype} {list(shape)}")
    return out


def _fp8(x: torch.Tensor) -> bool:
    return x.is_floating_point() and x.element_size() == 1


def _fill(dtype: torch.dtype, average: bool) -> float | int:
    """What a window cell outside the input reads: 0 for a sum, the type's lowest value for a maximum (-inf for
    floats; an integer type has no infinity, and -inf would convert to an undefined integer), as a Python int for
    an integer type (the maximum is taken in that type)."""
    if average:
        return 0.0
    return float("-inf") if dtype.is_floating_point else int(torch.iinfo(dtype).min)


def _window_pool(
    name, x, kernel, strides, pads_begin, dilations, out_shape, counted, out, block_p, block_c, num_warps
) -> torch.Tensor:
    """Launch `_pool2d`: the maximum when `counted` is None, else the average over cells in `counted`
    ((row_begin, row_end), (col_begin, col_end))."""
    _check_tile(name, block_p, block_c, num_warps)
    n, c, h, w = x.shape
    oh, ow = out_shape
    average = counted is not None
    y = _output(name, x, (n, c, oh, ow), out, quantized=not average)
    pixels = n * oh * ow
    if pixels == 0 or c == 0:
        return y
    (h0, h1), (w0, w1) = counted if average else ((0, h), (0, w))
    grid = (triton.cdiv(pixels, block_p), triton.cdiv(c, block_c))
    _pool2d[grid](
        x, y, pixels, h, w, c, oh, ow, *x.stride(), *y.stride(),
        strides[0], strides[1], pads_begin[0], pads_begin[1], dilations[0], dilations[1], h0, h1, w0, w1,
        KH=kernel[0], KW=kernel[1], AVERAGE=average, FILL=_fill(x.dtype, average),
        WIDEN=_fp8(x),
        BLOCK_P=block_p, BLOCK_C=block_c, num_warps=num_warps,
    )  # fmt: skip
    return y


def max_pool2d(
    x: torch.Tensor,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads_begin: Sequence[int],
    dilations: Sequence[int],
    out_shape: Sequence[int],
    block_c: int = 64,
    out: torch.Tensor | None = None,
    *,
    block_p: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """`x` (N, C, H, W; float, or a quantized int8 or fp8 activation: exact, the maximum of its values) max-pooled
    into (N, C, *out_shape), in `x`'s memory format or into `out`."""
    return _window_pool(
        "max_pool2d", x, kernel, strides, pads_begin, dilations, out_shape, None, out, block_p, block_c, num_warps
    )


def avg_pool2d(
    x: torch.Tensor,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    dilations: Sequence[int],
    out_shape: Sequence[int],
    count_include_pad: bool = False,
    out: torch.Tensor | None = None,
    *,
    block_p: int = 32,
    block_c: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`x` (N, C, H, W) average-pooled (ONNX AveragePool) into (N, C, *out_shape), in x's memory format or `out`.

    Each window's float32 sum is divided by the count of its cells inside the input or, with
    `count_include_pad`, inside the input padded by `pads_begin` / `pads_end`."""
    h, w = x.shape[2:] if x.dim() == 4 else (0, 0)
    if count_include_pad:
        counted = ((-pads_begin[0], h + pads_end[0]), (-pads_begin[1], w + pads_end[1]))
    else:
        counted = ((0, h), (0, w))
    return _window_pool(
        "avg_pool2d", x, kernel, strides, pads_begin, dilations, out_shape, counted, out, block_p, block_c, num_warps
    )


def global_split_count(programs: int, pixels: int, block_p: int, slots: int) -> int:
    """How many pixel ranges bring `programs` (image, channel block) programs up to about one wave of `slots`,
    each range at least `_MIN_BLOCKS_PER_SPLIT` pixel blocks long; 1 when they already fill half a wave."""
    if 2 * programs >= slots:
        return 1
    longest = max(1, pixels // (block_p * _MIN_BLOCKS_PER_SPLIT))
    return max(1, min(triton.cdiv(slots, programs), longest, _MAX_SPLITS))


def global_avg_pool(
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_p: int = 32,
    block_c: int = 64,
    num_warps: int = 4,
    splits: int | str = "auto",
) -> torch.Tensor:
    """ONNX GlobalAveragePool of `x` (N, C, H, W, any strides): the float32 mean over H×W, rounded once, into
    (N, C, 1, 1) or `out`. `splits`: pixel ranges per (image, channel block), or "auto" (`global_split_count`)."""
    name = "global_avg_pool"
    _check_tile(name, block_p, block_c, num_warps)
    y = _output(name, x, (*x.shape[:2], 1, 1), out)
    n, c, h, w = x.shape
    hw = h * w
    if n * c == 0:
        return y
    if hw == 0:
        return y.fill_(float("nan"))  # the mean of no elements, as torch's mean gives it
    programs = n * triton.cdiv(c, block_c)
    if splits == "auto":
        splits = global_split_count(programs, hw, block_p, wave_slots(x.device))
    if not isinstance(splits, int) or splits < 1:
        raise ValueError(f"{name}: splits must be a positive integer or 'auto', got {splits!r}")
    per_split = triton.cdiv(triton.cdiv(hw, splits), block_p) * block_p
    splits = triton.cdiv(hw, per_split)
    sxn, sxc, sxh, sxw = x.stride()
    flat = h == 1 or sxh == w * sxw
    partial = torch.empty((splits, n, c), dtype=torch.float32, device=x.device) if splits > 1 else y
    _global_sum[(n, triton.cdiv(c, block_c), splits)](
        x, y, partial, hw, w, c, per_split, sxn, sxc, sxh, sxw, y.stride(0), y.stride(1),
        FLAT=flat, SPLIT=splits > 1, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=num_warps,
    )  # fmt: skip
    if splits > 1:
        _global_mean_of_partials[(n, triton.cdiv(c, _FINISH_BLOCK_C))](
            partial, y, splits, n, c, hw, y.stride(0), y.stride(1), BLOCK_C=_FINISH_BLOCK_C, num_warps=4
        )
    return y
