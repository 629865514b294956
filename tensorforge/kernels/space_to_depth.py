"""A stride-2 convolution as a stride-1 one over the input's 2×2 blocks ("space to depth").

With `t = kh − P` (P the padding before), the input row a stride-2 convolution reads for output row `oh` and tap
`kh` is `2·oh + t = 2·(oh + q) + p` with `q = ⌊t / 2⌋` and `p = t − 2q` (0 or 1). So, over the blocked input

    X'[n, (p·2 + p')·G + c, i, j] = X[n, c, 2i + p, 2j + p']        (H and W even; G ≥ C, slots c ≥ C zero)

the same layer is a stride-1 convolution with the weight

    W'[o, (p·2 + p')·G + c, q − q₀, q' − q₀'] = W[o, c, 2q + p + P, 2q' + p' + P']    (zero outside the window)

over ⌊(K − 1 − P) / 2⌋ − q₀ + 1 taps a side, where q₀ = ⌊−P / 2⌋, padded by −q₀ before. A 7×7 stem on 3 channels
(P = 3) becomes a 4×4 convolution on 16 (12 and 4 zeros); a 3×3 one (P = 1) a 2×2 one: its K products run on
tensor cores in whole taps of contiguous channels instead of 49 taps of 3 channels gathered one by one. G is a
power of two, at least `align` / 4, so that a pixel is 16 bytes or more (which TMA moves) and the blocking pass
moves whole (c, p) rows of the input.

One row of taps is contiguous too: in a channels_last blocked input padded with its zero columns, the KW' taps
(i, j..j + KW' − 1) of output pixel (i, j) are KW'·C' consecutive elements. So `column_taps` views it as an input
of KW'·C' channels whose pixels overlap (pixel stride C'), and the layer becomes a KH' × 1 convolution over that
view (`column_tap_weight`): ResNet's stem takes K in 4 steps of 64 channels instead of 16 taps of 16.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .quantize import quantize_activation
from .triton.copy import space_to_depth


def blocked_channels(channels: int, align: int = 8) -> int:
    """The blocked input's channel count, 4G: G the smallest power of two ≥ `channels` and ≥ `align` / 4."""
    return 4 * max(align // 4, 1 << (channels - 1).bit_length())


def blocked_pads(pads_begin: Sequence[int]) -> list[int]:
    """The blocked (stride-1) convolution's padding before, −q₀ = −⌊−P / 2⌋ per side."""
    return [(p + 1) // 2 for p in pads_begin]


def blocked_taps(kernel: Sequence[int], pads_begin: Sequence[int]) -> list[int]:
    """The blocked convolution's taps a side, ⌊(K − 1 − P) / 2⌋ − q₀ + 1."""
    return [(k - 1 - p) // 2 + q + 1 for k, p, q in zip(kernel, pads_begin, blocked_pads(pads_begin), strict=True)]


def blocked_weight(weight: torch.Tensor, pads_begin: Sequence[int], align: int = 8) -> torch.Tensor:
    """W [Cout, C, KH, KW] of a stride-2 convolution padded by `pads_begin` → W' of the stride-1 convolution over
    the blocked input (padded by `blocked_pads`), in `weight`'s type."""
    cout, channels, kh, kw = weight.shape
    q0 = [-p for p in blocked_pads(pads_begin)]  # ⌊−P / 2⌋
    taps = blocked_taps((kh, kw), pads_begin)
    out = weight.new_zeros(cout, blocked_channels(channels, align), *taps)
    for p in (0, 1):
        for p2 in (0, 1):
            first = (p * 2 + p2) * out.shape[1] // 4
            for i in range(taps[0]):
                row = 2 * (i + q0[0]) + p + pads_begin[0]
                if not 0 <= row < kh:
                    continue
                for j in range(taps[1]):
                    col = 2 * (j + q0[1]) + p2 + pads_begin[1]
                    if 0 <= col < kw:
                        out[:, first : first + channels, i, j] = weight[:, :, row, col]
    return out


def blocked_input(
    x: torch.Tensor,
    dtype: torch.dtype,
    align: int = 8,
    columns: tuple[int, int] = (0, 0),
    scale: float | None = None,
    through: torch.dtype | None = None,
) -> torch.Tensor:
    """X [N, C, H, W] (any memory format and float type; H and W even) → X' [N, 4G, H/2, W/2 + before + after]
    channels_last in `dtype` (int8 or E4M3: quantized by `scale` as a kernel quantizes on load, after a rounding
    to `through` when given: the 16-bit input a layer's fp16 / bf16 variant quantizes), between `columns` =
    (before, after) zero columns, the slots c ≥ C zero: on CUDA one pass of `triton.copy.space_to_depth`,
    elsewhere torch's strided copy into a zeroed tensor."""
    n, channels, h, w = x.shape
    if h % 2 or w % 2:
        raise ValueError(f"space to depth needs an even height and width, not {h}×{w}")
    group = blocked_channels(channels, align) // 4
    before, after = columns
    shape = (n, 4 * group, h // 2, w // 2 + before + after)
    out = torch.empty(shape, dtype=dtype, device=x.device, memory_format=torch.channels_last)
    if x.is_cuda:
        return space_to_depth(x, out, columns, scale, through)
    if dtype in (torch.int8, torch.float8_e4m3fn):
        x = x if through is None else x.to(through)
        x = quantize_activation(x, scale, "int8" if dtype == torch.int8 else "fp8e4m3")
    blocks = x.unflatten(2, (h // 2, 2)).unflatten(4, (w // 2, 2)).permute(0, 3, 5, 1, 2, 4)  # n, p, p', c, i, j
    out.zero_()
    out[:, :, :, before : before + w // 2].unflatten(1, (2, 2, group))[:, :, :, :channels].copy_(blocks)
    return out


def column_taps(blocked: torch.Tensor, taps: int, out_w: int) -> torch.Tensor:
    """A channels_last blocked input [N, C', H', W'] (W' ≥ out_w + taps − 1) as the overlapping view [N, taps·C',
    H', out_w] whose pixel (i, j) holds the blocked pixels (i, j), ..., (i, j + taps − 1), channel t·C' + c."""
    n, channels, h, w = blocked.shape
    if blocked.stride(1) != 1 or (w > 1 and blocked.stride(3) != channels) or w < out_w + taps - 1:
        raise ValueError(
            f"column_taps: {list(blocked.shape)} is not a dense channels_last map of {out_w} + {taps - 1} columns"
        )
    return blocked.as_strided((n, taps * channels, h, out_w), (blocked.stride(0), 1, blocked.stride(2), channels))


def column_tap_weight(weight: torch.Tensor) -> torch.Tensor:
    """W' [Cout, C', KH', KW'] → the KH' × 1 weight over `column_taps`' view: [Cout, KW'·C', KH', 1]."""
    cout, channels, kh, kw = weight.shape
    return weight.permute(0, 3, 1, 2).reshape(cout, kw * channels, kh, 1)
