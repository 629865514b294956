"""The oneDNN int8 convolution tactic for QuantizedConv on the CPU, against the reference QuantizedConv."""

import math

import pytest
import torch

from tensorforge.ir import DType
from tensorforge.kernels.cpu import avx512
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, quantized_mismatch, relative_error
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.fallback import with_float_output
from tests.helpers import needs_onednn_int8
from tests.quant.chain_support import lowered
from tests.tactics.test_triton_quantized_conv_tactic import _quantized_layer

TACTIC = "vendor.onednn-qconv"
CPU = torch.device("cpu")


@needs_onednn_int8()
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


def test_onednn_int8_convolution_declines_a_cpu_without_vnni(monkeypatch):
    node, _ = _quantized_layer()
    monkeypatch.setattr(avx512, "host_flags", lambda: "flags : fpu avx2 fma avx512f")
    assert "saturate" in tactic_by_key(TACTIC).supports(node, 1, CPU)
    monkeypatch.setattr(avx512, "host_flags", lambda: "flags : fpu avx2 fma avx_vnni")
    assert tactic_by_key(TACTIC).supports(node, 1, CPU) is None


@needs_onednn_int8()
@pytest.mark.parametrize("residual", ["int8", "float"])
@pytest.mark.parametrize("output", ["int8", "float"])
def test_a_residual_and_relu_run_as_onednns_sum_post_op_in_every_form(residual, output):
    """conv3 of the chain model (1×1, + residual, ReLU) with an int8 or float residual and an int8 or float
    output: oneDNN's sum post-op (int8 accumulation with z_scale when both are int8, float32 otherwise)
    against the reference layer, a quantized output as a rounding of the float reference."""
    model, _ = chain_quantized(lowered(), residuals=residual == "int8")
    node = next(n for n in model.graph.nodes if n.name == "conv3")
    assert bool(node.attributes.get("z_scale")) == (residual == "int8")
    if output == "float":
        node.attributes["y_scale"] = 0.0
        node.outputs[0].dtype = DType.FLOAT
    generator = torch.Generator().manual_seed(5)
    x = torch.randint(-128, 128, node.inputs[0].shape, generator=generator, dtype=torch.int8)
    z = torch.randn(node.inputs[3].shape, generator=generator).relu()
    if residual == "int8":
        z = torch.randint(-128, 128, z.shape, generator=generator, dtype=torch.int8)
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, {"precision": "fp32", "layout": "NHWC"}, {})([x, z])[
        0
    ]
    want = build_layer_kernel(tactic_by_key("reference.registry"), with_float_output(node), 1, CPU, {}, {})([x, z])
    if output == "int8":
        assert got.dtype == torch.int8
        scale = node.attributes["y_scale"]
        assert quantized_mismatch(got, want[0], scale, "int8", TOLERANCE["fp32"]) == ""
    else:
        assert got.dtype == torch.float32 and relative_error(got, want[0]) <= TOLERANCE["fp32"]
