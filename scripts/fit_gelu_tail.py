"""Fits the polynomials of our kernels' GELU (`kernels.activations.GELU_TAIL`, and for 16-bit outputs `GELU_TAIL_16`
with `EXP2_16`) and checks the float32 GELU built on them.

The Gaussian tail Φ(−a) = erfc(a/√2)/2 (a ≥ 0) is written t·2^(P(t) − c·a²) with t = 1/(1 + a/(2√2)) and c
log2(e)/2 (both constants rounded to float32, as the kernels hold them); as a goes from 0 to 20 (the kernels' bound),
t goes from 1 to 0.124 and log2(Φ(−a)/t) + c·a² stays smooth, so a polynomial of degree 9 in t fits it. The fit is
Lawson's iteration (weighted least squares converging to the minimax polynomial) on Chebyshev points, with the
tail in 50-digit arithmetic (mpmath). The 16-bit form takes P of degree 5 and 2^f (|f| ≤ 1/2) as a minimax
polynomial of degree 4, fitted the same way.

    python scripts/fit_gelu_tail.py        prints the coefficients and the errors (tail, and GELU in float32)
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import torch
from numpy.polynomial import chebyshev, polynomial

from tensorforge.kernels.activations import EXP2_16, GELU_SQUARE, GELU_T, GELU_TAIL, GELU_TAIL_16

A_MAX = 20.0  # the kernels bound |x| here: the tail term is below 1e-80 past it
mpmath.mp.dps = 50


def log2_tail_over_t(t: float) -> float:
    """log2(Φ(−a)/t) + GELU_SQUARE·a² at t = 1/(1 + GELU_T·a), in 50-digit arithmetic, with the constants as the
    kernels have them (float32) so that their rounding does not add to the fit's error where a² is large."""
    t = mpmath.mpf(t)
    a = (1 / t - 1) / GELU_T
    return float(mpmath.log(mpmath.ncdf(-a) / t, 2) + a * a * mpmath.mpf(GELU_SQUARE))


def minimax(u: np.ndarray, target: np.ndarray, scale: np.ndarray, degree: int) -> np.ndarray:
    """Chebyshev coefficients of the polynomial of `degree` in u (Chebyshev points on [-1, 1]) whose largest error
    against `target`, divided by `scale`, is least: Lawson's iteration."""
    basis = chebyshev.chebvander(u, degree) / scale[:, None]
    weights = np.full(u.size, 1.0 / u.size)
    for _ in range(300):
        root = np.sqrt(weights)
        coef, *_ = np.linalg.lstsq(basis * root[:, None], target / scale * root, rcond=None)
        error = np.abs(basis @ coef - target / scale)
        weights = weights * error / np.sum(weights * error)
    return coef


def in_variable(coef: np.ndarray, u_of_x: list[float]) -> np.ndarray:
    """Chebyshev coefficients in u as ordinary ones (constant first) in x, for u = u_of_x[0] + u_of_x[1]·x."""
    result = np.zeros(1)
    for k, c in enumerate(chebyshev.cheb2poly(coef)):
        result = polynomial.polyadd(result, c * polynomial.polypow(u_of_x, k))
    return result


def fit(degree: int) -> tuple[np.ndarray, float]:
    """P's coefficients (constant first) and their largest error on the fitting points: t from 1 (a = 0) down to
    its value at a = A_MAX, where the kernels bound a."""
    low = 1.0 / (1.0 + GELU_T * A_MAX)
    u = np.cos(np.linspace(0.0, np.pi, 3000))  # Chebyshev points on [-1, 1], t = low + (u + 1)·(1 − low)/2
    t = low + (u + 1.0) * (1.0 - low) / 2.0
    target = np.array([log2_tail_over_t(v) for v in t])
    in_t = in_variable(minimax(u, target, np.ones_like(u), degree), [-(1.0 + low) / (1.0 - low), 2.0 / (1.0 - low)])
    return in_t, float(np.abs(polynomial.polyval(t, in_t) - target).max())


def fit_exp2(degree: int) -> tuple[np.ndarray, float]:
    """The coefficients (constant first) of 2^f for |f| ≤ 1/2 with the least largest relative error, and that
    error with the coefficients in float32."""
    u = np.cos(np.linspace(0.0, np.pi, 2000))  # f = u/2
    in_f = in_variable(minimax(u, np.exp2(u / 2), np.exp2(u / 2), degree), [0.0, 2.0])
    f = np.linspace(-0.5, 0.5, 100_001)
    return in_f, float(np.abs(polynomial.polyval(f, in_f.astype(np.float32)) / np.exp2(f) - 1.0).max())


def horner(coef: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    """The polynomial (constant first) at x, in float32."""
    p = np.full_like(x, np.float32(coef[-1]))
    for c in coef[-2::-1]:
        p = p * x + np.float32(c)
    return p


def gelu_float32(x: np.ndarray, tail: tuple[float, ...], exp2: tuple[float, ...] | None = None) -> np.ndarray:
    """The kernels' GELU, step by step in float32; `exp2`, the 16-bit form's polynomial for 2^f (else exact)."""
    f32 = np.float32
    a = np.minimum(np.abs(x), f32(A_MAX))
    t = f32(1.0) / (f32(1.0) + f32(GELU_T) * a)
    power = horner(tail, t) - f32(GELU_SQUARE) * a * a
    if exp2 is None:
        scale = np.exp2(power)
    else:
        n = np.round(power)
        scale = np.ldexp(horner(exp2, (power - n).astype(f32)), n.astype(np.int32))
    return np.maximum(x, f32(0.0)) - (a * t) * scale


def main() -> None:
    coef, fit_error = fit(len(GELU_TAIL) - 1)
    coef_16, fit_error_16 = fit(len(GELU_TAIL_16) - 1)
    exp2_16, exp2_error = fit_exp2(len(EXP2_16) - 1)
    for name, c, error in (("P", coef, fit_error), ("P, 16-bit", coef_16, fit_error_16)):
        print(f"{name} (constant first): {[float(np.float32(v)) for v in c]}")
        print(f"  largest error of log2(tail/t) {error:.2e} (the tail's relative error {error * math.log(2):.2e})")
    print(f"2^f, 16-bit (constant first): {[float(np.float32(v)) for v in exp2_16]}; relative error {exp2_error:.2e}")
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-12, 12, 100_001), rng.standard_normal(50_000) * 3]).astype(np.float32)
    exact = np.array([float(mpmath.mpf(float(v)) * mpmath.ncdf(float(v))) for v in x])
    for name, y in (
        ("GELU_TAIL (in the kernels)", gelu_float32(x, GELU_TAIL)),
        ("this fit", gelu_float32(x, tuple(coef))),
        ("GELU_TAIL_16, EXP2_16", gelu_float32(x, GELU_TAIL_16, EXP2_16)),
        ("torch float32", torch.nn.functional.gelu(torch.from_numpy(x)).numpy()),
    ):
        error = np.abs(y.astype(np.float64) - exact)
        relative = (error / np.maximum(np.abs(exact), 1e-300)).max()
        print(f"{name:28s} largest error against the exact GELU {error.max():.2e}, relative {relative:.2e}")


if __name__ == "__main__":
    main()
