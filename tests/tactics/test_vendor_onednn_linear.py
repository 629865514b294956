"""The oneDNN linear tactic for FusedGemm on the CPU: against the reference over its epilogues and layouts, and
what it declines."""

import math

import pytest
import torch

from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import fused_gemm

TACTIC = "vendor.onednn-linear"
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("x_shape", "activation", "trans_b", "residual", "matmul"),
    [
        ([2, 7, 32], "Gelu", False, False, True),
        ([5, 32], "Relu", True, False, False),
        ([3, 32], "", True, False, False),
        ([2, 7, 32], "", False, True, True),
    ],
)
def test_onednn_linear_matches_the_reference(x_shape, activation, trans_b, residual, matmul):
    node, feeds = fused_gemm(x_shape, activation, trans_b, residual, matmul)
    choice = autotune(node, 1, [feeds[0], None, None, *feeds[1:]], "cpu", effort=0)  # by input position
    ours = next(c for c in choice.candidates if c.tactic == TACTIC)
    assert math.isfinite(ours.median_ms), ours.note
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, ours.config, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    assert got.shape == want.shape and relative_error(got, want) <= 1e-5


def test_onednn_linear_declines_what_it_cannot_fuse():
    tactic = tactic_by_key(TACTIC)
    node, _ = fused_gemm([4, 16], "Relu", residual=True)  # Relu after the residual add
    assert "residual without an activation" in tactic.supports(node, 1, CPU)
    node, _ = fused_gemm([4, 16], "Gelu")
    assert "oneDNN runs on the CPU" in tactic.supports(node, 1, torch.device("cuda"))
