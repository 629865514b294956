"""Depthwise 2-D convolution over channels_last activations, with FusedConv's epilogue inside.

Depthwise means one input channel per group: groups == Cin and Cout == M·Cin (the channel multiplier M, 1 in
MobileNet / EfficientNet / ConvNeXt). Output channel c reads input channel c // M only:

    Y[n, c, oh, ow] = post(pre(Σ_{kh,kw} X[n, c // M, oh·SH − PH + kh·DH, ow·SW − PW + kw·DW] · W[kh, kw, c]
                                + B[c]) + Z[n, c, oh, ow])

with X read as 0 outside the input (the padding) and W packed once as (KH, KW, Cout) (`pack_depthwise_weight`).
There is no reduction over channels, so a tensor-core product does not apply: a program computes a tile of
BLOCK_P output pixels × BLOCK_C channels with fp32 multiply-adds, channels innermost, so every tap is one
coalesced [BLOCK_P, BLOCK_C] load of contiguous channel runs and the tap's BLOCK_C weights are loaded once per
program. Pixel pointers are formed once (the image offset in int64); a tap only adds a scalar int32 offset.
The epilogue runs on the fp32 accumulator and stores through Y's strides (a caller's buffer works).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from .conv import broadcast_residual, window_padded
from .epilogue import activate, activation_args

Activation = tuple[int, float, float]  # (code, p0, p1) as `epilogue.activation_args` gives them
NO_ACTIVATION: Activation = activation_args("")
_FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT32_EXTENT = 2**31  # offsets inside one image are int32
_CONFIG_KEYS = ("block_p", "block_c", "num_warps")


@triton.jit
def _depthwise_conv2d(
    x, w, bias, res, y,
    P, H, W, C, OH, OW,
    SH, SW, PH, PW, DH, DW,
    sxn, sxc, sxh, sxw,
    srn, src, srh, srw,
    syn, syc, syh, syw,
    pre0, pre1, post0, post1,
    KH: tl.constexpr, KW: tl.constexpr, MULT: tl.constexpr, ALIGN: tl.constexpr,
    PADDED: tl.constexpr, EVEN_C: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_P, BLOCK_C] tile: output pixels `program_id(0)` (flattened n, oh, ow), channels `program_id(1)`.

    C (output channels) and the N, H, W strides arrive divided by ALIGN: multiplied back here, their divisibility
    is known to the compiler, which then vectorizes loads along channels (Triton itself only specializes 16).
    """
    C = C * ALIGN
    sxn, sxh, sxw = sxn * ALIGN, sxh * ALIGN, sxw * ALIGN
    srn, srh, srw = srn * ALIGN, srh * ALIGN, srw * ALIGN
    syn, syh, syw = syn * ALIGN, syh * ALIGN, syw * ALIGN
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
    if MULT == 1:
        x_channels = channels * sxc
    else:
        x_channels = (channels // MULT) * sxc
    x_tile = x + (image * sxn + ih0 * sxh + iw0 * sxw)[:, None] + x_channels[None, :]  # tap (0, 0) of the window
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for kh in tl.static_range(KH):
        ih = ih0 + kh * DH
        row_ok = pixel_ok
        if PADDED:
            row_ok = row_ok & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            ok = row_ok
            if PADDED:
                iw = iw0 + kw * DW
                ok = ok & (iw >= 0) & (iw < W)
            mask = ok[:, None] if EVEN_C else ok[:, None] & channel_ok[None, :]
            tap_offset = kh * DH * sxh + kw * DW * sxw
            value = tl.load(x_tile + tap_offset, mask=mask, other=0.0)
            if EVEN_C:
                tap = tl.load(w + (kh * KW + kw) * C + channels)
            else:
                tap = tl.load(w + (kh * KW + kw) * C + channels, mask=channel_ok, other=0.0)
            acc += value.to(tl.float32) * tap.to(tl.float32)[None, :]

    out_mask = pixel_ok[:, None] & channel_ok[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + channels, mask=channel_ok, other=0.0).to(tl.float32)[None, :]
    acc = activate(acc, PRE, pre0, pre1)
    if HAS_RES:
        res_pixels = image * srn + oh * srh + ow * srw
        acc += tl.load(res + res_pixels[:, None] + (channels * src)[None, :], mask=out_mask, other=0.0).to(tl.float32)
    acc = activate(acc, POST, post0, post1)
    out_pixels = image * syn + oh * syh + ow * syw
    tl.store(y + out_pixels[:, None] + (channels * syc)[None, :], acc.to(y.dtype.element_ty), mask=out_mask)


# -- configurations --------------------------------------------------------------------------------------


def _config(block_p: int, block_c: int, num_warps: int) -> dict[str, int]:
    return {"block_p": block_p, "block_c": block_c, "num_warps": num_warps}


# Effort 0: a square-ish tile for wide layers, 32 channels for 96/480/672-channel layers (no wasted lanes),
# 128 channels for the widest ones, and a small tile that still fills the device on 7×7 maps at batch 1.
_EFFORT_0 = [_config(64, 64, 4), _config(128, 32, 4), _config(32, 128, 4), _config(16, 64, 2)]
_EFFORT_1 = [
    _config(128, 64, 8),
    _config(64, 32, 2),
    _config(256, 16, 4),  # 16-, 40-, 72-, 120-channel layers
    _config(32, 64, 2),
    _config(64, 128, 8),
    _config(16, 128, 4),
]
_EFFORT_2 = [
    _config(256, 32, 8),
    _config(128, 128, 8),
    _config(512, 8, 4),
    _config(256, 64, 8),
    _config(8, 128, 2),
    _config(32, 32, 1),
    _config(64, 16, 2),
]


def depthwise_configs(effort: int) -> list[dict[str, int]]:
    """The tile configurations worth timing at `effort`: 4 at 0, 10 at 1, 17 at 2 (each level adds to the last)."""
    levels = [_EFFORT_0, _EFFORT_1, _EFFORT_2]
    return [dict(c) for c in itertools.chain.from_iterable(levels[: max(0, min(effort, 2)) + 1])]


def _tile(config: Mapping[str, Any] | None, channels: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_C, num_warps) of `config`; a channel block wider than the layer's (power-of-two) channel
    count shrinks to it and the pixel block grows by the same factor, so a program keeps its amount of work."""
    cfg = {**_config(64, 64, 4), **(config or {})}
    unknown = sorted(set(cfg) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown depthwise config keys {unknown}; known: {list(_CONFIG_KEYS)}")
    block_p, block_c, warps = (int(cfg[k]) for k in _CONFIG_KEYS)
    if any(v < 1 or v & (v - 1) for v in (block_p, block_c, warps)):
        raise ValueError(f"block_p, block_c and num_warps must be powers of two, got {block_p}, {block_c}, {warps}")
    fitted = min(block_c, triton.next_power_of_2(max(channels, 1)))
    return block_p * (block_c // fitted), fitted, warps


# -- host side --------------------------------------------------------------------------------------------


def pack_depthwise_weight(w: torch.Tensor) -> torch.Tensor:
    """W (Cout, 1, KH, KW) as the kernel's contiguous (KH, KW, Cout) taps: a tap's channels are one contiguous
    run. Done once per weight."""
    if w.dim() != 4 or w.shape[1] != 1:
        raise ValueError(
            f"pack_depthwise_weight: a depthwise weight is (Cout, 1, KH, KW) (one input channel per group), "
            f"got {list(w.shape)}"
        )
    return w[:, 0].permute(1, 2, 0).contiguous()


def _alignment(*values: int) -> int:
    """The largest of 16, 8, 4, 2, 1 that divides every value."""
    return next(a for a in (16, 8, 4, 2, 1) if all(v % a == 0 for v in values))


def _scaled(strides: Sequence[int], align: int) -> tuple[int, ...]:
    """(N, C, H, W) strides with the N, H and W ones divided by `align` (the kernel multiplies them back)."""
    n, c, h, w = strides
    return n // align, c, h // align, w // align


def _check(x, weight, bias, residual, out_hw, out) -> tuple[int, int, int, int]:
    """The output shape, after checking every operand against it (ValueError naming the operand)."""
    name = "depthwise_conv2d"
    if x.dim() != 4 or x.dtype not in _FLOAT_TYPES:
        raise ValueError(f"{name}: x must be a 4-D float16/bfloat16/float32 tensor, got {x.dtype} {list(x.shape)}")
    if weight.dim() != 3 or weight.dtype != x.dtype or weight.device != x.device or not weight.is_contiguous():
        raise ValueError(
            f"{name}: the weight must come from pack_depthwise_weight (contiguous (KH, KW, Cout), x's dtype and "
            f"device), got {weight.dtype} {list(weight.shape)} on {weight.device}"
        )
    cin, cout = x.shape[1], weight.shape[2]
    if cin == 0 or cout % cin:
        raise ValueError(f"{name}: {cout} output channels are not a multiple of the {cin} input channels")
    if len(out_hw) != 2 or min(out_hw) < 0:
        raise ValueError(f"{name}: out_hw must be two sizes >= 0, got {list(out_hw)}")
    out_shape = (x.shape[0], cout, int(out_hw[0]), int(out_hw[1]))
    if bias is not None and (tuple(bias.shape) != (cout,) or bias.device != x.device):
        raise ValueError(
            f"{name}: bias must have shape [{cout}] on {x.device}, got {list(bias.shape)} on {bias.device}"
        )
    if residual is not None and residual.device != x.device:
        raise ValueError(f"{name}: the residual is on {residual.device}, x on {x.device}")
    if out is not None and (tuple(out.shape) != out_shape or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(
            f"{name}: out is {out.dtype} {list(out.shape)} on {out.device}, needs {x.dtype} {list(out_shape)}"
        )
    return out_shape


def _image_extent(t: torch.Tensor) -> int:
    """The largest element offset inside one image of `t` (the kernel keeps those in int32)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape[1:], t.stride()[1:], strict=True))


