"""The C++ inverted-residual block (1×1 expansion, depthwise convolution, optional 1×1 projection; AVX-512) against
float64 convolutions with the same epilogues: both schedules (a ring of rows per thread, an image at a time), the
register-window and generic depthwise paths, residuals, channel slices, NaN reach, refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.cpu import expand_depthwise as ed
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or ed.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

BOUND = 2e-6  # normwise against float64: float32 sums of at most a few hundred terms


def _operands(n, c, ce, k, h, w, kernel, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    return (x, torch.randn(ce, c, 1, 1) / c**0.5, torch.randn(ce), torch.randn(ce, 1, *kernel) / 3, torch.randn(ce),
            torch.randn(k, ce, 1, 1) / ce**0.5, torch.randn(k))  # fmt: skip


def _reference(x, we, be, wd, bd, wp, bp, z, stride, pads, dilation):
    """Float64; for bf16 operands the expanded tensor and the depthwise output rounded to bf16, as the kernel holds
    them."""
    e = F.hardswish(F.conv2d(x.double(), we.double(), be.double())).to(x.dtype).double()
    padded = F.pad(e, (pads[1], pads[3], pads[0], pads[2]))
    d = F.relu(F.conv2d(padded, wd.double(), bd.double(), stride, 0, dilation, groups=wd.shape[0]))
    if wp is None:
        return d
    y = F.relu(F.conv2d(d.to(x.dtype).double(), wp.double(), bp.double()))
    return y if z is None else F.hardswish(y + z.double())


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


# (N, C, Ce, K, H, W, kernel, stride, pads (top, left, bottom, right), dilation): MobileNet's stride-2 112² block
# (rings), maps of few rows (an image at a time), 5×5 and 7×7 windows, an asymmetric window and padding,
# dilations (the generic depthwise path) in either schedule, channel counts no vector divides, two images.
CASES = [
    (1, 16, 64, 24, 112, 112, (3, 3), 2, (1, 1, 1, 1), 1),
    (2, 24, 72, 24, 13, 11, (3, 3), 1, (1, 1, 1, 1), 1),
    (1, 40, 120, 40, 9, 9, (5, 5), 1, (2, 2, 2, 2), 1),
    (1, 17, 50, 33, 7, 6, (5, 5), 2, (2, 2, 2, 2), 1),
    (2, 12, 40, 20, 30, 20, (7, 7), 2, (3, 3, 3, 3), 1),
    (1, 8, 24, 16, 17, 15, (5, 3), 1, (2, 0, 2, 2), 1),
    (1, 16, 32, 16, 20, 20, (3, 3), 1, (2, 2, 2, 2), 2),
    (1, 16, 32, 16, 48, 20, (3, 3), 1, (2, 2, 2, 2), 2),  # a dilated ring
]


@pytest.mark.parametrize("tile", ed.TILES)
@pytest.mark.parametrize("project", [True, False])
@pytest.mark.parametrize(("n", "c", "ce", "k", "h", "w", "kernel", "stride", "pads", "dilation"), CASES)
def test_matches_the_three_convolutions(tile, project, n, c, ce, k, h, w, kernel, stride, pads, dilation):
    x, we, be, wd, bd, wp, bp = _operands(n, c, ce, k, h, w, kernel, seed=n + c + ce)
    want = _reference(x, we, be, wd, bd, wp if project else None, bp, None, stride, pads, dilation)
    block = ed.ExpandDepthwise(we, be, "HardSwish", (0.0, 0.0), wd, bd, (stride, stride), (dilation, dilation),
                               "Relu", (0.0, 0.0), wp if project else None, bp if project else None, "Relu",
                               tile=tile)  # fmt: skip
    got = block(x, pads[:2], want.shape[2:])
    assert got.shape == want.shape and got.is_contiguous(memory_format=torch.channels_last)
    assert not got.isnan().any() and _error(got, want) <= BOUND


@pytest.mark.parametrize("h", [40, 6])  # rings, an image at a time
def test_a_residual_and_a_channel_slice_of_the_input(h):
    x, we, be, wd, bd, wp, bp = _operands(2, 24, 72, 24, h, 10, (3, 3), seed=h)
    host = torch.randn(2, 30, h, 10).contiguous(memory_format=torch.channels_last)
    host[:, 4:28] = x
    z = torch.randn(2, 24, h, 10)
    want = _reference(x, we, be, wd, bd, wp, bp, z, 1, (1, 1, 1, 1), 1)
    block = ed.ExpandDepthwise(we, be, "HardSwish", (0.0, 0.0), wd, bd, (1, 1), (1, 1), "Relu", (0.0, 0.0), wp, bp,
                               "Relu", post="HardSwish")  # fmt: skip
    assert _error(block(host[:, 4:28], (1, 1), (h, 10), z), want) <= BOUND


def test_a_nan_reaches_exactly_its_window():
    x, we, be, wd, bd, _, _ = _operands(1, 16, 32, 16, 12, 12, (3, 3), seed=3)
    x[0, 5, 6, 4] = math.nan
    block = ed.ExpandDepthwise(we, be, "HardSwish", (0.0, 0.0), wd, bd, (1, 1), (1, 1), "Relu", (0.0, 0.0))
    got = block(x, (1, 1), (12, 12))
    assert got[0, :, 5:8, 3:6].isnan().all() and got.isnan().sum() == 9 * 32


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda o: ed.ExpandDepthwise(o[1], o[2], "Mish", (0, 0), o[3], o[4], (1, 1), (1, 1), "", (0, 0)),
         "no activation 'Mish'"),
        (lambda o: ed.ExpandDepthwise(o[1], o[2], "", (0, 0), o[3][:8], o[4], (1, 1), (1, 1), "", (0, 0)),
         "does not read the expansion's 32 channels"),
        (lambda o: ed.ExpandDepthwise(o[1], o[2], "", (0, 0), o[3], o[4], (1, 1), (1, 1), "", (0, 0))(
            o[0][:, :8], (1, 1), (6, 6)), "x has 8 channels"),
        (lambda o: ed.ExpandDepthwise(o[1], o[2], "", (0, 0), o[3], o[4], (1, 1), (1, 1), "", (0, 0))(
            o[0], (1, 1), (6, 6), torch.randn(1, 32, 6, 6)), "a residual needs the projection"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_by_name(make, message):
    operands = _operands(1, 16, 32, 16, 6, 6, (3, 3))
    with pytest.raises(ValueError, match=message):
        make(operands)


# -- bf16 ----------------------------------------------------------------------------------------------------------

bf16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
# The output's one rounding to bf16 (half an ulp of 8 significant bits); the reference rounds E and the depthwise
# output as the kernel does, so only where float32 and float64 sums fall on either side of a bf16 rounding boundary
# do the later products read values an ulp apart (rare, one term each).
BF16_BOUND = 2.0**-8


def _bf16(x, we, be, wd, bd, wp, bp):
    """bf16 activations and weights (biases float32); the reference computes with these same values in float64."""
    return x.bfloat16(), we.bfloat16(), be, wd.bfloat16(), bd, wp.bfloat16(), bp


@bf16
@pytest.mark.parametrize("tile", ed.TILES)
@pytest.mark.parametrize("project", [True, False])
@pytest.mark.parametrize(("n", "c", "ce", "k", "h", "w", "kernel", "stride", "pads", "dilation"), CASES)
def test_bf16_matches_the_three_convolutions(tile, project, n, c, ce, k, h, w, kernel, stride, pads, dilation):
    x, we, be, wd, bd, wp, bp = _bf16(*_operands(n, c, ce, k, h, w, kernel, seed=n + c + ce))
    want = _reference(x, we, be, wd, bd, wp if project else None, bp, None, stride, pads, dilation)
    block = ed.ExpandDepthwise(we, be, "HardSwish", (0.0, 0.0), wd, bd, (stride, stride), (dilation, dilation),
                               "Relu", (0.0, 0.0), wp if project else None, bp if project else None, "Relu",
                               tile=tile)  # fmt: skip
    got = block(x, pads[:2], want.shape[2:])
    assert got.dtype == torch.bfloat16 and got.shape == want.shape and not got.isnan().any()
    assert 0 < _error(got, want) <= BF16_BOUND


@bf16
@pytest.mark.parametrize("h", [40, 6])  # rings, an image at a time
def test_bf16_a_residual_a_channel_slice_and_refusals(h):
    x, we, be, wd, bd, wp, bp = _bf16(*_operands(2, 24, 72, 24, h, 10, (3, 3), seed=h))
    host = torch.randn(2, 30, h, 10).contiguous(memory_format=torch.channels_last).bfloat16()
    host[:, 4:28] = x
    z = torch.randn(2, 24, h, 10).bfloat16()
    want = _reference(x, we, be, wd, bd, wp, bp, z, 1, (1, 1, 1, 1), 1)
    block = ed.ExpandDepthwise(we, be, "HardSwish", (0.0, 0.0), wd, bd, (1, 1), (1, 1), "Relu", (0.0, 0.0), wp, bp,
                               "Relu", post="HardSwish")  # fmt: skip
    assert _error(block(host[:, 4:28], (1, 1), (h, 10), z), want) <= BF16_BOUND
    with pytest.raises(ValueError, match="x must be a 4-D bf16"):
        block(x.float(), (1, 1), (h, 10), z)
    with pytest.raises(ValueError, match="residual must be a bf16"):
        block(x, (1, 1), (h, 10), z.float())
    with pytest.raises(ValueError, match="the projection weight is torch.float32"):
        ed.ExpandDepthwise(we, be, "", (0.0, 0.0), wd, bd, (1, 1), (1, 1), "", (0.0, 0.0), wp.float(), bp)
