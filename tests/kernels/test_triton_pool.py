"""The Triton max pool against the reference MaxPool, on the GPU and under Triton's interpreter on the CPU."""

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.kernels.triton.pool import max_pool2d
from tensorforge.ops import load_all
from tensorforge.ops.pool import window_geometry
from tensorforge.ops.registry import REGISTRY, OpContext
from tests.helpers import DEVICES

CASES = [
    ((2, 5, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 70, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((2, 3, 10, 7), {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((1, 4, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
]


def _reference(x, attributes):
    load_all()
    node = Node("MaxPool", [Value("x")], [Value("y")], attributes)
    ctx = OpContext(node=node, opset=17, device=x.device)
    return REGISTRY.lookup("MaxPool", "", 17).impl(ctx, x, **attributes)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("shape", "attributes"), CASES)
def test_triton_max_pool_matches_the_reference(device, dtype, channels_last, shape, attributes):
    x = torch.randn(shape, device=device).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    kernel = attributes["kernel_shape"]
    strides = attributes.get("strides", [1, 1])
    dilations = attributes.get("dilations", [1, 1])
    begin, _, out = window_geometry(
        shape[2:], kernel, strides, dilations, attributes.get("pads"), attributes.get("auto_pad", "NOTSET"),
        attributes.get("ceil_mode", 0), same_crops=True,
    )  # fmt: skip
    want = _reference(x, attributes)
    poisoned = torch.full(want.shape, float("nan"), dtype=dtype, device=device)
    if channels_last:
        poisoned = poisoned.contiguous(memory_format=torch.channels_last)
    got = max_pool2d(x, kernel, strides, begin, dilations, out, block_c=32, out=poisoned)
    assert got is poisoned
    assert torch.equal(got, want)  # a maximum is exact in any precision
    allocated = max_pool2d(x, kernel, strides, begin, dilations, out)
    assert torch.equal(allocated, want)
    assert allocated.is_contiguous(memory_format=torch.channels_last) == channels_last or not channels_last


def test_a_wrong_output_buffer_is_refused():
    x = torch.randn(1, 2, 4, 4)
    with pytest.raises(ValueError, match="out is"):
        max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], [2, 2], out=torch.empty(1, 2, 3, 3))


@pytest.mark.gpu
def test_the_triton_max_pool_is_a_correct_candidate_on_cuda():
    from onnx import helper

    from tensorforge.frontend import import_model
    from tensorforge.tactics.autotune import autotune
    from tests.helpers import make_model, tensor_info

    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    proto = make_model(
        [helper.make_node("MaxPool", ["x"], ["y"], **attributes)],
        [tensor_info("x", [8, 64, 56, 56])],
        [tensor_info("y", None)],
    )
    (node,) = import_model(proto).graph.nodes
    x = torch.randn(8, 64, 56, 56, device="cuda").half().contiguous(memory_format=torch.channels_last)
    choice = autotune(node, 17, [x], "cuda", effort=1, precisions=("fp32", "fp16"))
    triton_candidates = [c for c in choice.candidates if c.tactic == "triton.maxpool"]
    assert len(triton_candidates) == 6 and all(c.median_ms < float("inf") for c in triton_candidates)