def depthwise_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    out_hw: Sequence[int],
    strides: Sequence[int] = (1, 1),
    pads_begin: Sequence[int] = (0, 0),
    dilations: Sequence[int] = (1, 1),
    pre: Activation = NO_ACTIVATION,
    post: Activation = NO_ACTIVATION,
    out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """`post(pre(depthwise_conv2d(x, W) + bias) + residual)` into (N, Cout, *out_hw), channels_last, or `out`.

    `x`: (N, Cin, H, W) in any strides (channels_last reads contiguously); `weight`: `pack_depthwise_weight(W)`
    in x's dtype, Cout a multiple of Cin; `bias`: (Cout,); `residual`: broadcastable to the output, read through
    its own strides. The input is zero-padded by `pads_begin` before and as far as `out_hw` needs after (ONNX pads
    and auto_pad resolve to these through `ops.pool.window_geometry`). `pre` / `post`: `activation_args` triples.
    Products accumulate in float32 and are rounded once. `config`: a `depthwise_configs` entry.
    """
    out_shape = _check(x, weight, bias, residual, out_hw, out)
    n, cout, oh, ow = out_shape
    kh, kw, _ = weight.shape
    y = out
    if y is None:
        y = torch.empty(out_shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    pixels = n * oh * ow
    if pixels == 0 or cout == 0:
        return y
    residual = broadcast_residual("depthwise_conv2d", residual, out_shape)
    for operand in (x, y) if residual is None else (x, y, residual):
        if _image_extent(operand) >= _INT32_EXTENT:
            raise ValueError(f"depthwise_conv2d: one image of a {list(operand.shape)} operand exceeds 2^31 elements")
    block_p, block_c, warps = _tile(config, cout)
    res = residual if residual is not None else y
    res_strides = residual.stride() if residual is not None else (0, 0, 0, 0)
    pixel_strides = [t[i] for t in (x.stride(), res_strides, y.stride()) for i in (0, 2, 3)]
    align = _alignment(cout, *pixel_strides)
    padded = window_padded(x.shape[2:], (oh, ow), strides, pads_begin, dilations, (kh, kw))
    grid = (triton.cdiv(pixels, block_p), triton.cdiv(cout, block_c))
    _depthwise_conv2d[grid](
        x, weight, bias if bias is not None else y, res, y,
        pixels, x.shape[2], x.shape[3], cout // align, oh, ow,
        strides[0], strides[1], pads_begin[0], pads_begin[1], dilations[0], dilations[1],
        *_scaled(x.stride(), align), *_scaled(res_strides, align), *_scaled(y.stride(), align),
        pre[1], pre[2], post[1], post[2],
        KH=kh, KW=kw, MULT=cout // x.shape[1], ALIGN=align, PADDED=padded, EVEN_C=cout % block_c == 0,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, PRE=pre[0], POST=post[0],
        BLOCK_P=block_p, BLOCK_C=block_c, num_warps=warps,
    )  # fmt: skip
    return y
