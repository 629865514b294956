"""The C++ stem convolution (AVX-512) against a float64 convolution with the fused activation, on NCHW and
channels_last inputs (built with the host's compiler on first use, then cached; skipped where no compiler, ninja
or AVX-512 is found)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import stem_conv as st
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation

_PROBLEM = compiler_problem() or st.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

BOUND = 1e-5  # normwise against float64: float32 sums of at most 196 terms, exponentials within 2 ulp


def _reference(x, w, b, strides, pads, dilations, act, params) -> torch.Tensor:
    top, left, bottom, right = pads
    y = F.conv2d(F.pad(x.double(), (left, right, top, bottom)), w.double(), None if b is None else b.double(),
                 strides, 0, dilations)  # fmt: skip
    return apply_activation(y, act, params)


def _run(x, w, b, strides, pads, dilations, act="", params=()) -> torch.Tensor:
    kernel = w.shape[2:]
    out_hw = [
        (x.shape[2 + i] + pads[i] + pads[i + 2] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in (0, 1)
    ]
    conv = st.StemConv(w, b, strides, dilations, act, activation_args(act, params)[1:])
    return conv(x, pads[:2], out_hw)


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


# (N, C, H, W, K, kernel, strides, pads, dilations): MobileNet's and EfficientNet's 3×3 stride-2 RGB stems shrunk,
# ResNet's 7×7, one and four channels, output channels of one to five vectors whole and partial, asymmetric and no
# padding, dilation, maps narrower than a tile.
SHAPES = [
    (1, 3, 30, 31, 16, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (2, 3, 23, 20, 32, 3, (2, 2), (0, 0, 1, 1), (1, 1)),
    (1, 3, 29, 29, 64, 7, (2, 2), (3, 3, 3, 3), (1, 1)),
    (1, 1, 13, 11, 40, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 4, 12, 14, 24, 5, (1, 2), (2, 2, 2, 2), (1, 1)),
    (1, 3, 9, 9, 8, 3, (1, 1), (0, 0, 0, 0), (2, 2)),
    (1, 2, 5, 3, 72, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 3, 12, 30, 16, 3, (1, 1), (3, 2, 1, 2), (2, 2)),  # dilated tap rows above the input: one loop from the first
]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize(("n", "c", "h", "w", "k", "kernel", "strides", "pads", "dilations"), SHAPES)
def test_shapes_from_either_layout_against_the_float64_convolution(
    n, c, h, w, k, kernel, strides, pads, dilations, layout
):  # fmt: skip
    torch.manual_seed(c + k + h)
    x = torch.randn(n, c, h, w).contiguous(memory_format=layout)
    weight, b = torch.randn(k, c, kernel, kernel), torch.randn(k)
    got = _run(x, weight, b, strides, pads, dilations, "Relu")
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.isnan().any()
    assert _error(got, _reference(x, weight, b, strides, pads, dilations, "Relu", [])) <= BOUND


@pytest.mark.parametrize("act", ["", "Clip", "HardSwish", "SiLU", "Sigmoid"])
def test_activations_and_no_bias(act):
    torch.manual_seed(1)
    x, weight = torch.randn(1, 3, 16, 16) * 3, torch.randn(24, 3, 3, 3)
    params = [0.0, 6.0] if act == "Clip" else []
    got = _run(x, weight, None, (2, 2), (1, 1, 1, 1), (1, 1), act, params)
    assert _error(got, _reference(x, weight, None, (2, 2), (1, 1, 1, 1), (1, 1), act, params)) <= BOUND


def test_a_nan_reaches_exactly_the_outputs_whose_window_holds_it():
    torch.manual_seed(2)
    x, weight, b = torch.randn(1, 3, 10, 10), torch.randn(16, 3, 3, 3), torch.randn(16)
    x[0, 1, 4, 4] = math.nan
    got = _run(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1))
    want = _reference(x, weight, b, (1, 1), (1, 1, 1, 1), (1, 1), "", [])
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 9 * 16


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: st.StemConv(torch.randn(16, 3, 3, 3), act="Mish"), "no activation 'Mish'"),
        (lambda: st.StemConv(torch.randn(16, 8, 3, 3)), "at most 4 input channels"),
        (
            lambda: st.StemConv(torch.randn(16, 3, 3, 3))(torch.ones(1, 3, 8, 8, dtype=torch.int32), (1, 1), (8, 8)),
            "4-D tensor of floats",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_another_float_type_is_converted_first():
    torch.manual_seed(4)
    x, weight, b = torch.randn(1, 3, 12, 12, dtype=torch.float64), torch.randn(16, 3, 3, 3), torch.randn(16)
    got = _run(x, weight, b, (2, 2), (1, 1, 1, 1), (1, 1))
    assert got.dtype == torch.float32
    assert _error(got, _reference(x, weight, b, (2, 2), (1, 1, 1, 1), (1, 1), "", [])) <= BOUND
