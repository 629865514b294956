"""`cpu.depthwise-pointwise`: a DepthwisePointwise node (made by the fusion pass) through the autotuner and
`build_layer_kernel` against the reference tactic (with and without a residual, the input in either layout), and
its reasons for declining."""

from __future__ import annotations

import math

import pytest
import torch

from tensorforge.frontend import import_model
from tensorforge.kernels.cpu import depthwise_pointwise as dp
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.passes.test_cpu_blocks import KERNELS, SHAPE, _block

TACTIC = "cpu.depthwise-pointwise"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or dp.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _node(**block):
    model, _ = optimize(import_model(_block(**block)), device="cpu", cpu_kernels=KERNELS)
    (node,) = model.graph.nodes
    assert node.op_type == "DepthwisePointwise"
    return node


@needs_kernel
@pytest.mark.parametrize(("stride", "residual"), [(2, False), (1, True)])
def test_the_autotuner_times_it_and_it_matches_the_reference(stride, residual):
    node = _node(stride=stride, residual=residual)
    torch.manual_seed(stride)
    out_hw = (SHAPE[2] + 2 - 3) // stride + 1
    feeds = [torch.randn(*SHAPE) * 2] + ([torch.randn(2, 24, out_hw, out_hw)] if residual else [])
    choice = autotune(node, 1, [feeds[0], None, None, None, None, *feeds[1:]], "cpu", effort=0, exhaustive=True)
    timed = [c for c in choice.candidates if c.tactic == TACTIC]
    assert {tuple(c.config["tile"]) for c in timed} == set(dp.TILES)
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for layout in ("NHWC", "NCHW"):  # an NCHW input is made channels_last by the variant or the kernel
        moved = [f.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else f for f in feeds]
        config = {"precision": "fp32", "layout": "NHWC", "tile": list(dp.TILES[-1])}
        got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, config, {})(moved)[0]
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert relative_error(got, want) <= TOLERANCE["fp32"]


def test_declines_off_the_cpu_and_activations_the_kernel_lacks():
    node = _node()
    tactic = tactic_by_key(TACTIC)
    assert tactic.supports(node, 1, torch.device("cuda")) == "a CPU kernel"
    node.attributes["post"] = "Mish"
    assert "no activation 'Mish'" in tactic.supports(node, 1, CPU)
