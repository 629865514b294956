"""Squeeze-and-excitation (`tensorforge::SqueezeExcite`) in two launches, for NCHW and channels_last inputs.

    hidden[n] = act1(W1 · mean_hw(X[n]) + B1)      W1: [R, C]
    gate[n]   = act2(W2 · hidden[n] + B2)          W2: [C, R]
    Y[n, c]   = X[n, c] · gate[n, c]               over H×W

All in float32, Y rounded once. The first product is linear, so it is split along the channels and taken inside
the reduction:

1. `_squeeze`: a program sums channels `block` of image `n` over a range of pixels in float32 and multiplies its
   sums by W1's columns for those channels, writing a float32 partial of W1 · sum (R values) to
   `partial[k, n, :]`, k = split · channel blocks + block. Ranges split (as in `pool.global_avg_pool`) when the
   (image, channel block) programs alone would not fill the device, as at batch 1.
2. `_excite`: a program for (image, channel block, pixel range) adds the partials of its image in order (a few
   R-vectors; recomputing W1 · mean per program would read all of W1 and the pooled vector), divides by H·W,
   applies B1 and act1, takes its channels' rows of W2 and act2, and writes X · gate over its tile.

The gate is recomputed by every pixel range of a channel block; the ranges are few (`scale_split_count`) and a
gate costs a block of W2 (BLOCK_C × R) and the partials. Batch 1 is launch-bound (an engine replays its layers
in a CUDA graph), so two launches replace the four layers (pool, two 1×1 convolutions, broadcast product) of the
unfused block. The summation order is fixed (no atomics): results do not vary between runs.

Tiles are BLOCK_P pixels × BLOCK_C channels, addressed through X's and Y's strides: channels are contiguous on
channels_last (16-byte loads when the channel count and the pixel strides allow, `ALIGN` as in `depthwise.py`),
pixels on NCHW (H and W merge when their strides do). The activations are `epilogue.activate` codes.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .depthwise import _alignment, _scaled
from .epilogue import activate, activation_args
from .pool import _channel_sums, _memory_format, _pixel_offsets, global_split_count
from .tiles import wave_slots

Activation = tuple[int, float, float]  # (code, p0, p1) as `epilogue.activation_args` gives them
NO_ACTIVATION: Activation = activation_args("")
_FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT32_EXTENT = 2**31  # offsets inside one image are int32
_CONFIG_KEYS = ("block_p", "block_c", "block_r", "num_warps")
_BLOCK_K = 16  # partials added per step by `_excite`
_SCALE_WAVES = 4  # `_excite` programs per SM that `scale_split_count` aims for
_MIN_SCALE_BLOCKS = 2  # pixel blocks a pixel range of `_excite` covers at least


@triton.jit
def _squeeze(
    x, w1, partial,
    HW, W, C, R, pixels_per_split,
    sxn, sxc, sxh, sxw,
    ALIGN: tl.constexpr, FLAT: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """partial[k, n, :] = W1[:, channels] · Σ_pixels X[n, channels, pixels] for image n = `program_id(0)`, channel
    block `program_id(1)`, pixel range `program_id(2)`; k = range · channel blocks + block. W1 is [R, C] contiguous.
    C and X's N, H, W strides arrive divided by ALIGN (multiplied back here, so the compiler knows them aligned)."""
    C = C * ALIGN
    sxn, sxh, sxw = sxn * ALIGN, sxh * ALIGN, sxw * ALIGN
    image = tl.program_id(0)
    block = tl.program_id(1)
    split = tl.program_id(2)
    channels = block * BLOCK_C + tl.arange(0, BLOCK_C)
    channel_ok = channels < C
    x_channels = x + image.to(tl.int64) * sxn + channels * sxc
    first = split * pixels_per_split
    last = tl.minimum(first + pixels_per_split, HW)
    sums = _channel_sums(x_channels, channel_ok, first, last, W, sxh, sxw, FLAT, BLOCK_P, BLOCK_C)
    slab = partial + ((split * tl.num_programs(1) + block) * tl.num_programs(0) + image).to(tl.int64) * R
    for r0 in range(0, R, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        row_ok = rows < R
        mask = row_ok[:, None] & channel_ok[None, :]
        weights = tl.load(w1 + rows[:, None] * C + channels[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(slab + rows, tl.sum(weights * sums[None, :], axis=1), mask=row_ok)


@triton.jit
def _excite(
    x, w2, b1, b2, partial, y,
    HW, W, C, R, K, pixels_per_split,
    sxn, sxc, sxh, sxw,
    syn, syc, syh, syw,
    act1_p0, act1_p1, act2_p0, act2_p1,
    ACT1: tl.constexpr, ACT2: tl.constexpr, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr,
    ALIGN: tl.constexpr, FLAT: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Y[n, channels, pixels] = X · act2(W2[channels] · act1(Σ_k partial[k, n] / HW + B1) + B2[channels]) for
    image n = `program_id(0)`, channel block `program_id(1)`, pixel range `program_id(2)`; W2 is [C, R]
    contiguous. C and the N, H, W strides of X and Y arrive divided by ALIGN."""
    C = C * ALIGN
    sxn, sxh, sxw = sxn * ALIGN, sxh * ALIGN, sxw * ALIGN
    syn, syh, syw = syn * ALIGN, syh * ALIGN, syw * ALIGN
    image = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(2)
    channel_ok = channels < C
    partial_image = partial + image.to(tl.int64) * R
    k_stride = tl.num_programs(0).to(tl.int64) * R  # from partial[k, n] to partial[k + 1, n]
    gate = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):  # act1 is elementwise: each block of hidden units is finished on its own
        rows = r0 + tl.arange(0, BLOCK_R)
        row_ok = rows < R
        sums = tl.zeros([BLOCK_K, BLOCK_R], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            mask = (ks < K)[:, None] & row_ok[None, :]
            sums += tl.load(partial_image + ks[:, None] * k_stride + rows[None, :], mask=mask, other=0.0)
        hidden = tl.sum(sums, axis=0) / HW
        if HAS_B1:
            hidden += tl.load(b1 + rows, mask=row_ok, other=0.0).to(tl.float32)
        hidden = tl.where(row_ok, activate(hidden, ACT1, act1_p0, act1_p1), 0.0)
        mask = channel_ok[:, None] & row_ok[None, :]
        weights = tl.load(w2 + channels[:, None] * R + rows[None, :], mask=mask, other=0.0).to(tl.float32)
        gate += tl.sum(weights * hidden[None, :], axis=1)
    if HAS_B2:
        gate += tl.load(b2 + channels, mask=channel_ok, other=0.0).to(tl.float32)
    gate = activate(gate, ACT2, act2_p0, act2_p1)
    x_channels = x + image.to(tl.int64) * sxn + channels * sxc
    y_channels = y + image.to(tl.int64) * syn + channels * syc
    first = split * pixels_per_split
    last = tl.minimum(first + pixels_per_split, HW)
    for start in range(first, last, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        mask = (p < last)[:, None] & channel_ok[None, :]
        x_offsets = _pixel_offsets(p, W, sxh, sxw, FLAT)
        value = tl.load(x_channels[None, :] + x_offsets[:, None], mask=mask, other=0.0).to(tl.float32)
        y_offsets = _pixel_offsets(p, W, syh, syw, FLAT)
        tl.store(y_channels[None, :] + y_offsets[:, None], (value * gate[None, :]).to(y.dtype.element_ty), mask=mask)


# -- configurations --------------------------------------------------------------------------------------


def _config(block_p: int, block_c: int, block_r: int, num_warps: int) -> dict[str, int]:
    return {"block_p": block_p, "block_c": block_c, "block_r": block_r, "num_warps": num_warps}


# Effort 0: a channels-contiguous tile for channels_last (what the engine's convolutions write), a wide one for
# EfficientNet's 672-1152-channel blocks, and a pixels-contiguous one for NCHW. Later levels add taller, wider
# and narrower tiles and other hidden-unit blocks (MobileNetV3's SE blocks squeeze to R = 240 hidden units).
_EFFORT = [
    [_config(32, 64, 32, 4), _config(16, 128, 16, 4), _config(128, 16, 32, 4)],
    [_config(64, 32, 32, 4), _config(8, 256, 16, 8), _config(256, 8, 16, 4), _config(32, 128, 32, 8)],
    [_config(64, 64, 64, 8), _config(16, 64, 16, 2), _config(512, 4, 16, 4), _config(32, 32, 64, 4)],
]


def squeeze_excite_configs(effort: int) -> list[dict[str, int]]:
    """The tiles worth timing for `squeeze_excite` at `effort`: 3 at 0, 7 at 1, 11 at 2 (each level adds)."""
    return [dict(c) for c in itertools.chain.from_iterable(_EFFORT[: max(0, min(effort, 2)) + 1])]


def fit_tile(config: Mapping[str, Any] | None, channels: int, hidden: int) -> tuple[int, int, int, int]:
    """(BLOCK_P, BLOCK_C, BLOCK_R, num_warps) of `config` for a layer of `channels` channels and `hidden` hidden
    units: a channel block wider than the (power-of-two rounded) channel count shrinks to it and the pixel block
    grows by the same factor, so a program keeps its amount of work; a hidden-unit block shrinks likewise."""
    cfg = {**_config(32, 64, 32, 4), **(config or {})}
    unknown = sorted(set(cfg) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown squeeze_excite config keys {unknown}; known: {list(_CONFIG_KEYS)}")
    block_p, block_c, block_r, warps = (int(cfg[k]) for k in _CONFIG_KEYS)
    if any(v < 1 or v & (v - 1) for v in (block_p, block_c, block_r, warps)):
        raise ValueError(
            f"block_p, block_c, block_r and num_warps must be powers of two, got {block_p}, {block_c}, {block_r}, "
            f"{warps}"
        )
    fitted_c = min(block_c, triton.next_power_of_2(max(channels, 1)))
    fitted_r = min(block_r, triton.next_power_of_2(max(hidden, 1)))
    return block_p * (block_c // fitted_c), fitted_c, fitted_r, warps


def scale_split_count(programs: int, pixels: int, block_p: int, slots: int) -> int:
    """Pixel ranges per (image, channel block) of `_excite`: enough for about `_SCALE_WAVES` programs per SM of
    `slots`, each range at least `_MIN_SCALE_BLOCKS` pixel blocks long (every range recomputes its gate)."""
    longest = max(1, pixels // (block_p * _MIN_SCALE_BLOCKS))
    return max(1, min(triton.cdiv(_SCALE_WAVES * slots, programs), longest))


# -- host side --------------------------------------------------------------------------------------------


def _image_extent(t: torch.Tensor) -> int:
    """The largest element offset inside one image of `t` (the kernels keep those in int32)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape[1:], t.stride()[1:], strict=True))


def _matrix(name: str, w: torch.Tensor, rows: int, cols: int, x: torch.Tensor) -> torch.Tensor:
    """`w` ([rows, cols] or [rows, cols, 1, 1], a float tensor on x's device) as a contiguous [rows, cols] matrix
    (a view of a contiguous weight)."""
    if tuple(w.shape) not in ((rows, cols), (rows, cols, 1, 1)) or not w.is_floating_point() or w.device != x.device:
        raise ValueError(
            f"squeeze_excite: {name} must be a float [{rows}, {cols}] or [{rows}, {cols}, 1, 1] tensor on "
            f"{x.device}, got {w.dtype} {list(w.shape)} on {w.device}"
        )
    return w.reshape(rows, cols).contiguous()


def _check(x, w1, b1, w2, b2, out) -> tuple[torch.Tensor, torch.Tensor]:
    """W1 and W2 as the kernels' [R, C] and [C, R] matrices, after checking every operand (ValueError naming it)."""
    name = "squeeze_excite"
    if x.dim() != 4 or x.dtype not in _FLOAT_TYPES:
        raise ValueError(f"{name}: x must be a 4-D float16/bfloat16/float32 tensor, got {x.dtype} {list(x.shape)}")
    if w1.dim() not in (2, 4) or w2 is None or w2.dim() != w1.dim():
        shown = list(w2.shape) if w2 is not None else None
        raise ValueError(f"{name}: w1 and w2 must both be 2-D or both 4-D (1×1), got {list(w1.shape)} and {shown}")
    channels, hidden = x.shape[1], w1.shape[0]
    w1 = _matrix("w1", w1, hidden, channels, x)
    w2 = _matrix("w2", w2, channels, hidden, x)
    for bias_name, bias, size in (("b1", b1, hidden), ("b2", b2, channels)):
        if bias is not None and (tuple(bias.shape) != (size,) or bias.device != x.device):
            raise ValueError(
                f"{name}: {bias_name} must have shape [{size}] on {x.device}, got {list(bias.shape)} on {bias.device}"
            )
    if out is not None and (tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(
            f"{name}: out is {out.dtype} {list(out.shape)} on {out.device}, needs {x.dtype} {list(x.shape)}"
        )
    return w1, w2


def _split(splits: int | str, auto: int, name: str) -> int:
    if splits == "auto":
        return auto
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        raise ValueError(f"squeeze_excite: {name} must be a positive integer or 'auto', got {splits!r}")
    return splits


def squeeze_excite(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None = None,
    *,
    act1: Activation = NO_ACTIVATION,
    act2: Activation = NO_ACTIVATION,
    out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
    splits: int | str = "auto",
    scale_splits: int | str = "auto",
) -> torch.Tensor:
    """`x · act2(W2 · act1(W1 · mean_hw(x) + b1) + b2)`, the gate broadcast over H×W, into a tensor of x's shape
    and memory format, or `out` (any strides; `out` may be `x` itself).

    `x`: (N, C, H, W) float16/bfloat16/float32 in any strides; `w1`: (R, C) or (R, C, 1, 1); `w2`: (C, R) or
    (C, R, 1, 1); `b1`: (R,) or None; `b2`: (C,) or None; weights and biases in any float type. `act1` / `act2`:
    `activation_args` triples. Everything is computed in float32 and Y rounded once. `config`: a
    `squeeze_excite_configs` entry. `splits` / `scale_splits`: pixel ranges per (image, channel block) of the
    reduction and of the product, or "auto" (`pool.global_split_count`, `scale_split_count`).
    """
    w1, w2 = _check(x, w1, b1, w2, b2, out)
    y = out
    if y is None:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=_memory_format(x))
    n, c, h, w = x.shape
    hw = h * w
    if n * c * hw == 0:
        return y  # nothing to write (an empty map's mean would be NaN, as the reference has it, but gates nothing)
    for operand in (x, y):
        if _image_extent(operand) >= _INT32_EXTENT:
            raise ValueError(f"squeeze_excite: one image of a {list(operand.shape)} operand exceeds 2^31 elements")
    hidden = w1.shape[0]
    block_p, block_c, block_r, warps = fit_tile(config, c, hidden)
    channel_blocks = triton.cdiv(c, block_c)
    programs = n * channel_blocks
    slots = wave_slots(x.device)
    splits = _split(splits, global_split_count(programs, hw, block_p, slots), "splits")
    scale_splits = _split(scale_splits, scale_split_count(programs, hw, block_p, slots), "scale_splits")
    # Whole pixel blocks per range; the counts follow from the range lengths (no empty ranges).
    per_split = triton.cdiv(triton.cdiv(hw, splits), block_p) * block_p
    splits = triton.cdiv(hw, per_split)
    per_scale_split = triton.cdiv(triton.cdiv(hw, scale_splits), block_p) * block_p
    scale_splits = triton.cdiv(hw, per_scale_split)
    pixel_strides = [t.stride(i) for t in (x, y) for i in (0, 2, 3)]
    align = _alignment(c, *pixel_strides)
    flat = h == 1 or (x.stride(2) == w * x.stride(3) and y.stride(2) == w * y.stride(3))
    partials = splits * channel_blocks
    partial = torch.empty((partials, n, hidden), dtype=torch.float32, device=x.device)
    sx, sy = _scaled(x.stride(), align), _scaled(y.stride(), align)
    _squeeze[(n, channel_blocks, splits)](
        x, w1, partial, hw, w, c // align, hidden, per_split, *sx,
        ALIGN=align, FLAT=flat, BLOCK_P=block_p, BLOCK_C=block_c, BLOCK_R=block_r, num_warps=warps,
    )  # fmt: skip
    _excite[(n, channel_blocks, scale_splits)](
        x, w2, b1 if b1 is not None else w2, b2 if b2 is not None else w2, partial, y,
        hw, w, c // align, hidden, partials, per_scale_split, *sx, *sy,
        act1[1], act1[2], act2[1], act2[2],
        ACT1=act1[0], ACT2=act2[0], HAS_B1=b1 is not None, HAS_B2=b2 is not None, ALIGN=align, FLAT=flat,
        BLOCK_P=block_p, BLOCK_C=block_c, BLOCK_R=block_r, BLOCK_K=_BLOCK_K, num_warps=warps,
    )  # fmt: skip
    return y
