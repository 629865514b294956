"""Nearest-neighbour upsampling by integer factors, any strides in and out (a channels_last tensor, or a channel
slice of a concatenation's storage): `y[n, c, oh, ow] = x[n, c, oh // SH, ow // SW]`, one load and one store of
each output element over tiles of pixels × channels (coalesced along channels on NHWC)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _upsample_nearest(
    x, y, P, OH, OW, C,
    sxn, sxc, sxh, sxw,
    syn, syc, syh, syw,
    SH: tl.constexpr, SW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    pixels = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ow = pixels % OW
    rest = pixels // OW
    oh = rest % OH
    image = (rest // OH).to(tl.int64)
    mask = (pixels < P)[:, None] & (channels < C)[None, :]
    source = image * sxn + (oh // SH) * sxh + (ow // SW) * sxw
    values = tl.load(x + source[:, None] + (channels * sxc)[None, :], mask=mask)
    target = image * syn + oh * syh + ow * syw
    tl.store(y + target[:, None] + (channels * syc)[None, :], values, mask=mask)


def upsample_configs(effort: int) -> list[dict[str, int]]:
    """Tiles worth timing at `effort` (pixels × channels per program, warps)."""
    configs = [{"block_p": 64, "block_c": 64, "num_warps": 4}, {"block_p": 128, "block_c": 32, "num_warps": 4}]
    if effort >= 1:
        configs += [{"block_p": 32, "block_c": 128, "num_warps": 4}, {"block_p": 256, "block_c": 16, "num_warps": 4}]
    return configs


def upsample_nearest(
    x: torch.Tensor,
    factors: Sequence[int],
    out: torch.Tensor | None = None,
    *,
    block_p: int = 64,
    block_c: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`x` (N, C, H, W) upsampled by the integer `factors` (SH, SW) into (N, C, SH·H, SW·W): channels_last in x's
    type, or into `out` (any strides, x's type)."""
    name = "upsample_nearest"
    if x.dim() != 4 or not x.is_floating_point():
        raise ValueError(f"{name}: x must be a 4-D float tensor (N, C, H, W), got {x.dtype} {list(x.shape)}")
    if len(factors) != 2 or any(not isinstance(f, int) or f < 1 for f in factors):
        raise ValueError(f"{name}: factors must be two integers >= 1, got {list(factors)}")
    n, c, h, w = x.shape
    shape = (n, c, h * factors[0], w * factors[1])
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    elif tuple(out.shape) != shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"{name}: out is {out.dtype} {list(out.shape)} on {out.device}, needs {x.dtype} {list(shape)}")
    pixels = n * shape[2] * shape[3]
    if pixels == 0 or c == 0:
        return out
    grid = (triton.cdiv(pixels, block_p), triton.cdiv(c, block_c))
    _upsample_nearest[grid](
        x, out, pixels, shape[2], shape[3], c, *x.stride(), *out.stride(),
        SH=factors[0], SW=factors[1], BLOCK_P=block_p, BLOCK_C=block_c, num_warps=num_warps,
    )  # fmt: skip
    return out
