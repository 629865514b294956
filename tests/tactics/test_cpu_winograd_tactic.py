"""`cpu.winograd`: a 3×3 one-group FusedConv at stride 1 through the autotuner and `build_layer_kernel` against the
reference tactic, and its reasons for declining."""

from __future__ import annotations

import math

import pytest
import torch

from tensorforge.kernels.cpu import winograd as wg
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.test_cpu_conv_tactic import _layer

WINOGRAD = "cpu.winograd"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or wg.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


@needs_kernel
@pytest.mark.parametrize(
    ("activation", "residual", "conv", "out_hw"),
    [
        ("Relu", False, {"pads": [1, 1, 1, 1]}, None),
        ("HardSwish", True, {"pads": [1, 1, 1, 1]}, None),
        ("", True, {"auto_pad": "SAME_UPPER"}, None),
        ("Sigmoid", False, {"pads": [0, 2, 1, 0]}, (8, 13)),
    ],
)
def test_the_autotuner_times_it_and_it_matches_the_reference(activation, residual, conv, out_hw):
    node, feeds = _layer(activation, residual, out_hw=out_hw, **conv)
    choice = autotune(node, 1, [feeds[0], None, None, *feeds[1:]], "cpu", effort=0, exhaustive=True)
    timed = [c for c in choice.candidates if c.tactic == WINOGRAD]
    assert {(c.config["m"], tuple(c.config["tile"])) for c in timed} == {
        (m, tile) for m in wg.TRANSFORMS for tile in wg.TILES
    }
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for layout in ("NHWC", "NCHW"):  # an NCHW input is made channels_last by the variant or the kernel
        feeds_in = [f.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else f for f in feeds]
        for c in timed:
            config = {"precision": "fp32", "layout": "NHWC", **c.config}
            got = build_layer_kernel(tactic_by_key(WINOGRAD), node, 1, CPU, config, {})(feeds_in)[0]
            assert got.is_contiguous(memory_format=torch.channels_last)
            assert relative_error(got, want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (lambda: _layer(kernel=1), "3×3 windows only, not 1×1"),
        (lambda: _layer(kernel=5, pads=[2, 2, 2, 2]), "3×3 windows only, not 5×5"),
        (lambda: _layer(pads=[1, 1, 1, 1], strides=[2, 2]), "strides of 1 only"),
        (lambda: _layer(pads=[2, 2, 2, 2], dilations=[2, 2]), "dilations of 1 only"),
        (lambda: _layer(group=2, pads=[1, 1, 1, 1]), "one group only"),
        (lambda: _layer("Mish", pads=[1, 1, 1, 1]), "no activation 'Mish'"),
    ],
)
def test_declines_what_the_kernel_does_not_run(layer, reason):
    node, _ = layer()
    assert reason in tactic_by_key(WINOGRAD).supports(node, 1, CPU)


def test_declines_off_the_cpu():
    node, _ = _layer(pads=[1, 1, 1, 1])
    assert tactic_by_key(WINOGRAD).supports(node, 1, torch.device("cuda")) == "a CPU kernel"
