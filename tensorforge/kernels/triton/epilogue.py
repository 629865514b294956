"""The fused activations of `ops.fused.ACTIVATIONS` as one Triton function, for kernels' epilogues.

`activate(x, ACT, p0, p1)` applies the activation whose code is `ACT` (a constexpr: the branch is chosen at
compile time) to a float32 block; `activation_args(name, params)` (from `kernels.activations`) gives a kernel's
launcher that code and the two float parameters.
sigmoid is computed from e^−|x| (it never overflows), tanh as 2·sigmoid(2x) − 1 and softplus as
max(x, 0) + log(1 + e^−|x|): Triton's core math covers them on every backend and in the interpreter. GELU (erf's)
is `_gelu`, branch-free, closer to the exact GELU than torch's float32 one, at about half the instructions of
libdevice's erff; reciprocals and powers of two are PTX's approximate ones on the GPU.
Clamps are written as selects so that NaN propagates, as in the reference (min/max would drop it); ReLU is a
NaN-propagating maximum.
`quantize(v, inv_scale, QUANT)` rounds a float block onto the int8 (1) or float8 E4M3 (2) grid, for kernels
that quantize an operand as they load it or a result as they store it, and `widen(z)` reads a quantized block back
as float32 (int8 rounding needs no conversion instruction; widening takes one `cvt`). `dequantize_bias_pre` is
the head of the convolution kernels' epilogue.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..activations import ACTIVATION_CODES, GELU_SQUARE, GELU_T, GELU_TAIL, GELU_TAIL_16, activation_args
from ..quantize import KINDS

__all__ = ["ACTIVATION_CODES", "RELU", "activate", "activation_args", "dequantize_bias_pre", "quantize", "widen"]


# On the GPU a reciprocal and a power of two are PTX's approximate flush-to-zero instructions, one MUFU each (at most
# 1 and 2 ulp off; Triton's `/` and `exp2` add range checks worth 3 to 4 instructions an element to an epilogue);
# the interpreter, which runs no PTX, computes the same formulas in plain Triton.
_INTERPRETED = triton.knobs.runtime.interpret if hasattr(triton, "knobs") else os.environ.get("TRITON_INTERPRET") == "1"
_PTX = tl.constexpr(not _INTERPRETED)  # Triton before 3.4 has no knobs: it reads the variable as above
_MINUS_LOG2E = tl.constexpr(-1.4426950408889634)
_T = tl.constexpr(GELU_T)
_SQUARE = tl.constexpr(GELU_SQUARE)
_P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7, _P8, _P9 = (tl.constexpr(c) for c in GELU_TAIL)
_Q0, _Q1, _Q2, _Q3, _Q4, _Q5 = (tl.constexpr(c) for c in GELU_TAIL_16)  # for 16-bit and 8-bit outputs


@triton.jit
def _reciprocal(x):
    if _PTX:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 / x


@triton.jit
def _exp2(x):
    if _PTX:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.exp2(x)


@triton.jit
def _sigmoid(x):
    e = _exp2(tl.abs(x) * _MINUS_LOG2E)  # e^−|x|, never overflows
    r = _reciprocal(1.0 + e)
    return tl.where(x >= 0.0, r, e * r)


@triton.jit
def _gelu(x, NARROW: tl.constexpr):
    """max(x, 0) − |x|·Φ(−|x|), the tail as `kernels.activations` says (|x| bounded by 20, past which the tail term
    is below 1e-80: an infinite x stays out of it; a NaN x survives the maximum). `NARROW`: the result is stored in
    16 bits or fewer, and the tail's polynomial is `GELU_TAIL_16` (degree 5, relative error 1.1e-5) instead of
    `GELU_TAIL` (degree 9)."""
    a = tl.minimum(tl.abs(x), 20.0)
    t = _reciprocal(a * _T + 1.0)  # constants right of tensors: the interpreter's constexpr would wrap the tensor
    if NARROW:
        p = t * _Q5 + _Q4
        p = t * p + _Q3
        p = t * p + _Q2
        p = t * p + _Q1
        p = t * p + _Q0
    else:
        p = t * _P9 + _P8
        p = t * p + _P7
        p = t * p + _P6
        p = t * p + _P5
        p = t * p + _P4
        p = t * p + _P3
        p = t * p + _P2
        p = t * p + _P1
        p = t * p + _P0
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL) - a * t * _exp2(p - a * a * _SQUARE)


@triton.jit
def _tanh(x):
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def activate(x, ACT: tl.constexpr, p0, p1, NARROW: tl.constexpr = False):
    """`x` (float32) through activation `ACT` with parameters p0, p1; `NARROW`: the result is stored in 16 bits or
    fewer (GELU then evaluates its tail to that precision)."""
    if ACT == 1:
        x = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)  # one instruction (max.NaN), NaN kept
    elif ACT == 2:
        x = tl.where(x < p0, p0, tl.where(x > p1, p1, x))
    elif ACT == 3:
        x = tl.where(x >= 0.0, x, x * p0)
    elif ACT == 4:
        x = _sigmoid(x)
    elif ACT == 5:
        x = x * p0 + p1
        x = tl.where(x < 0.0, 0.0, tl.where(x > 1.0, 1.0, x))
    elif ACT == 6:
        x = x * tl.minimum(tl.maximum(x / 6.0 + 0.5, 0.0), 1.0)
    elif ACT == 7:
        x = x * _sigmoid(x)
    elif ACT == 8:
        x = _gelu(x, NARROW)
    elif ACT == 9:
        x = 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    elif ACT == 10:
        x = _tanh(x)
    elif ACT == 11:
        softplus = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
        x = x * _tanh(softplus)
    elif ACT == 12:
        x = tl.where(x > 0.0, x, p0 * (tl.exp(tl.where(x > 0.0, 0.0, x)) - 1.0))
    return x


# 1.5·2^23: adding it to a float32 |v| <= 2^22 leaves round(v) (to nearest, ties to even: float32 addition rounds
# so) in the low bits of the sum's mantissa, whose low byte is then the int8 result, without a conversion
# instruction (`F2I` issues at 16 a clock per multiprocessor on Hopper, an eighth of the float32 rate).
_MAGIC = tl.constexpr(12582912.0)


QUANT_CODES = {torch.int8: 1, torch.float8_e4m3fn: 2}  # `quantize`'s QUANT by the quantized tensor's type


def quant_code(kind: str) -> int:
    """`quantize`'s QUANT for a quantization kind by name ("int8", "fp8e4m3": `kernels.quantize.KINDS`)."""
    return QUANT_CODES[KINDS[kind][0]]


