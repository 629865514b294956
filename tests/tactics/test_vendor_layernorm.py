"""The vendor LayerNormalization tactic: torch's one-pass layer norm against the reference, and its declines."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import DEVICES, make_model, tensor_info

TACTIC = "vendor.torch-layernorm"


def _layer_norm(shape, axis, bias=True, outputs=("y",), stash_type=1):
    rng = np.random.default_rng(0)
    normalized = shape[axis % len(shape) :]
    inits = [numpy_helper.from_array(rng.normal(1, 0.2, normalized).astype(np.float32), "scale")]
    inputs = ["x", "scale"]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.2, normalized).astype(np.float32), "bias"))
        inputs.append("bias")
    node = helper.make_node("LayerNormalization", inputs, list(outputs), axis=axis, epsilon=1e-5, stash_type=stash_type)
    infos = [tensor_info(name, None) for name in outputs]
    (node,) = import_model(make_model([node], [tensor_info("x", shape)], infos, 17, inits)).graph.nodes
    return node


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("shape", "axis", "bias"), [([2, 7, 48], -1, True), ([2, 3, 5, 6], -2, False), ([4, 9], 0, True)]
)
def test_vendor_layer_norm_matches_the_reference(device, shape, axis, bias):
    node = _layer_norm(shape, axis, bias)
    x = torch.randn(shape, device=device) * 3 + 1
    choice = autotune(node, 17, [x], device, effort=0)
    vendor = next(c for c in choice.candidates if c.tactic == TACTIC)
    assert math.isfinite(vendor.median_ms), vendor.note
    dev = torch.device(device)
    ours = build_layer_kernel(tactic_by_key(TACTIC), node, 17, dev, vendor.config, {})([x])[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, dev, vendor.config, {})([x])[0]
    assert relative_error(ours, want) <= 1e-5


def test_vendor_layer_norm_declines_the_statistics_outputs_and_other_stash_types():
    tactic, cpu = tactic_by_key(TACTIC), torch.device("cpu")
    assert "Mean and InvStdDev" in tactic.supports(_layer_norm([2, 8], -1, outputs=("y", "mean")), 17, cpu)
    assert "stash_type" in tactic.supports(_layer_norm([2, 8], -1, stash_type=11), 17, cpu)
