"""Activation-range calibrators: from a `Histogram` of |x| to the clipping threshold `amax`.

Symmetric int8 maps `x` to `clip(round(x / s), -127, 127)` with `s = amax / 127`; values beyond `amax`
saturate. The calibrators trade clipping error against rounding error differently:

- `minmax`: `amax = max |x|` (nothing clips; outliers stretch the step).
- `percentile`: the `percentile`-th percentile of |x| (linear within its bin), capped at `max |x|`.
- `entropy`: TensorRT's KL-divergence method. For each candidate of `i` bins (from `start_bin` = 128 to the
  last non-empty bin), P is the histogram's first `i` bins with the counts beyond folded into bin `i − 1`,
  and Q is those `i` bins merged into 128 levels and spread back evenly over the non-empty bins of each
  level. The threshold is the upper edge of bin `i − 1` for the `i` of smallest KL(P ‖ Q). With fewer than
  `min_samples` nonzero values (a squeeze-excitation input sees one value per channel and image) the
  histogram is too sparse to estimate P, and the threshold is `max |x|`.
- `mse`: the bin edge `t` that minimizes the expected squared error of fake quantization with `s = t / 127`,
  taking the values of each bin as spread evenly over it (exact, not sampled at bin centres, so a step
  wider than a bin is judged right) and exact zeros as error-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import InputError
from .histogram import Histogram
from .scale import QMAX

QUANT_LEVELS = QMAX + 1  # the positive half of int8: 128 levels including 0


def minmax_amax(hist: Histogram) -> float:
    return hist.amax


def percentile_amax(hist: Histogram, percentile: float = 99.99) -> float:
    if not 0 < percentile <= 100:
        raise InputError(f"percentile must be in (0, 100], got {percentile}")
    total = hist.total
    if hist.limit is None or total == 0 or percentile == 100:
        return hist.amax
    cumulative = np.cumsum(hist.counts)
    target = total * percentile / 100
    index = int(np.searchsorted(cumulative, target, side="left"))
    below = cumulative[index - 1] if index else 0
    fraction = (target - below) / hist.counts[index]
    return min((index + fraction) * hist.bin_width, hist.amax)


def entropy_amax(hist: Histogram, start_bin: int = 128, stride: int = 1, min_samples: int = 2048) -> float:
    if start_bin < QUANT_LEVELS or stride < 1:
        raise InputError(f"entropy calibration needs start_bin >= {QUANT_LEVELS} and stride >= 1")
    used = _used_bins(hist)
    if used <= start_bin or hist.total - hist.zeros < min_samples:
        return hist.amax  # too few non-empty bins to clip anything, or too few values to estimate P
    counts = hist.counts.astype(np.float64)
    tail = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # tail[i] = counts[i:].sum()
    best_kl, best_bins = math.inf, used
    for bins in range(start_bin, used + 1, stride):
        reference = counts[:bins].copy()
        reference[-1] += tail[bins]
        kl = _kl_divergence(reference, _merged(counts[:bins], QUANT_LEVELS))
        if kl < best_kl:
            best_kl, best_bins = kl, bins
    return min(best_bins * hist.bin_width, hist.amax)


def mse_amax(hist: Histogram, stride: int = 1) -> float:
    if stride < 1:
        raise InputError(f"mse calibration needs stride >= 1, got {stride}")
    used = _used_bins(hist)
    if used == 0:
        return hist.amax
    width = hist.bin_width
    lower = np.arange(used) * width
    density = hist.counts[:used].astype(np.float64) / width
    density[0] -= hist.zeros / width
    candidates = np.arange(stride, used + 1, stride, dtype=np.float64) * width
    candidates = np.unique(np.append(np.minimum(candidates, hist.amax), hist.amax))
    errors = np.empty(candidates.size)
    for start in range(0, candidates.size, 256):
        threshold = candidates[start : start + 256, None]
        errors[start : start + 256] = (density * _squared_error(lower, lower + width, threshold)).sum(axis=1)
    return float(candidates[int(np.argmin(errors))])


def _squared_error(a: np.ndarray, b: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """`∫_a^b (x − fq(x))² dx` for symmetric int8 fake quantization with `s = threshold / 127`: rounding
    error below the threshold (the sawtooth `e(x) = x − s·round(x/s)`, whose square integrates to
    `k·s³/12 + (e³ + s³/8)/3` over `[0, x]` with `k = floor(x/s + 1/2)`), clipping error `x − threshold`
    above it."""
    step = threshold / QMAX

    def sawtooth_integral(x: np.ndarray) -> np.ndarray:
        periods = np.floor(x / step + 0.5)
        error = x - periods * step
        return periods * step**3 / 12 + (error**3 + step**3 / 8) / 3

    rounding = sawtooth_integral(np.minimum(b, threshold)) - sawtooth_integral(np.minimum(a, threshold))
    clipping = ((np.maximum(b, threshold) - threshold) ** 3 - (np.maximum(a, threshold) - threshold) ** 3) / 3
    return rounding + clipping


CALIBRATORS: dict[str, Callable[..., float]] = {
    "minmax": minmax_amax,
    "entropy": entropy_amax,
    "percentile": percentile_amax,
    "mse": mse_amax,
}
PARAMETERS: dict[str, tuple[str, ...]] = {
    "minmax": (),
    "entropy": ("start_bin", "stride", "min_samples"),
    "percentile": ("percentile",),
    "mse": ("stride",),
}


def compute_amax(hist: Histogram, method: str, params: Mapping[str, Any] | None = None) -> float:
    """The threshold `method` picks from `hist`, with its `params` (see `PARAMETERS`)."""
    check_method(method, params)
    return float(CALIBRATORS[method](hist, **(params or {})))


def check_method(method: str, params: Mapping[str, Any] | None = None) -> None:
    if method not in CALIBRATORS:
        raise InputError(f"unknown calibration method {method!r}: choose from {sorted(CALIBRATORS)}")
    unknown = sorted(set(params or {}) - set(PARAMETERS[method]))
    if unknown:
        raise InputError(f"calibration method {method!r} takes parameters {list(PARAMETERS[method])}, not {unknown}")


def _used_bins(hist: Histogram) -> int:
    """One past the last non-empty bin (0 for a histogram without a range)."""
    if hist.limit is None:
        return 0
    nonzero = np.flatnonzero(hist.counts)
    return int(nonzero[-1]) + 1 if nonzero.size else 0


def _merged(counts: np.ndarray, levels: int) -> np.ndarray:
    """`counts` merged into `levels` groups of `len // levels` bins (the last takes the rest), each group's
    total spread evenly over its non-empty bins."""
    size = counts.size
    group = np.minimum(np.arange(size) // (size // levels), levels - 1)
    nonempty = counts > 0
    totals = np.bincount(group, weights=counts, minlength=levels)
    filled = np.bincount(group, weights=nonempty, minlength=levels)
    return np.where(nonempty, totals[group] / np.maximum(filled[group], 1), 0.0)


def _kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p ‖ q) of the normalized distributions; inf where p has mass that q lacks."""
    p = p / p.sum()
    q_total = q.sum()
    if q_total == 0:
        return math.inf
    q = q / q_total
    support = p > 0
    if np.any(q[support] == 0):
        return math.inf
    return float(np.sum(p[support] * np.log(p[support] / q[support])))
