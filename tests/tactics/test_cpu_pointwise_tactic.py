"""`cpu.pointwise`: a 1×1 FusedConv through the autotuner and `build_layer_kernel` against the reference tactic
(with and without a residual, the input in either layout), and its reasons for declining."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import fused_conv

POINTWISE = "cpu.pointwise"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or pw.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _layer(activation="Relu", residual=False, kernel=1, c=24, k=40, hw=(9, 11), **conv):
    """The fused node of Conv (+ Add) (+ activation) on a [2, c, *hw] input, and its non-constant inputs."""
    rng = np.random.default_rng(c + k)
    w = rng.standard_normal((k, c // conv.get("group", 1), kernel, kernel)).astype(np.float32) / c**0.5
    b = rng.standard_normal(k).astype(np.float32)
    node = fused_conv((2, c, *hw), w, b, (2, k, *hw) if residual else None, activation, **conv)
    torch.manual_seed(c + k)
    return node, [torch.randn(2, c, *hw)] + ([torch.randn(2, k, *hw)] if residual else [])


@needs_kernel
@pytest.mark.parametrize(
    ("activation", "residual", "conv"),
    [("Relu", False, {}), ("HardSwish", True, {}), ("", True, {}), ("Sigmoid", False, {"auto_pad": "SAME_UPPER"})],
)
def test_the_autotuner_times_it_and_it_matches_the_reference(activation, residual, conv):
    node, feeds = _layer(activation, residual, **conv)
    choice = autotune(node, 1, [feeds[0], None, None, *feeds[1:]], "cpu", effort=0, exhaustive=True)
    timed = [c for c in choice.candidates if c.tactic == POINTWISE]
    assert {tuple(c.config["tile"]) for c in timed} == set(pw.TILES)
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for layout in ("NHWC", "NCHW"):  # an NCHW input is made channels_last by the variant or the kernel
        feeds_in = [f.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else f for f in feeds]
        config = {"precision": "fp32", "layout": "NHWC", "tile": list(pw.TILES[1])}
        got = build_layer_kernel(tactic_by_key(POINTWISE), node, 1, CPU, config, {})(feeds_in)[0]
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert relative_error(got, want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (lambda: _layer(kernel=3, pads=[1, 1, 1, 1]), "1×1 convolutions only"),
        (lambda: _layer(strides=[2, 2]), "stride 1 only"),
        (lambda: _layer(pads=[1, 1, 1, 1]), "no padding"),
        (lambda: _layer(group=2), "one group only"),
        (lambda: _layer("Mish"), "no activation 'Mish'"),
    ],
)
def test_declines_what_the_kernel_does_not_run(layer, reason):
    node, _ = layer()
    assert reason in tactic_by_key(POINTWISE).supports(node, 1, CPU)


def test_declines_off_the_cpu():
    node, _ = _layer()
    assert tactic_by_key(POINTWISE).supports(node, 1, torch.device("cuda")) == "a CPU kernel"
