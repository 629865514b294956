"""A histogram of |x| that accumulates over calibration batches, exactly.

The histogram has `bins` equal bins over `[0, limit)`, where `limit` is the smallest power of two strictly
above the largest |x| seen so far. When a later batch exceeds the limit, the limit doubles (k times) and
every 2^k neighbouring bins merge into one: with power-of-two limits, `floor(|x| · bins / limit)` is exact
in floating point and `floor(floor(u) / 2^k) = floor(u / 2^k)`, so the merged histogram equals the one a
single pass over all batches would have built, whatever the batch order or split. The largest |x| is also
kept exactly (`amax`), since a bin only bounds it, and so is the number of exact zeros (`zeros`, e.g. after
a ReLU), which quantize without error. Zeros always fall into bin 0, so a histogram that has seen only zeros
needs no limit yet.
"""

from __future__ import annotations

import math

import numpy as np
import torch

DEFAULT_BINS = 2048


class Histogram:
    """Counts of |x| in `bins` bins over `[0, limit)`; `limit` is None until a nonzero value arrives."""

    __slots__ = ("amax", "bins", "counts", "limit", "zeros")

    def __init__(self, bins: int = DEFAULT_BINS) -> None:
        if bins < 2 or bins & (bins - 1):
            raise ValueError(f"the bin count must be a power of two >= 2, got {bins}")
        self.bins = bins
        self.counts = np.zeros(bins, dtype=np.int64)
        self.limit: float | None = None
        self.amax = 0.0
        self.zeros = 0

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def bin_width(self) -> float:
        return 0.0 if self.limit is None else self.limit / self.bins

    def edges(self) -> np.ndarray:
        """The `bins + 1` bin edges, from 0 to `limit`."""
        return np.arange(self.bins + 1, dtype=np.float64) * self.bin_width

    def add(self, x: torch.Tensor) -> None:
        """Count the magnitudes of `x` (any float tensor, on any device)."""
        if x.numel() == 0:
            return
        magnitude = x.detach().abs().float().flatten()
        batch_amax = float(magnitude.max())
        if not math.isfinite(batch_amax):
            raise ValueError("the tensor holds NaN or Inf")
        if batch_amax > 0:
            self._grow_to(_power_of_two_above(batch_amax))
        self.amax = max(self.amax, batch_amax)
        self.zeros += int((magnitude == 0).sum())
        if self.limit is None:
            self.counts[0] += magnitude.numel()
            return
        index = (magnitude * (self.bins / self.limit)).floor().long()
        self.counts += torch.bincount(index, minlength=self.bins).cpu().numpy()

    def merge(self, other: Histogram) -> None:
        """Add `other`'s counts (same bin count) to this histogram."""
        if other.bins != self.bins:
            raise ValueError(f"cannot merge a {other.bins}-bin histogram into a {self.bins}-bin one")
        if other.limit is not None:
            self._grow_to(other.limit)
        self.amax = max(self.amax, other.amax)
        self.zeros += other.zeros
        self.counts += _rebinned(other.counts, other.limit, self.limit)

    def _grow_to(self, limit: float) -> None:
        if self.limit is None or limit > self.limit:
            self.counts = _rebinned(self.counts, self.limit, limit)
            self.limit = limit


def _power_of_two_above(value: float) -> float:
    """The smallest power of two strictly greater than `value` > 0 (frexp: value = m·2^e, 0.5 <= m < 1)."""
    _, exponent = math.frexp(value)
    return math.ldexp(1.0, exponent)


def _rebinned(counts: np.ndarray, limit: float | None, new_limit: float | None) -> np.ndarray:
    """`counts` over `[0, limit)` as counts over `[0, new_limit)`, `new_limit = limit · 2^k`."""
    if limit is None or new_limit is None or new_limit == limit:
        return counts.copy()
    factor = round(new_limit / limit)
    merged = counts.reshape(-1, factor).sum(axis=1) if factor < counts.size else counts.sum(keepdims=True)
    out = np.zeros_like(counts)
    out[: merged.size] = merged
    return out
