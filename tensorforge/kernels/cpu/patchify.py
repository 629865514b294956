"""A convolution whose windows tile its input (kernel = stride, no padding, no dilation: a vision transformer's patch
embedding) as one matrix product, float32, with the whole FusedConv epilogue inside:

    rows[p, :] = the patch of output pixel p, flattened        (the windows do not overlap: a permutation, no copies)
    y[p, k]    = post(pre(b[k] + Σ_j rows[p, j] · w[k, j]) + z[p, k])

The patches are copied once into [pixels, C·KH·KW] rows (channels innermost for a channels_last input, so each copy
moves runs of KW·C contiguous values; window columns innermost for an NCHW one, runs of KW), then the 1×1 kernel
(`kernels.cpu.pointwise`) runs the product over those rows, each a pixel with C·KH·KW channels, its weight packed
once for each order.

Why: ViT-S/16's 16×16 patch embedding (3 → 384 channels, 768 terms a sum) is a 196 × 768 × 384 product at batch 1;
oneDNN's convolution ran it at 1.37-1.41 ms on a 2-core AVX2 CPU, this at 1.15-1.19 (the copy 0.11 of it), and our
direct kernel (`cpu.stem-conv`: few input channels, a sum per tap) at 2.3. Where the channels are many (ConvNeXt's
2×2 downsampling layers) our direct kernel (`cpu.conv`) was faster still: the tactics compete by time.
"""

from __future__ import annotations

import torch

from . import pointwise as pw
from .avx512 import check_activations


class PatchConv:
    """A patch convolution ready to run: its weight [K, C, KH, KW] and bias packed for the input order the first call
    of each layout needs, its epilogue (`pw.ACTIVATIONS` by name, with `kernels.activations.activation_args`'s
    parameters) and tile checked once, here."""

    __slots__ = ("_bias", "_convs", "_epilogue", "_tile", "_weight", "channels", "in_channels", "kernel")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] | None = None,
    ) -> None:
        if weight.dtype != torch.float32 or weight.dim() != 4:
            raise ValueError(f"the patch convolution takes a 4-D float32 weight, not {weight.dtype} {weight.dim()}-D")
        self.channels, self.in_channels = weight.shape[:2]
        self.kernel = tuple(weight.shape[2:])
        self._weight, self._bias = weight, bias
        self._epilogue = (pre, pre_params, post, post_params)
        self._tile = tile
        check_activations("patch convolution", pre, post)
        if tile is not None and tuple(tile) not in pw.TILES:
            raise ValueError(f"the CPU 1×1 convolution kernel tiles {pw.TILES} (pixels, vectors), not {tuple(tile)}")
        self._convs: dict[bool, pw.PointwiseConv] = {}  # by channels-innermost order

    def _conv(self, channels_inner: bool) -> pw.PointwiseConv:
        if channels_inner not in self._convs:
            w = self._weight.permute(0, 2, 3, 1) if channels_inner else self._weight  # as the rows hold the patch
            pre, pre_params, post, post_params = self._epilogue
            rows = w.reshape(self.channels, -1, 1, 1)
            self._convs[channels_inner] = pw.PointwiseConv(rows, self._bias, pre, pre_params, post, post_params,
                                                           self._tile)  # fmt: skip
        return self._convs[channels_inner]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """post(pre(conv(x) + bias) + residual) for x [N, C, H, W] (any layout, any float type; trailing rows and
        columns that fill no window are left out, as an unpadded convolution does) and the residual [N, K, OH, OW] or
        None: a new channels_last float32 tensor."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"x must be [N, {self.in_channels}, H, W], not {tuple(x.shape)}")
        n, c, h, w = x.shape
        kh, kw = self.kernel
        oh, ow = h // kh, w // kw
        if oh == 0 or ow == 0:
            raise ValueError(f"x's {h} × {w} pixels hold no {kh} × {kw} window")
        windows = x[:, :, : oh * kh, : ow * kw].reshape(n, c, oh, kh, ow, kw)
        channels_inner = x.stride(1) == 1 and c > 1
        order = (0, 2, 4, 3, 5, 1) if channels_inner else (0, 2, 4, 1, 3, 5)
        rows = torch.empty((n, oh, ow, c * kh * kw), dtype=torch.float32)
        rows.view(n, oh, ow, *(windows.shape[i] for i in order[3:])).copy_(windows.permute(order))
        return self._conv(channels_inner)(rows.permute(0, 3, 1, 2), residual)