RELU = tl.constexpr(ACTIVATION_CODES["Relu"])


@triton.jit
def quantize(
    v, inv_scale, QUANT: tl.constexpr, OPERAND: tl.constexpr = False, NONNEG: tl.constexpr = False,
    FOLDED: tl.constexpr = False,
):  # fmt: skip
    """A float block on the quantized grid: `v · inv_scale` in float32, clipped, then int8 rounding half to even
    or E4M3 rounding to nearest even (its clip as selects, so NaN stays NaN; an int8 has no NaN, and a NaN clips
    to a bound). `NONNEG`: v is ≥ 0 or NaN (a ReLU's output, `POST == RELU`), so the lower clip is left out, one
    instruction of an epilogue's dozen (an int8 NaN then saturates to 127 instead of −128). A stored int8 result
    is the low byte of the rounding sum's bits (no conversion instruction); an `OPERAND` (quantized on load, for
    the tensor cores) is converted with `cvt`: rounded through the bits, the operands of a 128×16-tile layer
    quantizing float32 on load gave wrong products with Triton 3.6 on the H200 (every output 0), while stored
    results rounded that way were exact in every test and engine build. `FOLDED`: v is already scaled (the
    kernel folded inv_scale into its column factors), so it is not multiplied again."""
    v = v.to(tl.float32)
    if not FOLDED:
        v = v * inv_scale
    if QUANT == 1:
        if not NONNEG:
            v = tl.maximum(v, -128.0)
        v = tl.minimum(v, 127.0) + _MAGIC
        if OPERAND:
            return (v - _MAGIC).to(tl.int8)
        return v.to(tl.int32, bitcast=True).to(tl.int8)
    else:
        if not NONNEG:
            v = tl.where(v < -448.0, -448.0, v)
        v = tl.where(v > 448.0, 448.0, v)
        return v.to(tl.float8e4nv, fp_downcast_rounding="rtne")


@triton.jit
def widen(z):
    """A block as float32, exactly, with `cvt` (for int8 one `I2F.S8` from the byte: through the rounding
    constant's bits it took a byte permute, an integer add and a float subtract, and the Gluon kernel's int8
    layers with a residual ran 20-25% slower so, `bench/int8_epilogue.py`)."""
    return z.to(tl.float32)


@triton.jit
def dequantize_bias_pre(
    acc, channels, ok, w_scale, x_scale, bias, pre0, pre1, QUANT: tl.constexpr, HAS_BIAS: tl.constexpr,
    PRE: tl.constexpr, NARROW: tl.constexpr = False,
):  # fmt: skip
    """The head of FusedConv's epilogue on an accumulator tile whose columns are output `channels` (`ok`: those
    inside): a quantized product (`QUANT` 1 or 2) dequantized, `acc · (x_scale · w_scale[channel])`, then
    `pre(acc + bias)`, in float32 (`NARROW` as `activate`'s)."""
    if QUANT != 0:
        acc = acc.to(tl.float32) * (x_scale * tl.load(w_scale + channels, mask=ok, other=0.0))[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + channels, mask=ok, other=0.0).to(tl.float32)[None, :]
    return activate(acc, PRE, pre0, pre1, NARROW)
