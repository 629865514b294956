"""The reference kernels of ops that can win a layer on CUDA build their small tensors on the device (a host
tensor copied per call is forbidden while a stream captures, and would keep the whole engine out of a CUDA
graph): each is run once, captured, replayed and compared with its eager result."""

import functools

import pytest
import torch
from onnx import TensorProto, helper

from tensorforge.frontend import import_model
from tensorforge.ops.cuda_graphs import capture
from tensorforge.tactics.autotune import build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info


def _single(node, shape, opset, initializers=()):
    model = make_model([node], [tensor_info("x", shape)], [tensor_info("y", None)], opset, initializers)
    imported = import_model(model)
    return imported.graph.nodes[-1], imported.opset("")


CASES = {
    "clip-v6": lambda: _single(helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5), [2, 3, 4, 4], 6),
    "resize-nearest": lambda: _single(
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"),
        [2, 3, 4, 4],
        17,
        [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 2.0, 2.0])],
    ),
    "resize-linear": lambda: _single(
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear"),
        [2, 3, 4, 4],
        17,
        [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 3.0, 1.5])],
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_the_reference_kernel_is_captured_and_replayed(case):
    node, opset = CASES[case]()
    device = torch.device("cuda")
    kernel = build_layer_kernel(tactic_by_key("reference.registry"), node, opset, device, {}, {})
    x = torch.randn(2, 3, 4, 4, device=device)
    eager = kernel([x])[0].clone()
    graph, outputs = capture(functools.partial(kernel, [x]))
    outputs[0].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(outputs[0], eager)
