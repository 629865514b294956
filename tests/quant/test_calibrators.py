"""Calibrators on synthetic distributions with known answers."""

import numpy as np
import pytest
import torch

from tensorforge.errors import InputError
from tensorforge.quant.calibrators import compute_amax
from tensorforge.quant.histogram import Histogram
from tensorforge.quant.scale import MIN_SCALE, symmetric_scale


def histogram_of(x: np.ndarray) -> Histogram:
    hist = Histogram()
    hist.add(torch.from_numpy(x.astype(np.float32)))
    return hist


def quantization_mse(x: np.ndarray, amax: float) -> float:
    scale = amax / 127
    return float(np.mean((x - np.clip(np.round(x / scale), -127, 127) * scale) ** 2))


def test_minmax_is_the_exact_largest_magnitude():
    x = np.random.default_rng(0).uniform(-2, 1, 10000)
    x[17] = -3.21
    assert compute_amax(histogram_of(x), "minmax") == pytest.approx(3.21, rel=1e-7)


def test_percentile_of_a_uniform_distribution():
    x = np.random.default_rng(1).uniform(-1, 1, 400_000)  # |x| ~ U(0, 1): its q-th percentile is q/100
    hist = histogram_of(x)
    for q in (50.0, 90.0, 99.0):
        assert compute_amax(hist, "percentile", {"percentile": q}) == pytest.approx(q / 100, abs=3e-3)
    assert compute_amax(hist, "percentile", {"percentile": 100}) == hist.amax


def test_percentile_of_a_gaussian():
    x = np.random.default_rng(2).normal(0, 1, 1_000_000)
    # P(|x| < 2.5758) = 0.99 for a standard normal.
    assert compute_amax(histogram_of(x), "percentile", {"percentile": 99}) == pytest.approx(2.5758, abs=0.01)


def test_entropy_clips_rare_outliers_of_a_gaussian():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 1, 200_000), rng.uniform(20, 40, 20) * rng.choice([-1, 1], 20)])
    hist = histogram_of(x)
    amax = compute_amax(hist, "entropy")
    assert 2.5 < amax < 0.5 * hist.amax  # well below the outliers, not inside the Gaussian's bulk
    # The bulk of the distribution is resolved far more finely than with the outlier-stretched minmax step.
    bulk = x[np.abs(x) < 3]
    assert quantization_mse(bulk, amax) < 0.05 * quantization_mse(bulk, hist.amax)


def test_entropy_keeps_the_range_of_a_sparse_histogram():
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(0, 1, 300), [9.0]])  # 301 values: far fewer than the 2048 bins
    hist = histogram_of(x)
    assert compute_amax(hist, "entropy") == hist.amax
    assert compute_amax(hist, "entropy", {"min_samples": 100}) < hist.amax


def test_entropy_keeps_the_range_of_a_uniform_distribution():
    x = np.random.default_rng(4).uniform(-1, 1, 200_000)
    assert compute_amax(histogram_of(x), "entropy") > 0.95


def test_mse_beats_minmax_on_heavy_tails():
    x = np.random.default_rng(5).standard_t(2, 200_000)  # Student t with 2 degrees of freedom
    hist = histogram_of(x)
    amax = compute_amax(hist, "mse")
    assert amax < hist.amax
    assert quantization_mse(x, amax) < 0.75 * quantization_mse(x, hist.amax)
    # And it is the best threshold, up to the histogram's resolution, of a fine grid scored on the raw data.
    best = min(quantization_mse(x, t) for t in np.linspace(1, hist.amax, 600))
    assert quantization_mse(x, amax) <= 1.01 * best


def test_mse_counts_exact_zeros_as_free():
    rng = np.random.default_rng(6)
    x = np.maximum(rng.normal(0, 1, 100_000), 0)  # half the values are exactly zero (after a ReLU)
    amax = compute_amax(histogram_of(x), "mse")
    best = min(np.linspace(1, x.max(), 400), key=lambda t: quantization_mse(x, t))
    assert quantization_mse(x, amax) <= 1.02 * quantization_mse(x, best)


def test_all_zero_tensor_gets_the_tiny_scale():
    hist = histogram_of(np.zeros(100))
    for method in ("minmax", "entropy", "percentile", "mse"):
        amax = compute_amax(hist, method)
        assert amax == 0.0
        assert symmetric_scale(amax) == MIN_SCALE


def test_bad_methods_and_parameters():
    hist = histogram_of(np.linspace(-1, 1, 100))
    with pytest.raises(InputError, match="unknown calibration method 'kl'"):
        compute_amax(hist, "kl")
    with pytest.raises(InputError, match="takes parameters"):
        compute_amax(hist, "minmax", {"percentile": 99})
    with pytest.raises(InputError, match=r"percentile must be in \(0, 100\]"):
        compute_amax(hist, "percentile", {"percentile": 0})
    with pytest.raises(InputError, match="start_bin"):
        compute_amax(hist, "entropy", {"start_bin": 64})
