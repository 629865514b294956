"""The vendor LayerNormalization tactic: torch's one-pass layer norm against the reference, and its declines."""

import math

import pytest
import torch

from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import DEVICES, layer_norm_node

TACTIC = "vendor.torch-layernorm"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("shape", "axis", "bias"), [([2, 7, 48], -1, True), ([2, 3, 5, 6], -2, False), ([4, 9], 0, True)]
)
def test_vendor_layer_norm_matches_the_reference(device, shape, axis, bias):
    node = layer_norm_node(shape, axis, bias)
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
    assert "Mean and InvStdDev" in tactic.supports(layer_norm_node([2, 8], -1, outputs=("y", "mean")), 17, cpu)
    assert "stash_type" in tactic.supports(layer_norm_node([2, 8], -1, stash_type=11), 17, cpu)
