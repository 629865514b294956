"""`cpu.conv`: a one-group FusedConv (3×3, strided, padded, with a residual) through the autotuner and
`build_layer_kernel` against the reference tactic, and its reasons for declining."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tensorforge.kernels.cpu import conv as cv
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import fused_conv

CONV = "cpu.conv"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or cv.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _layer(activation="Relu", residual=False, kernel=3, c=24, k=40, hw=(9, 11), out_hw=None, **conv):
    """The fused node of Conv (+ Add) (+ activation) on a [2, c, *hw] input, and its non-constant inputs."""
    rng = np.random.default_rng(c + k)
    w = rng.standard_normal((k, c // conv.get("group", 1), kernel, kernel)).astype(np.float32) / (c * kernel**2) ** 0.5
    b = rng.standard_normal(k).astype(np.float32)
    out_hw = out_hw or hw
    node = fused_conv((2, c, *hw), w, b, (2, k, *out_hw) if residual else None, activation, **conv)
    torch.manual_seed(c + k)
    return node, [torch.randn(2, c, *hw)] + ([torch.randn(2, k, *out_hw)] if residual else [])


@needs_kernel
@pytest.mark.parametrize(
    ("activation", "residual", "conv", "out_hw"),
    [
        ("Relu", False, {"pads": [1, 1, 1, 1]}, None),
        ("HardSwish", True, {"pads": [1, 1, 1, 1]}, None),
        ("LeakyRelu", False, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, None),
        ("", True, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (5, 6)),
        ("Sigmoid", False, {"pads": [0, 2, 1, 0], "dilations": [2, 1]}, None),
    ],
)
def test_the_autotuner_times_it_and_it_matches_the_reference(activation, residual, conv, out_hw):
    node, feeds = _layer(activation, residual, out_hw=out_hw, **conv)
    choice = autotune(node, 1, [feeds[0], None, None, *feeds[1:]], "cpu", effort=0, exhaustive=True)
    timed = [c for c in choice.candidates if c.tactic == CONV]
    assert {tuple(c.config["tile"]) for c in timed} == set(cv.TILES)
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for layout in ("NHWC", "NCHW"):  # an NCHW input is made channels_last by the variant or the kernel
        feeds_in = [f.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else f for f in feeds]
        for tile in cv.TILES:
            config = {"precision": "fp32", "layout": "NHWC", "tile": list(tile)}
            got = build_layer_kernel(tactic_by_key(CONV), node, 1, CPU, config, {})(feeds_in)[0]
            assert got.is_contiguous(memory_format=torch.channels_last)
            assert relative_error(got, want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (lambda: _layer(kernel=1), "a 1×1 convolution at stride 1 without padding: cpu.pointwise runs it"),
        (lambda: _layer(group=2, pads=[1, 1, 1, 1]), "one group only"),
        (lambda: _layer(c=3, pads=[1, 1, 1, 1]), "3 input channels: a stem, for cpu.stem-conv"),
        (lambda: _layer("Mish", pads=[1, 1, 1, 1]), "no activation 'Mish'"),
    ],
)
def test_declines_what_the_kernel_does_not_run(layer, reason):
    node, _ = layer()
    assert reason in tactic_by_key(CONV).supports(node, 1, CPU)


def test_takes_a_strided_one_by_one_convolution():
    """A 1×1 convolution at stride 2 (a ResNet downsampling) is its to run; only the unit one goes to the 1×1
    kernel."""
    node, _ = _layer(kernel=1, strides=[2, 2])
    assert tactic_by_key(CONV).supports(node, 1, CPU) in (None, _PROBLEM)


def test_declines_off_the_cpu():
    node, _ = _layer(pads=[1, 1, 1, 1])
    assert tactic_by_key(CONV).supports(node, 1, torch.device("cuda")) == "a CPU kernel"
