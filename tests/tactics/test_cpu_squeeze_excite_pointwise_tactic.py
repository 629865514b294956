"""`cpu.squeeze-excite-pointwise`: a SqueezeExcitePointwise node (made by the CPU block fusion) through the autotuner
and `build_layer_kernel` against the reference tactic (with and without a residual), and its reasons for
declining."""

from __future__ import annotations

import math

import pytest
import torch

from tensorforge.frontend import import_model
from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.passes.test_cpu_blocks import KERNELS, SHAPE, _se_block

TACTIC = "cpu.squeeze-excite-pointwise"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or pw.problem()


def _node(**block):
    model, _ = optimize(import_model(_se_block(**block)), device="cpu", cpu_kernels=KERNELS)
    (node,) = model.graph.nodes
    assert node.op_type == "SqueezeExcitePointwise"
    return node


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
@pytest.mark.parametrize("residual", [False, True])
def test_the_autotuner_times_it_and_it_matches_the_reference(residual):
    node = _node(residual=residual)
    torch.manual_seed(3)
    feeds = [torch.randn(*SHAPE) * 2] + ([torch.randn(2, 24, *SHAPE[2:])] if residual else [])
    choice = autotune(node, 1, [feeds[0], *[None] * 6, *feeds[1:]], "cpu", effort=0)
    timed = [c for c in choice.candidates if c.tactic == TACTIC]
    assert {tuple(c.config["tile"]) for c in timed} == set(pw.TILES)
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    config = {"precision": "fp32", "layout": "NHWC", "tile": list(pw.TILES[0])}
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, config, {})(feeds)[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]


def test_declines_off_the_cpu_and_activations_the_kernels_lack():
    node = _node()
    tactic = tactic_by_key(TACTIC)
    assert tactic.supports(node, 1, torch.device("cuda")) == "a CPU kernel"
    node.attributes["pre"] = "Mish"
    assert "no pre 'Mish'" in tactic.supports(node, 1, CPU)
