"""The C++ depthwise convolution (AVX-512) against a float64 convolution with the fused activation (built with the
host's compiler on first use, then cached; skipped where no compiler, ninja, AVX-512 or AVX2 is found)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import avx512
from tensorforge.kernels.cpu import depthwise as dw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or dw.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

BOUND = 1e-5  # normwise against float64: float32 sums of at most 49 terms, exponentials within 2 ulp
ACTIVATIONS = {  # name → its parameters as a node gives them
    "": [], "Relu": [], "Clip": [0.0, 6.0], "LeakyRelu": [0.1], "Sigmoid": [], "HardSigmoid": [1 / 6, 0.5],
    "HardSwish": [], "SiLU": [], "Gelu": [],
}  # fmt: skip


def _reference(x, w, b, strides, pads, dilations, act, params) -> torch.Tensor:
    """Float64 convolution with ONNX pads (top, left, bottom, right) and the activation."""
    top, left, bottom, right = pads
    padded = F.pad(x.double(), (left, right, top, bottom))
    y = F.conv2d(padded, w.double(), None if b is None else b.double(), strides, 0, dilations, x.shape[1])
    return apply_activation(y, act, params)


def _run(x, w, b, strides, pads, dilations, act, params, tile=None, out=None) -> torch.Tensor:
    kernel = tuple(w.shape[2:])
    out_hw = [
        (x.shape[2 + i] + pads[i] + pads[i + 2] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in (0, 1)
    ]
    if out is None:
        out = torch.full((x.shape[0], w.shape[0], *out_hw), math.nan, dtype=x.dtype)
        out = out.contiguous(memory_format=torch.channels_last)
    conv = dw.DepthwiseConv(w, b, strides, dilations, act, activation_args(act, params)[1:], tile)
    return conv(x, pads[:2], out_hw, out)


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _operands(n, c, h, w, k, seed=0, bias=True):
    torch.manual_seed(seed)
    kh, kw = (k, k) if isinstance(k, int) else k
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, kh, kw) / (kh * kw) ** 0.5
    return x, weight, torch.randn(c) if bias else None


# (N, C, H, W, kernel, strides, pads, dilations): MobileNetV3's and EfficientNet's layers shrunk (the register-window
# path: 3, 5 and 7 wide, stride 1 and 2), channels no vector fills (3, 20, 40: a masked last block), maps narrower
# than a tile and than the filter, asymmetric and no padding, and the generic path (dilation 2, stride 3, a 2- or
# 1-wide filter, a 3×1 one).
SHAPES = [
    (1, 16, 23, 23, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 64, 22, 22, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 72, 14, 14, 5, (2, 2), (2, 2, 2, 2), (1, 1)),
    (1, 120, 9, 9, 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    (2, 40, 7, 7, 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    (1, 20, 11, 13, 7, (1, 1), (3, 3, 3, 3), (1, 1)),
    (1, 3, 10, 12, 7, (2, 2), (3, 3, 3, 3), (1, 1)),
    (1, 48, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 32, 3, 2, 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    (1, 24, 12, 12, 3, (2, 2), (0, 0, 1, 1), (1, 1)),
    (1, 17, 9, 10, 3, (1, 1), (0, 0, 0, 0), (1, 1)),
    (1, 32, 13, 13, 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    (1, 33, 14, 15, 3, (3, 3), (1, 1, 1, 1), (1, 1)),
    (1, 16, 9, 9, 2, (1, 1), (0, 0, 1, 1), (1, 1)),
    (1, 16, 6, 7, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    (1, 24, 8, 9, (3, 1), (1, 2), (1, 0, 1, 0), (1, 1)),
]


@pytest.mark.parametrize("tile", dw.TILES)
@pytest.mark.parametrize(("n", "c", "h", "w", "k", "strides", "pads", "dilations"), SHAPES)
def test_shapes_against_the_float64_convolution(n, c, h, w, k, strides, pads, dilations, tile):
    x, weight, b = _operands(n, c, h, w, k, seed=c + h)
    got = _run(x, weight, b, strides, pads, dilations, "Relu", [], tile)
    want = _reference(x, weight, b, strides, pads, dilations, "Relu", [])
    assert got.shape == want.shape and not got.isnan().any()  # every element written (the output starts as NaN)
    assert _error(got, want) <= BOUND


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_every_activation(act):
    x, weight, b = _operands(1, 40, 10, 11, 3, seed=3)
    x = x * 4  # reach the saturating parts of Clip, HardSigmoid, HardSwish and the exponentials' tails
    got = _run(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), act, ACTIVATIONS[act])
    assert _error(got, _reference(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), act, ACTIVATIONS[act])) <= BOUND


def test_exponentials_saturate_without_nan():
    """Sigmoid and SiLU of sums far beyond float32's exp range: 0, 1, -0 or x, never NaN."""
    x = torch.tensor([-1e4, -200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 200.0, 1e4]).reshape(1, 1, 1, 9).repeat(1, 16, 1, 1)
    weight = torch.zeros(16, 1, 1, 1)
    weight[:, 0, 0, 0] = 1.0
    for act in ("Sigmoid", "SiLU"):
        got = _run(x.contiguous(memory_format=torch.channels_last), weight, None, (1, 1), (0,) * 4, (1, 1), act, [])
        want = _reference(x, weight, None, (1, 1), (0,) * 4, (1, 1), act, [])
        assert not got.isnan().any()
        assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-30), act


