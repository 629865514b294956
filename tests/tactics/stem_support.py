"""A stem convolution (one Conv and its activation on a few-channel image) optimized into one FusedConv, for the
tests of the few-channel tactics."""

import numpy as np
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import Node
from tensorforge.passes.pipeline import optimize
from tests.helpers import make_model, tensor_info


def stem_node(channels=3, cout=16, kernel=3, pad=1, stride=2, size=9, group=1, activation="silu", scale=4.0) -> Node:
    """Conv K×K/stride (pads `pad`) with a bias, then SiLU (Sigmoid · x) or ReLU, on a `channels`-channel image of
    `size`², as the one FusedConv the optimizer makes of it; weights normal / `scale`."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((cout, channels // group, kernel, kernel)).astype(np.float32) / scale
    b = rng.standard_normal(cout).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[stride] * 2, group=group)
    if activation == "silu":
        tail = [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    else:
        tail = [helper.make_node("Relu", ["c"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    x = tensor_info("x", [2, channels, size, size])
    graph = make_model([conv, *tail], [x], [tensor_info("y", None)], 17, inits)
    model, _ = optimize(import_model(graph))
    (node,) = model.graph.nodes
    assert node.op_type == "FusedConv"
    return node
