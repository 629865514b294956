"""Per-channel input scales of depthwise convolutions: calibrated as the channels' maxima, simulated with Q/DQ on
axis 1, lowered to a QuantizedConv with `Xs`, declined by the chaining rules, run by every CPU tactic, and built
into an engine that computes its simulation."""

import json
import math

import numpy as np
import pytest
import torch

from tensorforge import Executor
from tensorforge.build.builder import Builder
from tensorforge.build.config import BuildConfig, Profile, QuantizationConfig
from tensorforge.ir.clone import clone_model
from tensorforge.ops.infer import infer_model
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.quant import calibrate, simulate_quantized
from tensorforge.quant.calibration import _observing
from tensorforge.quant.lower import quantize_layers
from tensorforge.runtime.engine import Engine
from tensorforge.runtime.inspect import describe_engine, quantization_lines
from tensorforge.tactics.autotune import TOLERANCE, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.fallback import float_twin
from tests.quant.support import separable_model

CPU = torch.device("cpu")


def _observe(model, feeds, name) -> np.ndarray:
    executor = Executor(_observing(model, [name]), "cpu")
    return np.concatenate([executor.run(feed)[name].numpy() for feed in feeds])


def _depthwise(model):
    (node,) = [n for n in model.graph.nodes if n.attributes.get("group", 1) > 1]
    return node


@pytest.fixture(scope="module")
def separable():
    model, feeds = separable_model()
    return model, feeds, calibrate(model, feeds, "minmax")


def test_calibration_keeps_the_channel_maxima_of_depthwise_inputs_only(separable):
    model, feeds, table = separable
    name = _depthwise(model).inputs[0].name
    assert set(table.channels) == {name}
    want = np.abs(_observe(model, feeds, name)).max(axis=(0, 2, 3))
    np.testing.assert_allclose(table.channels[name], want, rtol=1e-6)
    assert max(want) > 20 * min(want)  # the channels one per-tensor scale would crush
    torch.testing.assert_close(table.channel_scales(name), torch.tensor(want / 127, dtype=torch.float32))
    assert table.channel_scales(name, 448.0) is not None and table.per_tensor().channel_scales(name) is None


def test_the_simulation_quantizes_them_per_channel_with_a_smaller_error(separable):
    model, feeds, table = separable
    depthwise = _depthwise(model)
    name = depthwise.inputs[0].name
    simulated = simulate_quantized(model, table)
    (quantizer,) = [n for n in simulated.graph.nodes if n.op_type == "QuantizeLinear" and n.inputs[0].name == name]
    assert quantizer.attributes["axis"] == 1
    torch.testing.assert_close(quantizer.inputs[1].const, table.channel_scales(name))
    # The depthwise layer's own output: its input's rounding is all that differs between the two simulations.
    out = depthwise.outputs[0].name
    want = _observe(model, feeds, out)
    per_tensor = np.abs(_observe(simulate_quantized(model, table.per_tensor()), feeds, out) - want)
    per_channel = np.abs(_observe(simulated, feeds, out) - want)
    small = np.array(table.channels[name]) < max(table.channels[name]) / 10
    assert per_channel[:, small].max() < 0.25 * per_tensor[:, small].max()
    assert per_channel.max() <= per_tensor.max() * 1.01


def _lowered(model, table, quant="int8"):
    lowered = clone_model(model)
    quantize_layers(lowered, table, quant=quant)
    infer_model(lowered, check=False)
    return lowered


@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
def test_the_lowered_layer_has_the_channel_scales_and_computes_the_simulation(separable, quant):
    model, feeds, table = separable
    lowered = _lowered(model, table, quant)
    depthwise = _depthwise(lowered)
    assert depthwise.op_type == "QuantizedConv" and depthwise.attributes["x_scale"] == 1.0
    qmax = 127.0 if quant == "int8" else 448.0
    name = _depthwise(model).inputs[0].name  # the lowering may rename the values it rewrites
    torch.testing.assert_close(depthwise.inputs[5].const, table.channel_scales(name, qmax))
    others = [n for n in lowered.graph.nodes if n.op_type == "QuantizedConv" and n is not depthwise]
    assert len(others) == 2 and all(len(n.inputs) == 5 for n in others)
    simulated = simulate_quantized(model, table, quant=quant)
    for feed in feeds:
        got = Executor(lowered).run(feed)
        want = Executor(simulated).run(feed)
        for name, value in want.items():
            assert relative_error(got[name], value) <= 1e-4, name
    assert len(_depthwise(_lowered(model, table.per_tensor(), quant)).inputs) == 5


def test_a_per_channel_reader_keeps_its_input_float_and_its_output_still_chains(separable):
    model, _, table = separable
    chained, report = chain_quantized(_lowered(model, table))
    depthwise = _depthwise(chained)
    (producer,) = [n for n in chained.graph.nodes if depthwise.inputs[0] in n.outputs]
    assert not producer.attributes.get("y_scale")
    assert report["float"][producer.name].endswith("per channel")
    assert depthwise.attributes["y_scale"] > 0  # the 1×1 projection reads it quantized


