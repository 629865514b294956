"""The C++ depthwise + 1×1 block (AVX-512) against the two float64 convolutions with their epilogues (built with
the host's compiler on first use, then cached; skipped where no compiler, ninja, AVX-512 or AVX2 is found)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import depthwise_pointwise as dp
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or dp.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

BOUND = 2e-6  # normwise against float64: float32 sums of at most a few hundred terms, exponentials within 2 ulp
ACTIVATIONS = {
    "": [], "Relu": [], "Clip": [0.0, 6.0], "LeakyRelu": [0.1], "Sigmoid": [], "HardSigmoid": [1 / 6, 0.5],
    "HardSwish": [], "SiLU": [], "Gelu": [],
}  # fmt: skip


def _operands(n, c, k, h, w, kernel, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    wd = torch.randn(c, 1, *kernel) / math.prod(kernel) ** 0.5
    return x, wd, torch.randn(c), torch.randn(k, c, 1, 1) / c**0.5, torch.randn(k)


def _reference(x, wd, bd, wp, bp, z, strides, pads, dilations, acts):
    """Float64: the depthwise convolution (ONNX pads top, left, bottom, right) and its activation, then the 1×1
    with its pre activation, the residual and the post activation. For bf16 operands the depthwise output is rounded
    to bf16 between the two, as the kernel's row buffer holds it."""
    (act, act_params), (pre, pre_params), (post, post_params) = acts
    top, left, bottom, right = pads
    padded = F.pad(x.double(), (left, right, top, bottom))
    h = F.conv2d(padded, wd.double(), None if bd is None else bd.double(), strides, 0, dilations, x.shape[1])
    h = apply_activation(h, act, act_params).to(x.dtype).double()
    y = apply_activation(F.conv2d(h, wp.double(), bp.double()), pre, pre_params)
    return y if z is None else apply_activation(y + z.double(), post, post_params)


