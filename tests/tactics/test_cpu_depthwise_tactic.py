"""`cpu.depthwise`: a depthwise FusedConv through the autotuner and `build_layer_kernel` against the reference
tactic, its padding worked out per input size, and its reasons for declining."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tensorforge.kernels.cpu import depthwise as dw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import fused_conv

DEPTHWISE = "cpu.depthwise"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or dw.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _layer(activation="Relu", channels=24, group=None, kernel=3, residual=False, **conv):
    """The fused node of Conv (+ Add) (+ activation) on a [2, channels, 13, 13] input, and its inputs."""
    rng = np.random.default_rng(channels + kernel)
    group = channels if group is None else group
    w = rng.standard_normal((channels, channels // group, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    if "auto_pad" not in conv:
        conv.setdefault("pads", [kernel // 2] * 4)
    node = fused_conv((2, channels, 13, 13), w, b, (2, channels, 13, 13) if residual else None, activation,
                      group=group, **conv)  # fmt: skip
    torch.manual_seed(channels)
    x = torch.randn(2, channels, 13, 13) * 3
    return node, [x] + ([torch.randn(2, channels, *node.outputs[0].shape[2:])] if residual else [])


def _reference(node, feeds):
    return build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]


@needs_kernel
@pytest.mark.parametrize(
    ("activation", "conv"),
    [
        ("Relu", {}),
        ("HardSwish", {"strides": [2, 2]}),
        ("Clip", {"kernel": 5}),
        ("Sigmoid", {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),  # 13 by 2: one row of padding at the end only
        ("", {"pads": [0, 1, 2, 0], "dilations": [2, 2]}),
    ],
)
def test_the_autotuner_times_it_and_it_matches_the_reference(activation, conv):
    node, feeds = _layer(activation, **conv)
    choice = autotune(node, 1, [feeds[0], None, None], "cpu", effort=0, exhaustive=True)
    timed = [c for c in choice.candidates if c.tactic == DEPTHWISE]
    assert {c.config["tile"] for c in timed} == set(dw.TILES)
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    kernel = build_layer_kernel(tactic_by_key(DEPTHWISE), node, 1, CPU, {"precision": "fp32", "layout": "NHWC",
                                                                         "tile": dw.TILES[-1]}, {})  # fmt: skip
    got = kernel(feeds)[0]
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(got, _reference(node, feeds)) <= TOLERANCE["fp32"]
    smaller = [torch.randn(1, feeds[0].shape[1], 8, 6)]  # another input size: its own padding and output size
    assert relative_error(kernel(smaller)[0], _reference(node, smaller)) <= TOLERANCE["fp32"]


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (lambda: _layer(group=4), "not depthwise"),
        (lambda: _layer(residual=True), "residual"),
        (lambda: _layer("Mish"), "no activation 'Mish'"),
    ],
)
def test_declines_what_the_kernel_does_not_run(layer, reason):
    node, _ = layer()
    assert reason in tactic_by_key(DEPTHWISE).supports(node, 1, CPU)


def test_declines_off_the_cpu():
    node, _ = _layer()
    assert tactic_by_key(DEPTHWISE).supports(node, 1, torch.device("cuda")) == "a CPU kernel"