def test_without_bias():
    x, weight, _ = _operands(1, 24, 8, 8, 5, bias=False)
    got = _run(x, weight, None, (1, 1), (2, 2, 2, 2), (1, 1), "", [])
    assert _error(got, _reference(x, weight, None, (1, 1), (2, 2, 2, 2), (1, 1), "", [])) <= BOUND


def test_reads_and_writes_channel_slices_of_larger_tensors():
    """The input a channel slice of a channels_last tensor (a value inside its concatenation), the output another:
    both read and written through their strides, the output's neighbouring channels untouched."""
    torch.manual_seed(5)
    whole = torch.randn(1, 50, 9, 9).contiguous(memory_format=torch.channels_last)
    x = whole[:, 10:30]
    weight, b = torch.randn(20, 1, 3, 3), torch.randn(20)
    host = torch.full((1, 36, 9, 9), 7.0).contiguous(memory_format=torch.channels_last)
    out = host[:, 8:28]
    _run(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "HardSwish", [], out=out)
    assert _error(out, _reference(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "HardSwish", [])) <= BOUND
    assert (host[:, :8] == 7.0).all() and (host[:, 28:] == 7.0).all()


def test_a_nan_reaches_exactly_the_outputs_whose_window_holds_it():
    x, weight, b = _operands(1, 16, 9, 9, 3, seed=7)
    x[0, 5, 4, 4] = math.nan
    got = _run(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "Relu", [])
    want = _reference(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "Relu", [])
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 9
    assert _error(got.nan_to_num(), want.nan_to_num()) <= BOUND


def test_an_nchw_input_is_made_channels_last_and_a_new_output_returned():
    x, weight, b = _operands(2, 24, 7, 6, 3, seed=9)
    got = dw.DepthwiseConv(weight, b, act="Relu")(x.contiguous(), (1, 1), (7, 6))
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert _error(got, _reference(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "Relu", [])) <= BOUND


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda w, x: dw.DepthwiseConv(w, act="Mish"), "no activation 'Mish'"),
        (lambda w, x: dw.DepthwiseConv(w, tile=6), "tiles"),
        (lambda w, x: dw.DepthwiseConv(w)(x.double(), (1, 1), (5, 5)), "x must be a 4-D float32"),
        (lambda w, x: dw.DepthwiseConv(w)(x, (1, 1), (5, 5), torch.empty(1, 16, 5, 5)), "out must be a 4-D float32"),
        (lambda w, x: dw.DepthwiseConv(w)(x, (1, 1, 1, 1), (5, 5)), r"pads \(top, left\) and out_hw"),
    ],
)
def test_bad_arguments_are_refused_by_name(make, message):
    x, weight, _ = _operands(1, 16, 5, 5, 3)
    with pytest.raises(ValueError, match=message):
        make(weight, x)


