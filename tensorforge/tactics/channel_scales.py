"""A QuantizedConv's per-channel input scales (`Xs`, depthwise layers) as its kernels use them, worked out once
per `Xs` tensor rather than on every call: the scales that quantize X (`x_scale · Xs`), their inverses (for
kernels that multiply), and the dequantization factors with Xs folded in (`ops.fused.dequantize_scales`)."""

from __future__ import annotations

import torch

from ..ops.fused import dequantize_scales, input_scale


class ChannelScales:
    __slots__ = ("_entries", "x_scale")

    def __init__(self, x_scale: float) -> None:
        self.x_scale = x_scale
        self._entries: dict[int, tuple[torch.Tensor, ...]] = {}  # id(Xs) -> (Xs kept alive, scale, inverse, folded)

    def __call__(self, w_scale: torch.Tensor, x_channels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(scale, inverse, folded): float32 [C], [C] and [Cout], contiguous, on Xs's device."""
        entry = self._entries.get(id(x_channels))
        if entry is None:
            scale = input_scale(self.x_scale, x_channels).float().contiguous()
            folded = dequantize_scales(w_scale, self.x_scale, x_channels).contiguous()
            entry = self._entries[id(x_channels)] = (x_channels, scale, (1.0 / scale).contiguous(), folded)
        return entry[1:]
