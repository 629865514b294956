"""The vendor MaxPool tactic agrees with the reference wherever the autotuner's gate lets it run."""

import math

import onnx
import pytest
import torch
from onnx import helper

from tensorforge.frontend import import_model
from tensorforge.ir import DType
from tensorforge.tactics.autotune import autotune, build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import DEVICES, make_model, tensor_info

CASES = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]},  # asymmetric
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "dilations": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3], "strides": [1], "pads": [2, 2]},  # pads wider than half the window
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attributes", CASES)
def test_vendor_maxpool_matches_the_reference(device, attributes):
    rank = len(attributes["kernel_shape"])
    shape = [2, 3, 9, 11][: 2 + rank]
    proto = make_model(
        [helper.make_node("MaxPool", ["x"], ["y"], **attributes)], [tensor_info("x", shape)], [tensor_info("y", None)]
    )
    (node,) = import_model(proto).graph.nodes
    x = torch.randn(shape, device=device)
    choice = autotune(node, 17, [x], device, effort=0)
    vendor = next(c for c in choice.candidates if c.tactic == "vendor.torch-maxpool")
    assert math.isfinite(vendor.median_ms), vendor.note
    config = vendor.config
    ours = build_layer_kernel(tactic_by_key("vendor.torch-maxpool"), node, 17, torch.device(device), config, {})([x])[0]
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, torch.device(device), config, {})(
        [x]
    )[0]
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attributes", CASES[:2])
@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_vendor_maxpool_pools_quantized_activations_exactly(device, attributes, dtype):
    """An int8 or E4M3 activation (a max pool passing a quantized tensor on), channels_last: pooled in float32,
    exactly the reference's maximum; all values negative, so a padding read as 0 would show. (ONNX's MaxPool
    takes no E4M3: the chaining pass retypes the pool's values, as done here.)"""
    proto = make_model(
        [helper.make_node("MaxPool", ["x"], ["y"], **attributes)],
        [tensor_info("x", [2, 3, 9, 11], onnx.TensorProto.INT8)],
        [tensor_info("y", None, onnx.TensorProto.INT8)],
    )
    (node,) = import_model(proto).graph.nodes
    node.inputs[0].dtype = node.outputs[0].dtype = DType.from_torch(dtype)
    x = -torch.randint(1, 129, (2, 3, 9, 11)).float() * (3.5 if dtype.is_floating_point else 1)  # down to -448
    x = x.to(dtype).to(device).contiguous(memory_format=torch.channels_last)
    choice = autotune(node, 17, [x], device, effort=0)
    vendor = next(c for c in choice.candidates if c.tactic == "vendor.torch-maxpool")
    assert math.isfinite(vendor.median_ms), vendor.note
    ours = build_layer_kernel(tactic_by_key("vendor.torch-maxpool"), node, 17, torch.device(device), vendor.config, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, torch.device(device), {}, {})
    got = ours([x])[0]
    want = reference([x])[0]
    assert got.dtype == dtype and torch.equal(got.float(), want.float()) and (want.float() < 0).all()