def test_a_cpu_with_neither_avx512_nor_avx2_is_declined(monkeypatch):
    monkeypatch.setattr(avx512, "host_flags", lambda: "flags : fpu sse2 avx")
    assert "AVX-512 or AVX2" in dw.problem()


def test_a_cpu_with_avx2_runs_the_float_kernels_but_not_the_int8_ones(monkeypatch):
    monkeypatch.setattr(avx512, "host_flags", lambda: "flags : fpu sse2 avx avx2 fma")
    assert avx512.isa() == "avx2"
    assert dw.problem() is None
    assert "AVX-512" in avx512.avx512_problem("int8 convolution")


# -- bf16 ----------------------------------------------------------------------------------------------------------

bf16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
BF16_BOUND = 2.0**-8  # the output's one rounding to bf16 (half an ulp of 8 significant bits); float32 sums and math


def _bf16(x, weight, b):
    """bf16 activations and weight (the bias stays float32); the reference convolves these same values in float64."""
    return x.bfloat16(), weight.bfloat16(), b


@bf16
@pytest.mark.parametrize("tile", dw.TILES)
@pytest.mark.parametrize(("n", "c", "h", "w", "k", "strides", "pads", "dilations"), SHAPES)
def test_bf16_shapes_against_the_float64_convolution_of_its_bf16_operands(
    n, c, h, w, k, strides, pads, dilations, tile
):
    x, weight, b = _bf16(*_operands(n, c, h, w, k, seed=c + h))
    got = _run(x, weight, b, strides, pads, dilations, "Relu", [], tile)
    want = _reference(x, weight, b, strides, pads, dilations, "Relu", [])
    assert got.dtype == torch.bfloat16 and got.shape == want.shape and not got.isnan().any()
    assert 0 < _error(got, want) <= BF16_BOUND  # (0: not rounded to bf16)


@bf16
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_bf16_every_activation(act):
    x, weight, b = _bf16(*_operands(1, 40, 10, 11, 3, seed=3))
    x = x * 4
    got = _run(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), act, ACTIVATIONS[act])
    assert _error(got, _reference(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), act, ACTIVATIONS[act])) <= BF16_BOUND


@bf16
def test_bf16_reads_and_writes_channel_slices_and_nothing_else():
    torch.manual_seed(5)
    whole = torch.randn(1, 50, 9, 9).contiguous(memory_format=torch.channels_last).bfloat16()
    weight, b = torch.randn(20, 1, 3, 3).bfloat16(), torch.randn(20)
    host = torch.full((1, 36, 9, 9), math.nan, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    _run(whole[:, 10:30], weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "HardSwish", [], out=host[:, 8:28])
    want = _reference(whole[:, 10:30], weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "HardSwish", [])
    assert _error(host[:, 8:28], want) <= BF16_BOUND
    assert host[:, :8].isnan().all() and host[:, 28:].isnan().all()


@bf16
def test_bf16_refuses_float32_operands_by_name():
    x, weight, _ = _bf16(*_operands(1, 16, 5, 5, 3, bias=False))
    conv = dw.DepthwiseConv(weight)
    with pytest.raises(ValueError, match="x must be a 4-D bf16"):
        conv(x.float(), (1, 1), (5, 5))
    with pytest.raises(ValueError, match="out must be a 4-D bf16"):
        conv(x, (1, 1), (5, 5), torch.empty(1, 16, 5, 5).contiguous(memory_format=torch.channels_last))
