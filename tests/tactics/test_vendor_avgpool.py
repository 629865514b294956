"""The vendor AveragePool tactic agrees with the reference wherever the autotuner's gate lets it run, and the
padding it cannot take is refused as a failed candidate, not computed wrong."""

import math

import pytest
import torch
from onnx import helper

from tensorforge.frontend import import_model
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import DEVICES, make_model, tensor_info

TACTIC = "vendor.torch-avgpool"
CASES = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},  # 9 × 11: the last windows hang past the end
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [1, 1]},
    {"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
]


def _pool(attributes):
    rank = len(attributes["kernel_shape"])
    shape = [2, 3, 9, 11][: 2 + rank]
    node = helper.make_node("AveragePool", ["x"], ["y"], **attributes)
    (node,) = import_model(make_model([node], [tensor_info("x", shape)], [tensor_info("y", None)])).graph.nodes
    return node, shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attributes", CASES)
def test_matches_the_reference(device, attributes):
    node, shape = _pool(attributes)
    x = torch.randn(shape, device=device)
    choice = autotune(node, 17, [x], device, effort=0)
    ours = next(c for c in choice.candidates if c.tactic == TACTIC)
    assert math.isfinite(ours.median_ms), ours.note
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 17, torch.device(device), ours.config, {})([x])[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, torch.device(device), {}, {})([x])[0]
    assert got.shape == want.shape and relative_error(got, want) <= TOLERANCE["fp32"]


def test_padding_torch_does_not_take_fails_the_candidate_and_dilation_is_declined():
    node, shape = _pool({"kernel_shape": [3, 3], "pads": [0, 0, 1, 1]})
    choice = autotune(node, 17, [torch.randn(shape)], "cpu", effort=0)
    ours = [c for c in choice.candidates if c.tactic == TACTIC]
    assert ours and all(c.median_ms == math.inf and "not torch's" in c.note for c in ours)
    node, _ = _pool({"kernel_shape": [2, 2], "dilations": [2, 2]})
    assert "no dilation" in tactic_by_key(TACTIC).supports(node, 19, torch.device("cpu"))
