"""The C++ direct convolution (AVX-512) against a float64 convolution with the fused epilogue (built with the host's
compiler on first use, then cached; skipped where no compiler, ninja, AVX-512 or AVX2 is found)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import conv as cv
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or cv.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

BOUND = 2e-6  # normwise against float64: float32 sums of at most 600 terms, exponentials within 2 ulp


def _reference(x, w, b, pads, strides, dilations, z, pre, post) -> torch.Tensor:
    top, left, bottom, right = pads
    padded = F.pad(x.double(), (left, right, top, bottom))
    y = F.conv2d(padded, w.double(), None if b is None else b.double(), strides, 0, dilations)
    y = apply_activation(y, pre, [])
    return y if z is None else apply_activation(y + z.double(), post, [])


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


CASES = [  # (n, c, k, h, w, window, strides, dilations, pads (top, left, bottom, right))
    (1, 32, 64, 9, 11, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # a 3×3 layer, rows no tile divides
    (2, 17, 37, 10, 7, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # stride 2, channels no vector divides, two images
    (1, 24, 80, 12, 13, (5, 5), (1, 1), (2, 2), (4, 3, 4, 3)),  # dilated 5×5, uneven padding, two column blocks
    (1, 40, 20, 8, 8, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),  # a 1×1 downsampling
    (1, 16, 200, 6, 20, (3, 1), (1, 2), (1, 1), (1, 0, 0, 0)),  # a tall window, padding on one side only
    (1, 8, 16, 3, 3, (3, 3), (1, 1), (1, 1), (2, 2, 2, 2)),  # more padding than input: whole tap rows skipped
    (1, 64, 1840, 3, 5, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # a 4.2 MB weight: walked by column blocks
    (2, 16, 24, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # ResNet's last maps: tiles span rows, not images
]


@pytest.mark.parametrize("tile", cv.TILES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_it_matches_the_float64_convolution(tile, case, residual):
    n, c, k, h, w, window, strides, dilations, pads = case
    torch.manual_seed(c + k)
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(k, c, *window) / (c * window[0] * window[1]) ** 0.5, torch.randn(k)
    out_hw = [(size + pads[i] + pads[i + 2] - dilations[i] * (window[i] - 1) - 1) // strides[i] + 1
              for i, size in enumerate((h, w))]  # fmt: skip
    z = torch.randn(n, k, *out_hw).contiguous(memory_format=torch.channels_last) if residual else None
    post = "HardSwish" if residual else ""
    out = torch.full((n, k, *out_hw), math.nan).contiguous(memory_format=torch.channels_last)
    conv = cv.DirectConv(weight, bias, strides, dilations, "Relu", post=post, tile=tile)
    got = conv(x, pads[:2], out_hw, z, out)
    assert got is out and not got.isnan().any()
    assert _error(got, _reference(x, weight, bias, pads, strides, dilations, z, "Relu", post)) <= BOUND


PARAMS = {
    "": [], "Relu": [], "Clip": [0.0, 6.0], "LeakyRelu": [0.1], "Sigmoid": [], "HardSigmoid": [1 / 6, 0.5],
    "HardSwish": [], "SiLU": [], "Gelu": [],
}  # fmt: skip


@pytest.mark.parametrize("act", cv.ACTIVATIONS)
def test_every_activation_before_and_after_a_residual(act):
    torch.manual_seed(3)
    x = torch.randn(1, 20, 6, 6).contiguous(memory_format=torch.channels_last) * 4  # the saturating parts too
    z = torch.randn(1, 24, 6, 6).contiguous(memory_format=torch.channels_last) * 3
    weight = torch.randn(24, 20, 3, 3) / 180**0.5
    params = tuple(activation_args(act, PARAMS[act])[1:]) if act else (0.0, 0.0)
    conv = F.conv2d(x.double(), weight.double(), None, 1, 1)
    got = cv.DirectConv(weight, None, pre=act, pre_params=params)(x, (1, 1), (6, 6))
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert _error(got, apply_activation(conv, act, PARAMS[act])) <= BOUND
    got = cv.DirectConv(weight, None, pre="Relu", post=act, post_params=params)(x, (1, 1), (6, 6), z)
    assert _error(got, apply_activation(torch.relu(conv) + z.double(), act, PARAMS[act])) <= BOUND


def test_a_channel_slice_and_an_nchw_input_are_read_as_given():
    """A channel slice of a channels_last tensor (a concatenation's part) is read through its strides; an NCHW
    input is made channels_last first."""
    torch.manual_seed(5)
    host = torch.randn(1, 48, 7, 9).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(32, 20, 3, 3) / 180**0.5
    conv = cv.DirectConv(weight)
    want = F.conv2d(host[:, 10:30].double(), weight.double(), None, 1, 1)
    assert _error(conv(host[:, 10:30], (1, 1), (7, 9)), want) <= BOUND
    assert _error(conv(host[:, 10:30].contiguous(), (1, 1), (7, 9)), want) <= BOUND


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c(torch.randn(1, 8, 5, 5, dtype=torch.float64), (1, 1), (5, 5)), "x must be a 4-D float32"),
        (lambda c: c(torch.randn(1, 9, 5, 5), (1, 1), (5, 5)), "x has 9 channels; this convolution takes 8"),
        (lambda c: c(torch.randn(1, 8, 5, 5), (1, 1), (5, 5), torch.randn(1, 16, 4, 4)), "residual must be"),
        (lambda c: c(torch.randn(1, 8, 5, 5), (1, 1), (5, 5), None, torch.empty(1, 16, 5, 5)), "out must be"),
    ],
)
def test_bad_operands_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call(cv.DirectConv(torch.randn(16, 8, 3, 3)))


def test_unknown_activations_and_tiles_are_refused():
    with pytest.raises(ValueError, match="no activation 'Mish'"):
        cv.DirectConv(torch.randn(16, 8, 3, 3), pre="Mish")
    with pytest.raises(ValueError, match="tiles"):
        cv.DirectConv(torch.randn(16, 8, 3, 3), tile=(4, 4))


def test_it_writes_into_a_channel_slice_and_nowhere_else():
    """Into channels 8 … 8+37 of a wider channels_last tensor (a concatenation's part): the slice gets the
    convolution, the channels around it keep their poison."""
    torch.manual_seed(6)
    x = torch.randn(2, 24, 9, 10).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(37, 24, 3, 3) / 216**0.5, torch.randn(37)
    host = torch.full((2, 64, 5, 5), math.nan).contiguous(memory_format=torch.channels_last)
    got = cv.DirectConv(weight, bias, (2, 2), pre="Relu")(x, (1, 1), (5, 5), None, host[:, 8:45])
    assert got.data_ptr() == host[:, 8:45].data_ptr()
    want = _reference(x, weight, bias, (1, 1, 1, 0), (2, 2), (1, 1), None, "Relu", "")
    assert _error(host[:, 8:45], want) <= BOUND
    assert host[:, :8].isnan().all() and host[:, 45:].isnan().all()


# -- bf16 ----------------------------------------------------------------------------------------------------------

bf16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
BF16_BOUND = 2.0**-8  # the output's one rounding to bf16 (half an ulp of 8 significant bits); float32 sums


@bf16
@pytest.mark.parametrize("tile", cv.TILES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_bf16_matches_the_float64_convolution_of_its_bf16_operands(tile, case, residual):
    """Odd channel counts (17) pair their last channel with a zero in every tap; padding taps read bf16 zeros; the
    4.2 MB weight case (2.1 MB in bf16) walks tiles outermost now."""
    n, c, k, h, w, window, strides, dilations, pads = case
    torch.manual_seed(c + k)
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last).bfloat16()
    weight, bias = (torch.randn(k, c, *window) / (c * window[0] * window[1]) ** 0.5).bfloat16(), torch.randn(k)
    out_hw = [(size + pads[i] + pads[i + 2] - dilations[i] * (window[i] - 1) - 1) // strides[i] + 1
              for i, size in enumerate((h, w))]  # fmt: skip
    z = torch.randn(n, k, *out_hw).contiguous(memory_format=torch.channels_last).bfloat16() if residual else None
    post = "HardSwish" if residual else ""
    out = torch.full((n, k, *out_hw), math.nan, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    got = cv.DirectConv(weight, bias, strides, dilations, "Relu", post=post, tile=tile)(x, pads[:2], out_hw, z, out)
    assert got is out and got.dtype == torch.bfloat16 and not got.isnan().any()
    want = _reference(x, weight, bias, pads, strides, dilations, z, "Relu", post)
    assert 0 < _error(got, want) <= BF16_BOUND  # (0: not rounded to bf16)


@bf16
def test_bf16_refuses_float32_operands_by_name():
    weight = torch.randn(24, 16, 3, 3).bfloat16()
    x = torch.randn(1, 16, 6, 6).contiguous(memory_format=torch.channels_last)
    conv = cv.DirectConv(weight)
    with pytest.raises(ValueError, match="x must be a 4-D bf16"):
        conv(x, (1, 1), (6, 6))
    with pytest.raises(ValueError, match="residual must be a bf16"):
        conv(x.bfloat16(), (1, 1), (6, 6), torch.randn(1, 24, 6, 6))
