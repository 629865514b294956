"""The oneDNN fused convolution agrees with the reference on every epilogue it claims, and declines the rest."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info

ONEDNN = "vendor.onednn-fused"


def _layer(
    activation: str, residual: bool, group: int = 1, stride: int = 1, dilation: int = 1, pads=(1, 1, 1, 1), **auto_pad
):  # fmt: skip
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8 // group, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    padding = auto_pad or {"pads": list(pads)}
    conv = helper.make_node(
        "Conv", ["x", "w", "b"], ["c"], group=group, strides=[stride] * 2, dilations=[dilation] * 2, **padding
    )
    nodes, last, inputs = [conv], "c", [tensor_info("x", [2, 8, 15, 15])]
    if residual:
        inputs.append(tensor_info("r", [2, 8, 15, 15]))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    if activation:
        extra = {"alpha": 0.1} if activation == "LeakyRelu" else {}
        nodes.append(helper.make_node(activation, [last], ["y"], **extra))
        last = "y"
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info(last, None)], 17, inits)))
    (node,) = model.graph.nodes
    x = torch.randn(2, 8, 15, 15)
    feeds = [x] + ([torch.randn(2, 8, *node.outputs[0].shape[2:])] if residual else [])
    return node, feeds  # the layer's non-constant inputs: x (and the residual)


CLAIMED = [(a, False) for a in ("", "Relu", "Sigmoid", "Tanh", "HardSwish", "LeakyRelu")] + [("", True), ("Relu", True)]


@pytest.mark.parametrize(("activation", "residual"), CLAIMED)
def test_onednn_fused_convolution_matches_the_reference(activation, residual):
    node, feeds = _layer(activation, residual)
    choice = autotune(node, 1, [feeds[0], None, None, *feeds[1:]], "cpu", effort=0)
    candidates = [c for c in choice.candidates if c.tactic == ONEDNN]
    assert candidates and all(math.isfinite(c.median_ms) for c in candidates), [c.note for c in candidates]
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, torch.device("cpu"), {}, {})
    want = reference(feeds)[0]
    for layout in ("NCHW", "NHWC"):
        config = {"precision": "fp32", "layout": layout}
        got = build_layer_kernel(tactic_by_key(ONEDNN), node, 1, torch.device("cpu"), config, {})(feeds)[0]
        assert relative_error(got, want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize(("group", "stride", "dilation"), [(8, 1, 1), (2, 2, 1), (1, 1, 2)])
def test_onednn_handles_groups_strides_and_dilations(group, stride, dilation):
    node, feeds = _layer("Relu", False, group, stride, dilation)
    kernel = build_layer_kernel(tactic_by_key(ONEDNN), node, 1, torch.device("cpu"), {"layout": "NHWC"}, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, torch.device("cpu"), {}, {})
    assert relative_error(kernel(feeds)[0], reference(feeds)[0]) <= TOLERANCE["fp32"]
    # a second batch size reorders the weight again and stays correct
    bigger = [torch.randn(3, *feeds[0].shape[1:])]
    assert relative_error(kernel(bigger)[0], reference(bigger)[0]) <= TOLERANCE["fp32"]


@pytest.mark.parametrize(
    ("stride", "padding"),
    [
        (1, {"pads": (0, 0, 1, 1)}),  # explicit, asymmetric
        (2, {"auto_pad": "SAME_UPPER"}),  # 15 by 2: a total of 2, one each side
        (1, {"auto_pad": "SAME_LOWER"}),
        (2, {"auto_pad": "SAME_LOWER", "dilation": 2}),  # a total of 3: the odd one at the beginning
    ],
)
def test_onednn_takes_asymmetric_and_same_padding(stride, padding):
    """oneDNN's call pads symmetrically: the padding is worked out per input shape, and an asymmetric rest is
    applied to the input first (PaddleOCR's detector is exported with SAME padding)."""
    node, feeds = _layer("Relu", False, stride=stride, **padding)
    assert tactic_by_key(ONEDNN).supports(node, 1, torch.device("cpu")) is None
    kernel = build_layer_kernel(tactic_by_key(ONEDNN), node, 1, torch.device("cpu"), {"layout": "NHWC"}, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, torch.device("cpu"), {}, {})
    got, want = kernel(feeds)[0], reference(feeds)[0]
    assert got.shape == want.shape and relative_error(got, want) <= TOLERANCE["fp32"]


def test_onednn_fuses_an_erf_gelu():
    """A convolution followed by x·½·(1 + erf(x/√2)) (PaddleOCR's detector) is one oneDNN call with its GELU."""
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((8, 8, 3, 3)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Div", ["c", "root2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["f"]),
        helper.make_node("Mul", ["c", "f"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["y"]),
    ]
    constants = {"w": w, "b": b, "root2": np.float32(2**0.5), "one": np.float32(1.0), "half": np.float32(0.5)}
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()]
    proto = make_model(nodes, [tensor_info("x", [2, 8, 15, 15])], [tensor_info("y", None)], 17, inits)
    model, _ = optimize(import_model(proto))
    (node,) = model.graph.nodes
    assert node.attributes.get("pre") == "Gelu"
    assert tactic_by_key(ONEDNN).supports(node, 1, torch.device("cpu")) is None
    feeds = [torch.randn(2, 8, 15, 15)]
    kernel = build_layer_kernel(tactic_by_key(ONEDNN), node, 1, torch.device("cpu"), {"layout": "NHWC"}, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, torch.device("cpu"), {}, {})
    assert relative_error(kernel(feeds)[0], reference(feeds)[0]) <= TOLERANCE["fp32"]


def test_onednn_declines_what_it_cannot_fuse():
    node, _ = _layer("Relu", False)
    assert "CPU" in tactic_by_key(ONEDNN).supports(node, 1, torch.device("meta"))
    node, _ = _layer("Sigmoid", True)
    assert "only with ReLU" in tactic_by_key(ONEDNN).supports(node, 1, torch.device("cpu"))
