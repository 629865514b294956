"""`cpu.maxpool`: MaxPool through the autotuner against the reference, float32 and a quantized activation's int8
codes, and its reasons for declining."""

import math

import onnx
import pytest
import torch
from onnx import helper

from tensorforge.frontend import import_model
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.autotune import autotune, build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info

TACTIC = "cpu.maxpool"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem()


def _node(shape, attributes, elem_type=onnx.TensorProto.FLOAT, indices=False):
    outputs = ["y", "i"] if indices else ["y"]
    infos = [tensor_info("y", None, elem_type)] + ([tensor_info("i", None, onnx.TensorProto.INT64)] if indices else [])
    proto = make_model(
        [helper.make_node("MaxPool", ["x"], outputs, **attributes)], [tensor_info("x", shape, elem_type)], infos
    )
    (node,) = import_model(proto).graph.nodes
    return node


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
@pytest.mark.parametrize(
    ("dtype", "elem_type"), [(torch.float32, onnx.TensorProto.FLOAT), (torch.int8, onnx.TensorProto.INT8)]
)
@pytest.mark.parametrize(
    "attributes",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]},  # asymmetric
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    ],
)
def test_the_autotuner_times_it_and_it_matches_the_reference(dtype, elem_type, attributes):
    shape = [2, 19, 9, 11]
    node = _node(shape, attributes, elem_type)
    x = torch.randn(shape) * 50
    x = (x.clamp(-128, 127) if dtype == torch.int8 else x).to(dtype).contiguous(memory_format=torch.channels_last)
    choice = autotune(node, 17, [x], "cpu", effort=0, exhaustive=True)
    (ours,) = [c for c in choice.candidates if c.tactic == TACTIC]
    assert math.isfinite(ours.median_ms), ours.note
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 17, CPU, ours.config, {})([x])[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, CPU, {}, {})([x])[0]
    assert got.dtype == dtype and torch.equal(got, want)


def test_declines_indices_other_ranks_types_and_devices():
    tactic = tactic_by_key(TACTIC)
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    assert "indices" in tactic.supports(_node([1, 2, 4, 4], pool, indices=True), 17, CPU)
    assert "rank 3" in tactic.supports(_node([1, 2, 4], {"kernel_shape": [2], "strides": [2]}), 17, CPU)
    assert "DOUBLE" in tactic.supports(_node([1, 2, 4, 4], pool, onnx.TensorProto.DOUBLE), 17, CPU)
    assert tactic.supports(_node([1, 2, 4, 4], pool), 17, torch.device("cuda")) == "a CPU kernel"
    assert tactic.supports(_node([1, 2, 4, 4], pool), 17, CPU) == _PROBLEM
