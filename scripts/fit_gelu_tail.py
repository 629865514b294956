"""Fits the polynomial of our kernels' GELU (`kernels.activations.GELU_TAIL`) and checks the float32 GELU built on it.

The Gaussian tail Φ(−a) = erfc(a/√2)/2 (a ≥ 0) is written t·2^(P(t) − c·a²) with t = 1/(1 + a/(2√2)) and c
log2(e)/2 (both constants rounded to float32, as the kernels hold them); as a goes from 0 to 20 (the kernels' bound),
t goes from 1 to 0.124 and log2(Φ(−a)/t) + c·a² stays smooth, so a polynomial of degree 9 in t fits it. The fit is
Lawson's iteration (weighted least squares converging to the minimax polynomial) on Chebyshev points, with the
tail in 50-digit arithmetic (mpmath).

    python scripts/fit_gelu_tail.py        prints the coefficients and the errors (tail, and GELU in float32)
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import torch
from numpy.polynomial import chebyshev, polynomial

from tensorforge.kernels.activations import GELU_SQUARE, GELU_T, GELU_TAIL

DEGREE = 9
A_MAX = 20.0  # the kernels bound |x| here: the tail term is below 1e-80 past it
mpmath.mp.dps = 50


def log2_tail_over_t(t: float) -> float:
    """log2(Φ(−a)/t) + GELU_SQUARE·a² at t = 1/(1 + GELU_T·a), in 50-digit arithmetic, with the constants as the
    kernels have them (float32) so that their rounding does not add to the fit's error where a² is large."""
    t = mpmath.mpf(t)
    a = (1 / t - 1) / GELU_T
    return float(mpmath.log(mpmath.ncdf(-a) / t, 2) + a * a * mpmath.mpf(GELU_SQUARE))


def fit() -> tuple[np.ndarray, float]:
    """P's coefficients (constant first) and their largest error on the fitting points: t from 1 (a = 0) down to
    its value at a = A_MAX, where the kernels bound a."""
    low = 1.0 / (1.0 + GELU_T * A_MAX)
    u = np.cos(np.linspace(0.0, np.pi, 3000))  # Chebyshev points on [-1, 1], t = low + (u + 1)·(1 − low)/2
    t = low + (u + 1.0) * (1.0 - low) / 2.0
    target = np.array([log2_tail_over_t(v) for v in t])
    basis = chebyshev.chebvander(u, DEGREE)
    weights = np.full(t.size, 1.0 / t.size)
    for _ in range(300):
        root = np.sqrt(weights)
        coef, *_ = np.linalg.lstsq(basis * root[:, None], target * root, rcond=None)
        error = np.abs(basis @ coef - target)
        weights = weights * error / np.sum(weights * error)
    in_t = np.zeros(1)
    u_of_t = [-(1.0 + low) / (1.0 - low), 2.0 / (1.0 - low)]
    for k, c in enumerate(chebyshev.cheb2poly(coef)):
        in_t = polynomial.polyadd(in_t, c * polynomial.polypow(u_of_t, k))
    return in_t, float(np.abs(polynomial.polyval(t, in_t) - target).max())


def gelu_float32(x: np.ndarray, tail: tuple[float, ...]) -> np.ndarray:
    """The kernels' GELU, step by step in float32."""
    f32 = np.float32
    a = np.minimum(np.abs(x), f32(A_MAX))
    t = f32(1.0) / (f32(1.0) + f32(GELU_T) * a)
    p = np.full_like(t, f32(tail[-1]))
    for c in tail[-2::-1]:
        p = p * t + f32(c)
    return np.maximum(x, f32(0.0)) - (a * t) * np.exp2(p - f32(GELU_SQUARE) * a * a)


def main() -> None:
    coef, fit_error = fit()
    print(f"P (constant first): {[float(np.float32(c)) for c in coef]}")
    tail_error = fit_error * math.log(2)
    print(f"fit: largest error of log2(tail/t) {fit_error:.2e} (the tail's relative error {tail_error:.2e})")
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-12, 12, 100_001), rng.standard_normal(50_000) * 3]).astype(np.float32)
    exact = np.array([float(mpmath.mpf(float(v)) * mpmath.ncdf(float(v))) for v in x])
    for name, y in (
        ("GELU_TAIL (in the kernels)", gelu_float32(x, GELU_TAIL)),
        ("this fit", gelu_float32(x, tuple(coef))),
        ("torch float32", torch.nn.functional.gelu(torch.from_numpy(x)).numpy()),
    ):
        print(f"{name:28s} largest error against the exact GELU {np.abs(y.astype(np.float64) - exact).max():.2e}")


if __name__ == "__main__":
    main()
