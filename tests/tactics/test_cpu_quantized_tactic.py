"""The int8 CPU tactics (`cpu.pointwise-int8`, `cpu.gemm-int8`): a calibrated chain's 1×1 and linear layers in
every input, residual and output form through the autotuner's check and against the reference layer; where they
decline and why."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import DType, Model
from tensorforge.kernels.cpu import quantized_pointwise as qp
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.math_flags import cpu_native_precisions
from tensorforge.passes.pipeline import optimize
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.quant import calibrate
from tensorforge.quant.lower import quantize_layers
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, quantized_mismatch, relative_error
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.fallback import with_float_output
from tests.helpers import make_model, tensor_info
from tests.quant.chain_support import lowered, skip_proto
from tests.tactics.test_triton_quantized_conv_tactic import _quantized_layer

CPU = torch.device("cpu")
CONV, GEMM, DIRECT = "cpu.pointwise-int8", "cpu.gemm-int8", "cpu.conv-int8"
_PROBLEM = compiler_problem() or qp.problem()
needs_vnni = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _inputs(node, generator) -> list:
    """Random inputs for a quantized layer's non-constant inputs: int8 where the chain made them int8."""
    inputs = []
    for value in node.inputs:
        if value is None or value.is_const:
            continue
        if value.dtype == DType.INT8:
            inputs.append(torch.randint(-128, 128, value.shape, generator=generator, dtype=torch.int8))
        else:
            inputs.append(torch.randn(value.shape, generator=generator).relu())
    return inputs


def _check(node, tactic: str, seed: int = 0, feeds: list | None = None) -> None:
    """Every config through the autotuner's check (finite), and the first against the reference layer."""
    generator = torch.Generator().manual_seed(seed)
    feeds = feeds if feeds is not None else _inputs(node, generator)
    slots = iter(feeds)
    inputs = [None if value is None or value.is_const else next(slots) for value in node.inputs]
    choice = autotune(node, 1, inputs, "cpu", effort=0, families=["cpu"], exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == tactic]
    assert len(ours) == len(tactic_by_key(tactic).space(0)), [c.tactic for c in choice.candidates]
    assert all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]
    got = build_layer_kernel(tactic_by_key(tactic), node, 1, CPU, ours[0].config, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), with_float_output(node), 1, CPU, {}, {})(feeds)[0]
    y_scale = float(node.attributes.get("y_scale", 0.0))
    if y_scale:
        assert got.dtype == torch.int8 and quantized_mismatch(got, want, y_scale, "int8", TOLERANCE["fp32"]) == ""
    else:
        assert got.dtype == torch.float32 and relative_error(got, want) <= TOLERANCE["fp32"]


@needs_vnni
@pytest.mark.parametrize("residuals", [True, False])
@pytest.mark.parametrize(("layer", "tactic"), [("conv3", CONV), ("conv4", CONV), ("fc1", GEMM), ("fc2", GEMM)])
def test_a_chains_layers_pass_the_autotuners_check_and_match_the_reference(residuals, layer, tactic):
    """conv3: int8 in, a residual (int8 with `residuals`, else float) and int8 out; conv4: int8 in, float out;
    fc1: int8 in and out; fc2: int8 in, float out (a chain 32 channels wide)."""
    model, _ = chain_quantized(lowered(width=32), residuals=residuals)
    node = next(n for n in model.graph.nodes if n.name == layer)
    assert node.op_type in ("QuantizedConv", "QuantizedGemm")
    _check(node, tactic)


def _strided_layer() -> Model:
    """A 1×1 convolution 24 → 40 at stride 2 over 9×9 with GELU, calibrated and lowered to a QuantizedConv with a
    float input and output."""
    rng = np.random.default_rng(4)
    inits = [
        numpy_helper.from_array((rng.standard_normal((40, 24, 1, 1)) / 5).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "b"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2]), helper.make_node("Gelu", ["c"], ["y"])]
    proto = make_model(nodes, [tensor_info("x", [2, 24, 9, 9])], [tensor_info("y", None)], 20, inits)
    model, _ = optimize(import_model(proto))
    batch = {"x": rng.standard_normal((2, 24, 9, 9)).astype(np.float32)}
    quantize_layers(model, calibrate(model, [batch], "minmax"), quant="int8")
    return model


