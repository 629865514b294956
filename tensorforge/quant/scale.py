"""Symmetric int8 scales: `s = amax / 127`, never below `MIN_SCALE` (an all-zero tensor or channel gets a
tiny positive scale, so `x / s` stays finite and zero stays exactly zero; raising a too-small scale to the
floor only shrinks `|x / s|`, so it never adds saturation)."""

from __future__ import annotations

import torch

QMAX = 127
MIN_SCALE = 1e-12


def symmetric_scale(amax: float) -> float:
    return max(float(amax) / QMAX, MIN_SCALE)


def symmetric_scales(amax: torch.Tensor, qmax: float = QMAX) -> torch.Tensor:
    """Per-element `amax / qmax` (`symmetric_scale` for int8's 127), never below `MIN_SCALE`, as float32."""
    return (amax.double() / qmax).clamp(min=MIN_SCALE).float()
