"""The fused activations of `ops.fused.ACTIVATIONS` as one Triton function, for kernels' epilogues.

`activate(x, ACT, p0, p1)` applies the activation whose code is `ACT` (a constexpr: the branch is chosen at
compile time) to a float32 block; `activation_args(name, params)` gives a kernel's launcher that code and the
two float parameters (Clip's bounds, LeakyRelu's and Elu's alpha, HardSigmoid's alpha and beta).
sigmoid is computed from e^−|x| (it never overflows), tanh as 2·sigmoid(2x) − 1 and softplus as
max(x, 0) + log(1 + e^−|x|): Triton's core math covers them on every backend and in the interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence

import triton
import triton.language as tl

ACTIVATION_CODES = {
    "": 0,
    "Relu": 1,
    "Clip": 2,
    "LeakyRelu": 3,
    "Sigmoid": 4,
    "HardSigmoid": 5,
    "HardSwish": 6,
    "SiLU": 7,
    "Gelu": 8,
    "GeluTanh": 9,
    "Tanh": 10,
    "Mish": 11,
    "Elu": 12,
}
# Parameters an activation takes when the node gives none (as `ops.fused.ACTIVATIONS` defaults them).
_DEFAULTS = {"LeakyRelu": (0.01, 0.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, 0.0)}


def activation_args(name: str, params: Sequence[float] = ()) -> tuple[int, float, float]:
    """(code, p0, p1) for `activate`; raises ValueError naming the activation when Triton has no code for it."""
    if name not in ACTIVATION_CODES:
        raise ValueError(f"no Triton epilogue for activation {name!r}; known: {sorted(a for a in ACTIVATION_CODES)}")
    if name == "Clip" and len(params) < 2:
        raise ValueError(f"Clip needs its two bounds as parameters, got {list(params)}")
    defaults = _DEFAULTS.get(name, (0.0, 0.0))
    values = [*params, *defaults[len(params) :]]
    return ACTIVATION_CODES[name], float(values[0]), float(values[1])


@triton.jit
def _sigmoid(x):
    e = tl.exp(-tl.abs(x))  # never overflows
    return tl.where(x >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _tanh(x):
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def activate(x, ACT: tl.constexpr, p0, p1):
    """`x` (float32) through activation `ACT` with parameters p0, p1."""
    if ACT == 1:
        x = tl.maximum(x, 0.0)
    elif ACT == 2:
        x = tl.minimum(tl.maximum(x, p0), p1)
    elif ACT == 3:
        x = tl.where(x >= 0.0, x, x * p0)
    elif ACT == 4:
        x = _sigmoid(x)
    elif ACT == 5:
        x = tl.minimum(tl.maximum(x * p0 + p1, 0.0), 1.0)
    elif ACT == 6:
        x = x * tl.minimum(tl.maximum(x / 6.0 + 0.5, 0.0), 1.0)
    elif ACT == 7:
        x = x * _sigmoid(x)
    elif ACT == 8:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACT == 9:
        x = 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    elif ACT == 10:
        x = _tanh(x)
    elif ACT == 11:
        softplus = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
        x = x * _tanh(softplus)
    elif ACT == 12:
        x = tl.where(x > 0.0, x, p0 * (tl.exp(tl.minimum(x, 0.0)) - 1.0))
    return x