def test_the_triton_tactic_quantizes_by_channel_under_the_interpreter(separable):
    model, feeds, table = separable
    node = _depthwise(_lowered(model, table))
    x = torch.from_numpy(_observe(model, feeds[:1], _depthwise(model).inputs[0].name))
    x = x.contiguous(memory_format=torch.channels_last)
    tiny = {"block_m": 16, "block_n": 16, "block_k": 32, "group_m": 2, "num_warps": 1, "num_stages": 1, "split_k": 1}
    config = {"precision": "fp32", "layout": "NHWC", **tiny}
    got = build_layer_kernel(tactic_by_key("triton.conv-igemm-quantized"), node, 17, CPU, config, {})([x])[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, CPU, {}, {})([x])[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize("tactic", ["vendor.torch-quantized", "vendor.onednn-qconv", "fallback.float-conv"])
def test_every_cpu_tactic_runs_the_per_channel_layer(separable, tactic):
    model, feeds, table = separable
    lowered = _lowered(model, table)
    node = _depthwise(lowered)
    original = _depthwise(model)
    x = torch.from_numpy(_observe(model, feeds[:1], original.inputs[0].name))
    x = x.contiguous(memory_format=torch.channels_last)
    config = {"precision": "fp32", "layout": "NHWC"}
    key = tactic_by_key(tactic)
    assert key.supports(node, 17, CPU) is None
    got = build_layer_kernel(key, node, 17, CPU, {**key.space(0)[0], **config}, {})([x])[0]
    # The float fallback computes the float layer of the dequantized weight (`float_twin`), on the float input.
    semantics = float_twin(node) if tactic.startswith("fallback") else node
    want = build_layer_kernel(tactic_by_key("reference.registry"), semantics, 17, CPU, {}, {})([x])[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]


PROFILE = Profile().add("input", (2, 3, 8, 8), (2, 3, 8, 8), (2, 3, 8, 8))


def _build(feeds, **quantization) -> Engine:
    config = BuildConfig(
        precisions=("fp32", "int8"), profiles=(PROFILE,), effort=0, tactic_families=("reference", "vendor"),
        quantization=QuantizationConfig(method="minmax", **quantization),
    )  # fmt: skip
    model, _ = separable_model()
    return Builder(config, calibration_data=feeds).build(model)


def test_an_engine_quantizes_depthwise_inputs_per_channel_and_says_so(separable, tmp_path):
    model, feeds, table = separable
    engine = _build(feeds)
    section = engine.report["quantization"]
    assert section["per_channel_inputs"] == sorted(table.channels)
    assert "depthwise convolution inputs quantized per channel: 1" in quantization_lines(engine.report)
    path = tmp_path / "separable.engine"
    engine.save(path)
    loaded = Engine.load(path)
    simulated = simulate_quantized(model, table)
    for feed in feeds:
        got = loaded.create_context().run(feed)
        want = Executor(simulated).run(feed)
        for name, value in want.items():
            assert relative_error(got[name].cpu(), value) <= 1e-4, name
    assert "x_scale per channel" in json.dumps(describe_engine(loaded))
    per_tensor = _build(feeds, depthwise_channels=False)
    assert "per_channel_inputs" not in per_tensor.report["quantization"]
    assert per_tensor.config.quantization.depthwise_channels is False


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_a_cuda_engine_quantizes_depthwise_inputs_per_channel_in_the_triton_kernel(separable, precision):
    """The Triton quantized kernel's per-channel quantize-on-load in an engine (no float fallback) against the
    engine's own graph on the reference executor. E4M3 tensor cores add in reduced precision: bfloat16's bound."""
    model, feeds, _ = separable
    config = BuildConfig(
        device="cuda", precisions=("fp32", precision), profiles=(PROFILE,), effort=0,
        quantization=QuantizationConfig(method="minmax", chain="always"), tactic_families=("reference", "triton"),
    )  # fmt: skip
    engine = Builder(config, calibration_data=feeds).build(separable_model()[0])
    depthwise = _depthwise(engine.model)
    assert depthwise.op_type == "QuantizedConv" and len(depthwise.inputs) == 6
    nodes = engine.model.graph.nodes
    layer = next(layer for layer in engine.plans[0].layers if nodes[layer.node] is depthwise)
    timed = [c for c in layer.candidates if c.tactic == "triton.conv-igemm-quantized"]
    assert any(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]  # checked by the autotuner
    reference = Executor(engine.model, "cpu")
    for feed in feeds:
        got = engine.create_context().run(feed)
        want = reference.run(feed)
        for name, value in want.items():
            bound = TOLERANCE["fp32"] if precision == "int8" else TOLERANCE["bf16"]
            assert relative_error(got[name].cpu(), value) <= bound, name
