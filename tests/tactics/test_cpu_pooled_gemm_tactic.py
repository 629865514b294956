"""`cpu.pooled-gemm`: a PooledGemm (a classifier's head fused by `passes.cpu_blocks`) through the autotuner and
`build_layer_kernel` against the reference tactic, either weight orientation, and its reasons for declining."""

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
from tests.passes.test_cpu_blocks import KERNELS, _head

POOLED = "cpu.pooled-gemm"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or pw.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _node(**head):
    model, _ = optimize(import_model(_head(**head)), device="cpu", cpu_kernels=KERNELS)
    (node,) = model.graph.nodes
    assert node.op_type == "PooledGemm"
    return node


@needs_kernel
@pytest.mark.parametrize("trans_b", [1, 0])
def test_the_autotuner_times_it_and_it_matches_the_reference(trans_b):
    node = _node(trans_b=trans_b)
    torch.manual_seed(trans_b)
    feeds = [torch.randn(2, 16, 5, 5)]
    choice = autotune(node, 1, [feeds[0], None, None], "cpu", effort=0, exhaustive=True)
    timed = [c for c in choice.candidates if c.tactic == POOLED]
    assert {tuple(c.config["tile"]) for c in timed} == set(pw.TILES)
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for layout in ("NCHW", "NHWC"):
        x = feeds[0].contiguous(memory_format=torch.channels_last) if layout == "NHWC" else feeds[0]
        config = {"precision": "fp32", "tile": list(pw.TILES[-1])}
        got = build_layer_kernel(tactic_by_key(POOLED), node, 1, CPU, config, {})([x])[0]
        assert got.shape == want.shape == (2, 24)
        assert relative_error(got, want) <= TOLERANCE["fp32"]


def test_declines_off_the_cpu_and_activations_the_kernel_lacks():
    node = _node()
    tactic = tactic_by_key(POOLED)
    assert tactic.supports(node, 1, torch.device("cuda")) == "a CPU kernel"
    node.attributes["pre"] = "Tanh"
    assert "no activation 'Tanh'" in tactic.supports(node, 1, CPU)
