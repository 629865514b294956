"""The CUDA C tactics: clear reasons where they decline, and on the GPU every config passes the autotuner's
check against the float32 reference."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import autotune
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info


def _layer(channels: int, out_channels: int, group: int, kernel: int, stride: int, activation: str, residual: bool):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((out_channels, channels // group, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    pad = kernel // 2
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, group=group, strides=[stride] * 2)
    nodes, last, inputs = [conv], "c", [tensor_info("x", [2, channels, 15, 15])]
    out_hw = (15 + 2 * pad - kernel) // stride + 1
    if residual:
        inputs.append(tensor_info("r", [2, out_channels, out_hw, out_hw]))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["y"]))
        last = "y"
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info(last, None)], 17, inits)))
    (node,) = model.graph.nodes
    extra = [torch.randn(2, out_channels, out_hw, out_hw)] if residual else []
    return node, [torch.randn(2, channels, 15, 15), None, None, *extra]


def test_cuda_tactics_explain_why_they_decline_on_the_cpu():
    node, _ = _layer(8, 8, 8, 3, 1, "Relu", False)
    for key in ("cuda.depthwise", "cuda.direct-conv", "cuda.winograd"):
        assert tactic_by_key(key).supports(node, 1, torch.device("cpu")) == "needs CUDA"


@pytest.mark.gpu
def test_cuda_tactics_claim_only_their_convolutions():
    cuda = torch.device("cuda")
    depthwise, _ = _layer(8, 8, 8, 3, 1, "Relu", False)
    dense, _ = _layer(8, 16, 1, 3, 1, "Relu", False)
    assert tactic_by_key("cuda.depthwise").supports(depthwise, 1, cuda) is None
    assert "not depthwise" in tactic_by_key("cuda.depthwise").supports(dense, 1, cuda)
    assert tactic_by_key("cuda.direct-conv").supports(dense, 1, cuda) is None
    assert "groups = 1" in tactic_by_key("cuda.direct-conv").supports(depthwise, 1, cuda)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("channels", "out_channels", "group", "kernel", "stride", "activation", "residual", "tactic"),
    [
        (32, 32, 32, 3, 1, "HardSwish", False, "cuda.depthwise"),
        (24, 24, 24, 5, 2, "Relu", False, "cuda.depthwise"),
        (16, 32, 1, 3, 1, "", True, "cuda.direct-conv"),
        (3, 16, 1, 7, 2, "Relu", False, "cuda.direct-conv"),
        (16, 24, 1, 3, 1, "Relu", True, "cuda.winograd"),
    ],
)
def test_every_cuda_candidate_passes_the_autotuners_check(
    channels, out_channels, group, kernel, stride, activation, residual, tactic
):
    node, inputs = _layer(channels, out_channels, group, kernel, stride, activation, residual)
    inputs = [t.cuda() if t is not None else None for t in inputs]
    choice = autotune(
        node, 1, inputs, "cuda", effort=1, precisions=("fp32", "fp16", "bf16"), families=["cuda"], exhaustive=True
    )
    ours = [c for c in choice.candidates if c.tactic == tactic]
    assert ours and all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]


def _layer_norm(shape, axis=-1, outputs=("y",)):
    rng = np.random.default_rng(0)
    normalized = [d if isinstance(d, int) else 16 for d in shape[axis % len(shape) :]]  # a symbolic axis: 16
    inits = [
        numpy_helper.from_array(rng.normal(1, 0.2, normalized).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.normal(0, 0.2, normalized).astype(np.float32), "bias"),
    ]
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], list(outputs), axis=axis, epsilon=1e-5)
    infos = [tensor_info(name, None) for name in outputs]
    (node,) = import_model(make_model([node], [tensor_info("x", shape)], infos, 17, inits)).graph.nodes
    return node


def test_cuda_layer_norm_declines_with_reasons():
    tactic = tactic_by_key("cuda.layernorm")
    assert tactic.supports(_layer_norm([4, 768]), 17, torch.device("cpu")) == "needs CUDA"


@pytest.mark.gpu
def test_cuda_layer_norm_declines_long_dynamic_rows_and_statistics():
    tactic, cuda = tactic_by_key("cuda.layernorm"), torch.device("cuda")
    assert tactic.supports(_layer_norm(["batch", 128, 768]), 17, cuda) is None
    assert "at most 2048" in tactic.supports(_layer_norm([4, 4096]), 17, cuda)
    assert "static" in tactic.supports(_layer_norm([4, "n"]), 17, cuda)
    assert "Mean and InvStdDev" in tactic.supports(_layer_norm([4, 64], outputs=("y", "mean")), 17, cuda)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "axis"), [([8, 128, 768], -1), ([2, 5, 6, 16], -2)])
def test_every_cuda_layer_norm_candidate_passes_the_autotuners_check(shape, axis):
    node = _layer_norm(shape, axis)
    x = torch.randn(shape, device="cuda") * 3 + 1
    choice = autotune(node, 17, [x], "cuda", effort=2, precisions=("fp32", "fp16", "bf16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == "cuda.layernorm"]
    assert {c.config["warps"] for c in ours} == {1, 2, 4, 8, 16}
    assert all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]
