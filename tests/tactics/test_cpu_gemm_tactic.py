"""`cpu.gemm`: a FusedGemm with a constant weight through the autotuner and `build_layer_kernel` against the reference
tactic (Gemm and MatMul, either weight orientation, batches of rows, a residual, a single row as a classifier has at
batch 1), and its reasons for declining."""

from __future__ import annotations

import math

import pytest
import torch

from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import fused_gemm

GEMM = "cpu.gemm"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or pw.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


@needs_kernel
@pytest.mark.parametrize(
    ("x_shape", "activation", "trans_b", "residual", "matmul", "n"),
    [
        ([1, 96], "HardSwish", False, False, False, 150),  # one row, a last partial vector and a narrower block
        ([1, 64], "", True, False, False, 1000),
        ([5, 40], "Relu", True, False, False, 24),
        ([2, 7, 32], "Sigmoid", False, False, True, 40),
        ([2, 7, 32], "", False, True, True, 136),
    ],
)
def test_the_autotuner_times_it_and_it_matches_the_reference(x_shape, activation, trans_b, residual, matmul, n):
    node, feeds = fused_gemm(x_shape, activation, trans_b, residual, matmul, n)
    inputs = [feeds[0], None, None, *feeds[1:]]  # by input position
    choice = autotune(node, 1, inputs, "cpu", effort=0, exhaustive=True)
    timed = [c for c in choice.candidates if c.tactic == GEMM]
    assert {tuple(c.config["tile"]) for c in timed} == set(pw.TILES)
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for tile in pw.TILES:
        kernel = build_layer_kernel(tactic_by_key(GEMM), node, 1, CPU, {"precision": "fp32", "tile": list(tile)}, {})
        got = kernel(feeds)[0]
        assert got.shape == want.shape
        assert relative_error(got, want) <= TOLERANCE["fp32"], tile


def test_declines_what_the_kernel_does_not_run():
    tactic = tactic_by_key(GEMM)
    node, _ = fused_gemm([4, 16], "Mish")
    assert "no activation 'Mish'" in tactic.supports(node, 1, CPU)
    node, _ = fused_gemm([4096, 512], n=2048)
    assert tactic.supports(node, 1, CPU) == _PROBLEM  # products of any size (docs/design.md, "CPU graphs")
    node, _ = fused_gemm([4, 16])
    assert tactic.supports(node, 1, torch.device("cuda")) == "a CPU kernel"
    node.attributes["alpha"] = 2.0
    assert tactic.supports(node, 1, CPU) == "no transA, alpha or beta"