def _run(x, wd, bd, wp, bp, z, strides, pads, dilations, acts, tile=None, out=None):
    kernel = tuple(wd.shape[2:])
    out_hw = [
        (x.shape[2 + i] + pads[i] + pads[i + 2] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in (0, 1)
    ]
    if out is None:  # poisoned: every element must be written
        out = torch.full((x.shape[0], wp.shape[0], *out_hw), math.nan, dtype=x.dtype)
        out = out.contiguous(memory_format=torch.channels_last)
    (act, act_params), (pre, pre_params), (post, post_params) = acts
    block = dp.DepthwisePointwise(
        wd, bd, strides, dilations, act, activation_args(act, act_params)[1:], wp, bp,
        pre, activation_args(pre, pre_params)[1:], post, activation_args(post, post_params)[1:], tile,
    )  # fmt: skip
    return block(x, pads[:2], out_hw, z, out)


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


RELU6 = (("Clip", [0.0, 6.0]), ("", []), ("", []))
# (N, C, K, H, W, kernel, stride, pads, dilation): MobileNet's 3×3 and 5×5 at stride 1 and 2, a 7×7, maps narrower
# than a tile and rows no tile divides, channel counts of partial vectors in and out, two images, a dilated and an
# asymmetric window (the generic path).
SHAPES = [
    (1, 16, 16, 12, 12, (3, 3), 1, (1, 1, 1, 1), 1), (1, 64, 24, 15, 15, (3, 3), 2, (1, 1, 1, 1), 1),
    (1, 72, 40, 9, 11, (5, 5), 2, (2, 2, 2, 2), 1), (2, 120, 40, 7, 7, (5, 5), 1, (2, 2, 2, 2), 1),
    (1, 20, 33, 5, 3, (3, 3), 1, (1, 1, 1, 1), 1), (1, 40, 80, 10, 10, (7, 7), 2, (3, 3, 3, 3), 1),
    (1, 24, 100, 13, 17, (3, 3), 1, (2, 2, 2, 2), 2), (1, 32, 48, 8, 9, (3, 1), 1, (1, 0, 0, 1), 1),
]  # fmt: skip


@pytest.mark.parametrize("tile", dp.TILES)
@pytest.mark.parametrize(("n", "c", "k", "h", "w", "kernel", "stride", "pads", "dilation"), SHAPES)
def test_shapes_against_the_float64_convolutions(n, c, k, h, w, kernel, stride, pads, dilation, tile):
    x, wd, bd, wp, bp = _operands(n, c, k, h, w, kernel, seed=c + k)
    args = ([stride] * 2, pads, [dilation] * 2, RELU6)
    got = _run(x, wd, bd, wp, bp, None, *args, tile=tile)
    assert not got.isnan().any()
    assert _error(got, _reference(x, wd, bd, wp, bp, None, *args)) <= BOUND


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_every_activation_in_each_place_with_a_residual(act):
    x, wd, bd, wp, bp = _operands(1, 24, 40, 6, 7, (3, 3), seed=2)
    x = x * 4  # reach the saturating parts of Clip, HardSigmoid, HardSwish and the exponentials' tails
    z = torch.randn(1, 40, 6, 7).contiguous(memory_format=torch.channels_last) * 3
    params = ACTIVATIONS[act]
    for acts in (((act, params), ("", []), ("", [])), (("Relu", []), (act, params), ("Relu", [])),
                 (("", []), ("", []), (act, params))):  # fmt: skip
        args = ([1, 1], (1, 1, 1, 1), [1, 1], acts)
        assert _error(_run(x, wd, bd, wp, bp, z, *args), _reference(x, wd, bd, wp, bp, z, *args)) <= BOUND


def test_without_biases():
    x, wd, _, wp, _ = _operands(2, 32, 48, 5, 5, (3, 3), seed=4)
    args = ([1, 1], (1, 1, 1, 1), [1, 1], RELU6)
    got = _run(x, wd, None, wp, None, None, *args)
    assert _error(got, _reference(x, wd, None, wp, torch.zeros(48), None, *args)) <= BOUND


def test_reads_and_writes_channel_slices_of_larger_tensors():
    """Input, residual and output each a channel slice of a channels_last tensor: read and written through their
    strides, the output's neighbouring channels untouched."""
    torch.manual_seed(6)
    x = torch.randn(2, 50, 6, 7).contiguous(memory_format=torch.channels_last)[:, 10:30]
    z = torch.randn(2, 60, 6, 7).contiguous(memory_format=torch.channels_last)[:, 5:45]
    wd, bd, wp, bp = torch.randn(20, 1, 3, 3), torch.randn(20), torch.randn(40, 20, 1, 1) / 5, torch.randn(40)
    host = torch.full((2, 44, 6, 7), 7.0).contiguous(memory_format=torch.channels_last)
    out = host[:, 2:42]
    args = ([1, 1], (1, 1, 1, 1), [1, 1], RELU6)
    _run(x, wd, bd, wp, bp, z, *args, out=out)
    assert _error(out, _reference(x, wd, bd, wp, bp, z, *args)) <= BOUND
    assert (host[:, :2] == 7.0).all() and (host[:, 42:] == 7.0).all()


def test_a_nan_reaches_exactly_the_pixels_whose_window_holds_it():
    x, wd, bd, wp, bp = _operands(1, 16, 24, 6, 6, (3, 3), seed=8)
    x[0, 3, 2, 1] = math.nan
    args = ([1, 1], (1, 1, 1, 1), [1, 1], (("", []), ("", []), ("", [])))
    got = _run(x, wd, bd, wp, bp, None, *args)
    want = _reference(x, wd, bd, wp, bp, None, *args)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 9 * 24
    assert _error(got.nan_to_num(), want.nan_to_num()) <= BOUND


def test_nchw_operands_are_made_channels_last_and_a_new_output_returned():
    x, wd, bd, wp, bp = _operands(2, 20, 24, 5, 6, (3, 3), seed=10)
    z = torch.randn(2, 24, 5, 6)
    block = dp.DepthwisePointwise(wd, bd, [1, 1], [1, 1], "Relu", (0.0, 0.0), wp, bp, post="Relu")
    got = block(x.contiguous(), (1, 1), (5, 6), z)
    assert got.is_contiguous(memory_format=torch.channels_last)
    acts = (("Relu", []), ("", []), ("Relu", []))
    assert _error(got, _reference(x, wd, bd, wp, bp, z, [1, 1], (1, 1, 1, 1), [1, 1], acts)) <= BOUND


def _block(wd, wp, **kwargs):
    return dp.DepthwisePointwise(wd, None, [1, 1], [1, 1], kwargs.pop("act", ""), (0.0, 0.0), wp, **kwargs)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda wd, wp, x: _block(wd, wp, act="Mish"), "no activation 'Mish'"),
        (lambda wd, wp, x: _block(wd, wp, post="Mish"), "no activation 'Mish'"),
        (lambda wd, wp, x: _block(wd, wp, tile=(4, 4)), "tiles"),
        (lambda wd, wp, x: _block(wd, wp[:, :8]), "does not read the depthwise convolution's 16 channels"),
        (lambda wd, wp, x: _block(wd, wp)(x.double(), (1, 1), (5, 5)), "x must be a 4-D float32"),
        (lambda wd, wp, x: _block(wd, wp)(x[:, :8], (1, 1), (5, 5)), "x has 8 channels"),
        (lambda wd, wp, x: _block(wd, wp)(x, (1, 1, 1, 1), (5, 5)), r"pads \(top, left\)"),
        (lambda wd, wp, x: _block(wd, wp)(x, (1, 1), (5, 5), torch.randn(1, 24, 4, 4)), "residual must be"),
        (lambda wd, wp, x: _block(wd, wp)(x, (1, 1), (5, 5), None, torch.empty(1, 24, 5, 4)), "out must be"),
    ],
)
def test_bad_arguments_are_refused_by_name(make, message):
    x, wd, _, wp, _ = _operands(1, 16, 24, 5, 5, (3, 3))
    with pytest.raises(ValueError, match=message):
        make(wd, wp, x)


