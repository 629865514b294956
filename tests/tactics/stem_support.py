"""A stem convolution (one Conv and its activation on a few-channel image) optimized into one FusedConv, for the
tests of the few-channel tactics."""

import numpy as np
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import Model, Node
from tensorforge.passes.pipeline import optimize
from tensorforge.quant import calibrate
from tensorforge.quant.lower import quantize_layers
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


def quantized_stem(size=16, kernel=7, pad=3, cout=16, quant="int8") -> tuple[Node, list[torch.Tensor]]:
    """A ReLU stem of 3 channels calibrated on random batches (minmax) and lowered to a QuantizedConv of type
    `quant`, with a feed."""
    node = stem_node(3, cout, kernel, pad, 2, size, activation="relu", scale=kernel)
    model = Model(node.graph, {"": 17, "tensorforge": 1})
    rng = np.random.default_rng(4)
    batches = [{"x": rng.standard_normal((2, 3, size, size)).astype(np.float32)} for _ in range(2)]
    quantize_layers(model, calibrate(model, batches, "minmax"), quant=quant)
    (quantized,) = model.graph.nodes
    assert quantized.op_type == "QuantizedConv"
    return quantized, [torch.from_numpy(batches[0]["x"])]
