"""Max pooling over 2-D windows, one program per output pixel and block of channels.

Channels are the innermost loop of a program, so on a channels_last (NHWC) tensor every load is contiguous;
any strides work. Cells outside the input never win (they read as -inf), as ONNX MaxPool requires; the output
size comes from the caller (ONNX's ceil mode and auto-padding rules live in `ops.pool.window_geometry`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _max_pool2d(
    x, y,
    H, W, C, OH, OW,
    sxn, sxc, sxh, sxw,
    syn, syc, syh, syw,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    pixel = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_channels = channels < C
    ow = pixel % OW
    oh = (pixel // OW) % OH
    n = pixel // (OW * OH)
    best = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * SH - PH + kh * DH
        for kw in tl.static_range(KW):
            iw = ow * SW - PW + kw * DW
            inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            limit = tl.where(inside, C, 0)  # a cell outside the input masks every channel
            offsets = n.to(tl.int64) * sxn + ih * sxh + iw * sxw + channels * sxc
            value = tl.load(x + offsets, mask=channels < limit, other=float("-inf"))
            best = tl.maximum(best, value.to(tl.float32))
    out = n.to(tl.int64) * syn + oh * syh + ow * syw + channels * syc
    tl.store(y + out, best.to(y.dtype.element_ty), mask=in_channels)


def max_pool2d(
    x: torch.Tensor,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads_begin: Sequence[int],
    dilations: Sequence[int],
    out_shape: Sequence[int],
    block_c: int = 64,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x` (N, C, H, W) max-pooled into (N, C, *out_shape), in `x`'s memory format or into `out`."""
    n, c, h, w = x.shape
    oh, ow = out_shape
    y = (
        out
        if out is not None
        else torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device, memory_format=_memory_format(x))
    )
    if tuple(y.shape) != (n, c, oh, ow) or y.dtype != x.dtype or y.device != x.device:
        raise ValueError(
            f"max_pool2d: out is {y.dtype} {list(y.shape)} on {y.device}, needs {x.dtype} {[n, c, oh, ow]}"
        )
    if y.numel() == 0:
        return y
    grid = (n * oh * ow, triton.cdiv(c, block_c))
    _max_pool2d[grid](
        x, y, h, w, c, oh, ow, *x.stride(), *y.stride(),
        kernel[0], kernel[1], strides[0], strides[1], pads_begin[0], pads_begin[1], dilations[0], dilations[1],
        BLOCK_C=block_c,
    )  # fmt: skip
    return y


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format
