"""The oneDNN int8 convolution tactic for QuantizedConv on the CPU, against the reference QuantizedConv."""

import math

import pytest
import torch

from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.test_triton_quantized_conv_tactic import _quantized_layer

TACTIC = "vendor.onednn-qconv"
CPU = torch.device("cpu")


@pytest.mark.parametrize("residual", [True, False])
def test_onednn_int8_convolution_matches_the_reference(residual):
    node, feeds = _quantized_layer(residual=residual, size=9)
    inputs = [feeds[0], None, None, *feeds[1:]]
    choice = autotune(node, 1, inputs, "cpu", effort=0)
    ours = next(c for c in choice.candidates if c.tactic == TACTIC)
    assert math.isfinite(ours.median_ms), ours.note
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, ours.config, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]


def test_onednn_int8_convolution_declines_fp8_and_other_devices():
    tactic = tactic_by_key(TACTIC)
    node, _ = _quantized_layer(quant="fp8e4m3")
    assert tactic.supports(node, 1, CPU) == "int8 only"
    node, _ = _quantized_layer()
    assert "oneDNN runs on the CPU" in tactic.supports(node, 1, torch.device("cuda"))
