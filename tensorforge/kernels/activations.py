"""The fused activations of `ops.fused.ACTIVATIONS` as integer codes for our kernels (Triton and CUDA C).

A kernel's epilogue takes an activation as a compile-time code and two float parameters (Clip's bounds,
LeakyRelu's and Elu's alpha, HardSigmoid's alpha and beta); `activation_args` turns a fused node's activation
name and parameters into those.
"""

from __future__ import annotations

from collections.abc import Sequence

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
