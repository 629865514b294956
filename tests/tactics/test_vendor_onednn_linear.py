"""The oneDNN linear tactic for FusedGemm on the CPU: against the reference over its epilogues and layouts, and
what it declines."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info

TACTIC = "vendor.onednn-linear"
CPU = torch.device("cpu")


def _gemm_layer(x_shape, activation="", trans_b=False, residual=False, matmul=True, n=24):
    """MatMul (or Gemm) + bias (+ residual) (+ activation) with `n` outputs, optimized into one FusedGemm, and its
    feeds."""
    rng = np.random.default_rng(0)
    k = x_shape[-1]
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32) / k**0.5
    b = rng.standard_normal(n).astype(np.float32)
    if matmul:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["c"])]
    else:
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["c"], transB=int(trans_b))]
    inputs, last = [tensor_info("x", x_shape)], "c"
    if residual:
        inputs.append(tensor_info("r", [*x_shape[:-1], n]))
        nodes.append(helper.make_node("Add", [last, "r"], ["s"]))
        last = "s"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["y"]))
        last = "y"
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info(last, None)], 17, inits)))
    (node,) = model.graph.nodes
    assert node.op_type == "FusedGemm"
    feeds = [torch.randn(x_shape)] + ([torch.randn(*x_shape[:-1], n)] if residual else [])
    return node, feeds


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
    node, feeds = _gemm_layer(x_shape, activation, trans_b, residual, matmul)
    choice = autotune(node, 1, [feeds[0], None, None, *feeds[1:]], "cpu", effort=0)  # by input position
    ours = next(c for c in choice.candidates if c.tactic == TACTIC)
    assert math.isfinite(ours.median_ms), ours.note
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, ours.config, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    assert got.shape == want.shape and relative_error(got, want) <= 1e-5


def test_onednn_linear_declines_what_it_cannot_fuse():
    tactic = tactic_by_key(TACTIC)
    node, _ = _gemm_layer([4, 16], "Relu", residual=True)  # Relu after the residual add
    assert "residual without an activation" in tactic.supports(node, 1, CPU)
    node, _ = _gemm_layer([4, 16], "Gelu")
    assert "oneDNN runs on the CPU" in tactic.supports(node, 1, torch.device("cuda"))