# -- bf16 ----------------------------------------------------------------------------------------------------------

bf16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
# The output's one rounding to bf16 (half an ulp of 8 significant bits); the reference rounds the depthwise output
# as the kernel does, so only where float32 and float64 sums fall on either side of a bf16 rounding boundary do the
# two 1×1 products read values an ulp apart (rare, and one term of C).
BF16_BOUND = 2.0**-8


def _bf16(x, wd, bd, wp, bp):
    """bf16 activations and weights (biases float32); the reference computes with these same values in float64."""
    return x.bfloat16(), wd.bfloat16(), bd, wp.bfloat16(), bp


@bf16
@pytest.mark.parametrize("tile", dp.TILES)
@pytest.mark.parametrize(("n", "c", "k", "h", "w", "kernel", "stride", "pads", "dilation"), SHAPES)
def test_bf16_shapes_with_a_residual(n, c, k, h, w, kernel, stride, pads, dilation, tile):
    x, wd, bd, wp, bp = _bf16(*_operands(n, c, k, h, w, kernel, seed=c + k))
    args = ([stride] * 2, pads, [dilation] * 2, (("Clip", [0.0, 6.0]), ("", []), ("Relu", [])))
    out_hw = [(size + pads[i] + pads[i + 2] - (kernel[i] - 1) * dilation - 1) // stride + 1 for i, size in
              enumerate((h, w))]  # fmt: skip
    z = torch.randn(n, k, *out_hw).contiguous(memory_format=torch.channels_last).bfloat16()
    got = _run(x, wd, bd, wp, bp, z, *args, tile=tile)
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    assert 0 < _error(got, _reference(x, wd, bd, wp, bp, z, *args)) <= BF16_BOUND


@bf16
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_bf16_every_activation_in_each_place(act):
    x, wd, bd, wp, bp = _bf16(*_operands(1, 24, 40, 6, 7, (3, 3), seed=2))
    x = x * 4
    z = (torch.randn(1, 40, 6, 7).contiguous(memory_format=torch.channels_last) * 3).bfloat16()
    params = ACTIVATIONS[act]
    for acts in (((act, params), ("", []), ("", [])), (("Relu", []), (act, params), ("Relu", [])),
                 (("", []), ("", []), (act, params))):  # fmt: skip
        args = ([1, 1], (1, 1, 1, 1), [1, 1], acts)
        assert _error(_run(x, wd, bd, wp, bp, z, *args), _reference(x, wd, bd, wp, bp, z, *args)) <= BF16_BOUND


@bf16
def test_bf16_channel_slices_in_and_out_and_refusals():
    torch.manual_seed(6)
    x = torch.randn(2, 50, 6, 7).contiguous(memory_format=torch.channels_last).bfloat16()[:, 10:30]
    wd, wp = torch.randn(20, 1, 3, 3).bfloat16(), (torch.randn(40, 20, 1, 1) / 5).bfloat16()
    bd, bp = torch.randn(20), torch.randn(40)
    host = torch.full((2, 44, 6, 7), math.nan, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    args = ([1, 1], (1, 1, 1, 1), [1, 1], RELU6)
    _run(x, wd, bd, wp, bp, None, *args, out=host[:, 2:42])
    assert _error(host[:, 2:42], _reference(x, wd, bd, wp, bp, None, *args)) <= BF16_BOUND
    assert host[:, :2].isnan().all() and host[:, 42:].isnan().all()
    with pytest.raises(ValueError, match="x must be a 4-D bf16"):
        _run(x.float(), wd, bd, wp, bp, None, *args)
    with pytest.raises(ValueError, match="residual must be a bf16"):
        _run(x, wd, bd, wp, bp, torch.randn(2, 40, 6, 7), *args)