@needs_vnni
def test_a_strided_layer_with_a_float_input_reads_every_second_pixel():
    (node,) = _strided_layer().graph.nodes
    assert node.op_type == "QuantizedConv" and list(node.attributes["strides"]) == [2, 2]
    _check(node, CONV, seed=1)


@needs_vnni
@pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize(
    ("layer", "tactic"), [("strided", CONV), ("conv4", CONV), ("fc2", GEMM), ("conv4-3x3", DIRECT)]
)
def test_in_a_bf16_build_float_activations_are_bf16(layer, tactic):
    """A bf16 build times each int8 layer that reads or writes a float activation in bf16 too: the float input
    quantized from bf16 (strided: float in, float out with GELU), an int8 input's float output written in bf16
    (conv4, fc2, the 3×3 conv4), within bf16's tolerance of the reference layer."""
    if layer == "strided":
        (node,) = _strided_layer().graph.nodes
    else:
        proto = skip_proto(width=32) if layer.endswith("3x3") else None
        model, _ = chain_quantized(lowered(width=32) if proto is None else lowered(proto=proto))
        node = next(n for n in model.graph.nodes if n.name == layer.split("-")[0])
    generator = torch.Generator().manual_seed(5)
    feeds = _inputs(node, generator)
    slots = iter(feeds)
    inputs = [None if value is None or value.is_const else next(slots) for value in node.inputs]
    choice = autotune(node, 1, inputs, "cpu", effort=0, precisions=("fp32", "bf16"), families=["cpu"], exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == tactic and c.config["precision"] == "bf16"]
    assert ours and all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]
    got = build_layer_kernel(tactic_by_key(tactic), node, 1, CPU, ours[0].config, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), with_float_output(node), 1, CPU, {}, {})(feeds)[0]
    assert got.dtype == torch.bfloat16 and relative_error(got.float(), want) <= TOLERANCE["bf16"]


@needs_vnni
@pytest.mark.parametrize("layer", ["conv1", "conv2", "conv4"])
def test_a_chains_3x3_layers_run_as_the_int8_direct_convolution(layer):
    """Quantized in and out (conv1), with a quantized residual (conv2), quantized in and float out (conv4)."""
    model, _ = chain_quantized(lowered(proto=skip_proto(width=32)))
    node = next(n for n in model.graph.nodes if n.name == layer)
    assert list(node.inputs[1].shape[2:]) == [3, 3]
    _check(node, DIRECT)


@needs_vnni
@pytest.mark.parametrize("residual", [True, False])
def test_a_float_layer_with_a_residual_runs_as_the_int8_direct_convolution(residual):
    """A 16-channel 3×3 QuantizedConv with a float input (quantized by the kernel), float residual and output."""
    node, feeds = _quantized_layer(residual=residual, size=9)
    _check(node, DIRECT, feeds=feeds)


def test_the_tactics_decline_with_the_reason():
    model, _ = chain_quantized(lowered(width=32))
    conv1, conv3 = (next(n for n in model.graph.nodes if n.name == name) for name in ("conv1", "conv3"))
    conv_tactic, gemm_tactic = tactic_by_key(CONV), tactic_by_key(GEMM)
    assert conv_tactic.supports(conv3, 1, torch.device("cuda")) == "a CPU kernel"
    assert "1×1" in conv_tactic.supports(conv1, 1, CPU)
    assert "int8 1×1 kernel" in tactic_by_key(DIRECT).supports(conv3, 1, CPU)
    fp8 = lowered("fp8e4m3", width=32)
    fc1 = next(n for n in fp8.graph.nodes if n.name == "fc1")
    assert "int8 only" in gemm_tactic.supports(fc1, 1, CPU)
    depthwise = next(n for n in lowered(width=32).graph.nodes if n.name == "conv2")
    reason = conv_tactic.supports(depthwise, 1, CPU)
    assert "per-tensor" in reason or "1×1" in reason or "one group" in reason
