"""Direct 2-D convolution for layers with few input channels (a network's stem: 3 channels of an image).

The implicit GEMM (`conv.py`) gathers its A operand one [BLOCK_M, BLOCK_K] tile at a time; with 3 channels a
tap a row of that tile is 3 scattered elements, every element of the tile gathered by its own address, and the
tensor cores wait on the loads. Here the K = KH·KW·Cin products of each output pixel are unrolled instead (K is
small): for every (kh, kw, c) one load of a [BLOCK_M] vector of input pixels, adjacent output pixels reading
adjacent (or every SW-th) elements of one row of X, and one multiply-add of it by a [BLOCK_N] row of the
weight into the float32 accumulator, on the CUDA cores:

    acc[m, n] += X[image, c, oh·SH − PH + kh·DH, ow·SW − PW + kw·DW] · W[n, c, kh, kw]

X is read through its own strides and converted as it is loaded, so a float32 NCHW network input feeds an fp16
channels_last layer without a cast or layout pass before it. The FusedConv epilogue of `conv.py` follows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from .conv import (
    _FLOAT_TYPES,
    NO_ACTIVATION,
    Activation,
    _check_geometry,
    _check_out,
    _epilogue,
    broadcast_residual,
    window_padded,
)

MAX_TAPS_X_CHANNELS = 64  # the unrolled K; beyond it the implicit GEMM's tensor cores win


@triton.jit
def _conv2d_direct(
    x, w, bias, res, y,
    M, H, W, OH, OW, KG,
    SH, SW, PH, PW, DH, DW,
    sxn, sxc, sxh, sxw,
    srn, src, srh, srw,
    syn, syc, syh, syw,
    pre0, pre1, post0, post1,
    CG: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, PADDED: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Output pixels [program_id(0)·BLOCK_M, +BLOCK_M) × channels [program_id(1)·BLOCK_N, +BLOCK_N)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    safe_rows = rows % M  # rows past M repeat real pixels, so loads need no row mask (stores are masked)
    ow = safe_rows % OW
    pixel = safe_rows // OW
    oh = pixel % OH
    image = pixel // OH
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    x_rows = x + (image.to(tl.int64) * sxn + ih0 * sxh + iw0 * sxw)
    col_ok = cols < KG
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kh in tl.static_range(KH):
        for kw in tl.static_range(KW):
            if PADDED:
                ih = ih0 + kh * DH
                iw = iw0 + kw * DW
                inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            for c in tl.static_range(CG):
                a_ptrs = x_rows + (kh * DH * sxh + kw * DW * sxw + c * sxc)
                if PADDED:
                    a = tl.load(a_ptrs, mask=inside, other=0.0)
                else:
                    a = tl.load(a_ptrs)
                b = tl.load(w + ((kh * KW + kw) * CG + c) * KG + cols, mask=col_ok, other=0.0)
                acc += a.to(tl.float32)[:, None] * b.to(tl.float32)[None, :]
    _epilogue(
        acc, rows, cols, 0, M, OH, OW, KG, bias, res, srn, src, srh, srw, y, syn, syc, syh, syw,
        pre0, pre1, post0, post1, y, 1.0, 1.0, 1.0, HAS_BIAS, HAS_RES, PRE, POST, 0, 0,
    )  # fmt: skip


def direct_configs(effort: int) -> list[dict[str, Any]]:
    """Tile shapes worth timing at `effort`: pixels per program × output channels per program, warps."""
    configs = [
        {"block_m": 128, "block_n": 32, "num_warps": 4},
        {"block_m": 256, "block_n": 16, "num_warps": 4},
    ]
    if effort >= 1:
        configs += [{"block_m": 256, "block_n": 32, "num_warps": 8}, {"block_m": 64, "block_n": 64, "num_warps": 4}]
    if effort >= 2:
        configs += [{"block_m": 512, "block_n": 16, "num_warps": 8}, {"block_m": 128, "block_n": 64, "num_warps": 8}]
    return configs


def conv2d_direct(
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
    """`post(pre(conv2d(x, W) + bias) + residual)` into (N, Cout, *out_hw), channels_last in the weight's type, or
    into `out` (any strides, the weight's type).

    `x`: (N, Cin, H, W) of any float type and strides (converted as loaded); `weight`: `conv.pack_weight(W, 1)`
    (one group) with KH·KW·Cin at most `MAX_TAPS_X_CHANNELS`; `bias`, `residual`, `pre`, `post` as in
    `conv.conv2d_nhwc`. `config`: a `direct_configs` entry.
    """
    name = "conv2d_direct"
    if x.dim() != 4 or x.dtype not in _FLOAT_TYPES:
        raise ValueError(f"{name}: x must be a 4-D float16/bfloat16/float32 tensor, got {x.dtype} {list(x.shape)}")
    if weight.dim() != 5 or weight.dtype not in _FLOAT_TYPES or weight.device != x.device or weight.shape[0] != 1:
        raise ValueError(
            f"{name}: the weight must be pack_weight(W, 1) of a float weight on x's device (5-D, one group), "
            f"got {weight.dtype} {list(weight.shape)} on {weight.device}"
        )
    _, kh, kw, cg, kg = weight.shape
    if kh * kw * cg > MAX_TAPS_X_CHANNELS or not weight.is_contiguous():
        raise ValueError(
            f"{name}: at most {MAX_TAPS_X_CHANNELS} taps × input channels in a contiguous packed weight, got "
            f"{kh}×{kw}×{cg} with strides {list(weight.stride())}"
        )
    out_shape = _check_geometry(name, x, weight, bias, residual, out_hw)
    _check_out(name, out, out_shape, weight.dtype, x.device)
    y = out
    if y is None:
        y = torch.empty(out_shape, dtype=weight.dtype, device=x.device, memory_format=torch.channels_last)
    n, _, oh, ow = out_shape
    m = n * oh * ow
    if m == 0 or kg == 0:
        return y
    residual = broadcast_residual(name, residual, out_shape)
    cfg = {"block_m": 128, "block_n": 32, "num_warps": 4, **(config or {})}
    padded = window_padded(x.shape[2:], (oh, ow), strides, pads_begin, dilations, (kh, kw))
    block_n = min(cfg["block_n"], max(16, triton.next_power_of_2(kg)))
    grid = (triton.cdiv(m, cfg["block_m"]), triton.cdiv(kg, block_n))
    _conv2d_direct[grid](
        x, weight, bias if bias is not None else y, residual if residual is not None else y, y,
        m, x.shape[2], x.shape[3], oh, ow, kg,
        strides[0], strides[1], pads_begin[0], pads_begin[1], dilations[0], dilations[1],
        *x.stride(), *(residual.stride() if residual is not None else (0, 0, 0, 0)), *y.stride(),
        *pre[1:], *post[1:],
        CG=cg, KH=kh, KW=kw, PADDED=padded, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        PRE=pre[0], POST=post[0], BLOCK_M=cfg["block_m"], BLOCK_N=block_n, num_warps=cfg["num_warps"],
    )  # fmt: skip
    return y
