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


# GELU(x) = x·Φ(x) = max(x, 0) − a·Φ(−a) with a = |x|, so a kernel needs only the Gaussian tail Φ(−a) = erfc(a/√2)/2,
# computed as t·2^(P(t) − GELU_SQUARE·a²) with t = 1/(1 + GELU_T·a): one reciprocal, one exp2 and a degree-9
# polynomial, no branch (libdevice's erff evaluates two branches, predicated, three times the instructions of a
# GEMM without activation). P's coefficients (constant term first) are a minimax fit for a in [0, 20] (kernels bound
# a there) with these float32 constants, made by `scripts/fit_gelu_tail.py`: the tail's relative error is 1.2e-7
# (6.5e-8 from the fit, the rest from rounding P to float32), and the float32 GELU is within 2.4e-7 of the exact
# one everywhere (torch's float32 GELU, 1 + erf in float32, within 1.1e-6).
GELU_T = 0.3535533845424652  # 1/(2√2)
GELU_SQUARE = 0.7213475108146667  # log2(e)/2
GELU_TAIL = (
    -2.825756311416626, 1.4426931142807007, 0.5410681962966919, 0.1297949105501175, -0.23354409635066986,
    0.3287271559238434, -1.5439013242721558, 2.075474739074707, -1.1555591821670532, 0.24100281298160553,
)  # fmt: skip

# For 16-bit outputs (bf16 keeps 8 significant bits, fp16 11) the same tail with P of degree 5 (relative error 1.1e-5)
# and 2^f (|f| ≤ 1/2) as a degree-4 polynomial (2.6e-6) instead of degree 7: the GELU within 2e-5 of the exact one,
# relative, under 2% of an fp16 ulp; seven fewer multiply-adds a value. Same script.
GELU_TAIL_16 = (
    -2.8269412517547607, 1.4651365280151367, 0.382571816444397, 0.653576135635376, -0.9943509101867676,
    0.31999608874320984,
)  # fmt: skip
EXP2_16 = (0.9999992847442627, 0.6931217908859253, 0.240247443318367, 0.05591786280274391, 0.009570102207362652)
