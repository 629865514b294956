"""The patch convolution (patches copied into rows, the C++ 1×1 kernel over them) against a float64 convolution
whose stride is its window, on NCHW and channels_last inputs, with residuals and activations (built with the host's
compiler on first use, then cached; skipped where no compiler, ninja or vector ISA is found)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import patchify as pf
from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation

_PROBLEM = compiler_problem() or pw.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

BOUND = 1e-5  # max error over the max |output|, against float64: float32 sums of at most 768 terms


def _reference(x, w, b, z=None, pre="", pre_params=(), post="", post_params=()) -> torch.Tensor:
    y = apply_activation(F.conv2d(x.double(), w.double(), None if b is None else b.double(), w.shape[2:]), pre,
                         list(pre_params))  # fmt: skip
    return y if z is None else apply_activation(y + z.double(), post, list(post_params))


def _run(x, w, b, z=None, pre="", pre_params=(), post="", post_params=(), tile=None) -> torch.Tensor:
    conv = pf.PatchConv(w, b, pre, activation_args(pre, list(pre_params))[1:], post,
                        activation_args(post, list(post_params))[1:], tile)  # fmt: skip
    return conv(x, z)


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


# (N, C, H, W, K, window): ViT's 16×16 patches over three channels shrunk, trailing rows and columns that fill no
# window, one channel, a non-square window, output channels of partial vectors, ConvNeXt's 2×2 downsampling.
SHAPES = [
    (1, 3, 32, 48, 40, (16, 16)),
    (2, 3, 35, 30, 24, (4, 4)),
    (1, 1, 9, 8, 7, (3, 2)),
    (2, 24, 12, 14, 48, (2, 2)),
    (1, 5, 7, 21, 17, (1, 7)),
]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize(("n", "c", "h", "w", "k", "window"), SHAPES)
@pytest.mark.parametrize("tile", pw.ROW_TILES)
def test_shapes_from_either_layout_against_the_float64_convolution(n, c, h, w, k, window, layout, tile):
    torch.manual_seed(c + k + h)
    x = torch.randn(n, c, h, w).contiguous(memory_format=layout)
    weight, b = torch.randn(k, c, *window), torch.randn(k)
    got = _run(x, weight, b, pre="Relu", tile=tile)
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.isnan().any()
    assert got.shape == (n, k, h // window[0], w // window[1])
    assert _error(got, _reference(x, weight, b, pre="Relu")) <= BOUND


@pytest.mark.parametrize(("pre", "post"), [("", ""), ("Clip", ""), ("", "Relu"), ("Gelu", "HardSwish")])
def test_the_epilogue_with_a_residual_and_no_bias(pre, post):
    torch.manual_seed(1)
    x, weight = torch.randn(2, 6, 16, 12) * 3, torch.randn(20, 6, 4, 4) * 0.2
    z = torch.randn(2, 20, 4, 3)
    pre_params = (0.0, 6.0) if pre == "Clip" else ()
    got = _run(x, weight, None, z, pre, pre_params, post)
    assert _error(got, _reference(x, weight, None, z, pre, pre_params, post)) <= BOUND


def test_a_nan_reaches_exactly_the_outputs_of_its_patch():
    torch.manual_seed(2)
    x, weight, b = torch.randn(1, 3, 8, 8), torch.randn(16, 3, 4, 4), torch.randn(16)
    x[0, 1, 5, 2] = math.nan  # in the patch at row 1, column 0
    got = _run(x, weight, b)
    assert got.isnan().nonzero()[:, 2:].unique(dim=0).tolist() == [[1, 0]] and got.isnan().sum() == 16


def test_another_float_type_is_converted_first():
    torch.manual_seed(4)
    x, weight, b = torch.randn(1, 3, 12, 12, dtype=torch.float64), torch.randn(16, 3, 3, 3), torch.randn(16)
    got = _run(x, weight, b)
    assert got.dtype == torch.float32 and _error(got, _reference(x, weight, b)) <= BOUND


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: pf.PatchConv(torch.randn(16, 3, 4, 4), pre="Mish"), "Mish"),
        (lambda: pf.PatchConv(torch.randn(16, 3, 4, 4, dtype=torch.float64)), "float32 weight"),
        (lambda: pf.PatchConv(torch.randn(16, 3, 4, 4))(torch.randn(1, 4, 8, 8)), r"x must be \[N, 3, H, W\]"),
        (lambda: pf.PatchConv(torch.randn(16, 3, 4, 4))(torch.randn(1, 3, 3, 8)), "hold no 4 × 4 window"),
    ],
)
def test_bad_arguments_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()
