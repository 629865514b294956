"""The Q/DQ rewrite: where pairs go, exact int8 round trips, agreement with a hand-written int8 emulation."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

from tensorforge import Executor
from tensorforge.errors import GraphError, InputError
from tensorforge.frontend import import_model
from tensorforge.ir import DType
from tensorforge.quant.calibration import TensorRange, _observing, calibrate
from tensorforge.quant.simulate import simulate_quantized
from tests.helpers import DEVICES, make_model, relative_error, tensor_info
from tests.quant.support import random_batches, small_conv_model


def inputs_of(model, name):
    node = next(n for n in model.graph.nodes if n.name == name)
    return [v.producer().op_type if v is not None and v.producer() else None for v in node.inputs]


def test_pairs_go_in_front_of_every_layer_operand():
    model = small_conv_model()
    simulated = simulate_quantized(model, calibrate(model, random_batches(2), "minmax"))
    ops = [n.op_type for n in simulated.graph.nodes]
    assert ops.count("QuantizeLinear") == ops.count("DequantizeLinear") == 8  # 4 activations + 4 weights
    for layer in ("conv1", "conv2", "fc", "head"):
        assert inputs_of(simulated, layer)[:2] == ["DequantizeLinear", "DequantizeLinear"], layer
    assert inputs_of(simulated, "conv1")[2] is None  # the bias stays float
    axes = {n.inputs[0].name: n.attributes.get("axis") for n in simulated.graph.nodes if n.op_type == "QuantizeLinear"}
    assert axes == {"x": None, "w1": 0, "r1": None, "w2": 0, "f": None, "w3": 0, "g": None, "w4": 1}
    assert len(model.graph.nodes) == 6  # the original is untouched


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_output_is_close_to_float(device):
    """Eight tensors are quantized, each with minmax steps of about 4σ/127 (rounding noise ≈ 1% of its rms):
    the output stays within a few percent of float, with the direction of each output row nearly kept."""
    model = small_conv_model()
    batches = random_batches(4, batch=4)
    simulated = simulate_quantized(model, calibrate(model, batches, "minmax", device=device))
    float_run, int8_run = Executor(model, device), Executor(simulated, device)
    for feed in batches:
        expected = float_run.run(feed)["y"].cpu().numpy()
        actual = int8_run.run(feed)["y"].cpu().numpy()
        assert 0 < relative_error(actual, expected) < 0.06
        cosine = (actual * expected).sum(1) / np.linalg.norm(actual, axis=1) / np.linalg.norm(expected, axis=1)
        assert cosine.min() > 0.998


def test_matches_a_hand_written_int8_emulation():
    """Every fake-quantized tensor equals a hand-written `clip(round(x / s), −128, 127) · s` of the float tensor the
    simulated model computed (bit for bit), and each layer computes its float op on those tensors. (Layer by
    layer, because two float convolutions may round differently in the last bit, which can flip a later
    rounding by one step.)"""
    model = small_conv_model()
    batches = random_batches(2)
    table = calibrate(model, batches, "mse")
    weights = {name: v.const for name, v in model.graph.initializers.items()}

    def fake(x, scale):  # scale broadcasts against x; ONNX's int8 QuantizeLinear saturates to [-128, 127]
        return torch.clamp(torch.round(x / scale), -128, 127) * scale

    def per_channel(w, axis):
        amax = w.abs().amax(dim=[d for d in range(w.dim()) if d != axis], keepdim=True)
        return fake(w, (amax.double() / 127).float())  # the scale rounded once from the exact quotient

    simulated = simulate_quantized(model, table)
    names = [v.name for n in simulated.graph.nodes for v in n.outputs]
    executor = Executor(_observing(simulated, names))
    for feed in batches:
        seen = executor.run(feed)
        fq = {name.split(".fake_quant")[0]: seen[name] for name in names if ".fake_quant" in name}
        for name in ("x", "r1", "f", "g"):
            scale = torch.tensor(table.ranges[name].scale, dtype=torch.float32)
            source = torch.from_numpy(feed["x"]) if name == "x" else seen[name]
            torch.testing.assert_close(fq[name], fake(source, scale), rtol=0, atol=0)
        for layer, weight, axis in (("conv1", "w1", 0), ("conv2", "w2", 0), ("fc", "w3", 0), ("head", "w4", 1)):
            torch.testing.assert_close(fq[f"{layer}.w1"], per_channel(weights[weight], axis), rtol=0, atol=0)
        c1 = F.conv2d(fq["x"], fq["conv1.w1"], weights["b1"], padding=1)
        torch.testing.assert_close(seen["c1"], c1, rtol=1e-5, atol=1e-6)
        c2 = F.conv2d(fq["r1"], fq["conv2.w1"], padding=1, stride=2)
        torch.testing.assert_close(seen["c2"], c2, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(seen["g"], fq["f"] @ fq["fc.w1"].T + weights["b3"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(seen["y"], fq["g"] @ fq["head.w1"], rtol=1e-5, atol=1e-6)


def test_int8_round_trip_is_exact_on_the_grid():
    """Activations and weights already on their int8 grids (power-of-two scales) pass Q/DQ unchanged."""
    rng = np.random.default_rng(0)
    channel_scales = 2.0 ** -np.arange(3, 7)
    w = rng.integers(-127, 128, (4, 3, 3, 3)) * channel_scales[:, None, None, None]
    w[:, 0, 0, 0] = 127 * channel_scales  # each channel reaches its maximum
    initializers = [numpy_helper.from_array(w.astype(np.float32), "w")]
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    proto = make_model([node], [tensor_info("x", [1, 3, 5, 5])], [tensor_info("y", [1, 4, 3, 3])], 17, initializers)
    model = import_model(proto)
    x = rng.integers(-127, 128, (1, 3, 5, 5)).astype(np.float32) / 16
    x[0, 0, 0, 0] = 127 / 16
    simulated = simulate_quantized(model, calibrate(model, [{"x": x}], "minmax"))
    observed = [v.name for n in simulated.graph.nodes if n.op_type != "Conv" for v in n.outputs]
    results = Executor(_observing(simulated, observed)).run({"x": x})
    int8_values = [results[name] for name in observed if name.endswith(".int8") or ".int8__" in name]
    assert int8_values and all(t.dtype == torch.int8 and t.abs().max() == 127 for t in int8_values)
    torch.testing.assert_close(results["y"], Executor(model).run({"x": x})["y"], rtol=0, atol=0)


def test_keep_float_leaves_named_layers_alone():
    model = small_conv_model()
    table = calibrate(model, random_batches(2), "minmax")
    simulated = simulate_quantized(model, table, keep_float=["conv2", "head"])
    assert inputs_of(simulated, "conv2")[:2] == ["Relu", None]
    assert inputs_of(simulated, "head")[:2] == ["Gemm", None]
    assert inputs_of(simulated, "fc")[:2] == ["DequantizeLinear", "DequantizeLinear"]
    with pytest.raises(InputError, match=r"keep_float names unknown layers \['conv9'\]; the quantizable layers are"):
        simulate_quantized(model, table, keep_float=["conv9"])


def test_old_opsets_get_tensorforge_domain_qdq_with_the_same_numerics():
    old, new = small_conv_model(opset=11), small_conv_model(opset=17)
    batches = random_batches(2)
    sim_old = simulate_quantized(old, calibrate(old, batches, "entropy"))
    sim_new = simulate_quantized(new, calibrate(new, batches, "entropy"))
    assert {n.domain for n in sim_old.graph.nodes if "Quantize" in n.op_type} == {"tensorforge"}
    assert {n.domain for n in sim_new.graph.nodes if "Quantize" in n.op_type} == {""}
    assert sim_old.opset_imports["tensorforge"] == 1
    for feed in batches:
        torch.testing.assert_close(Executor(sim_old).run(feed)["y"], Executor(sim_new).run(feed)["y"], rtol=0, atol=0)


def test_tables_from_other_models_are_refused():
    model = small_conv_model()
    table = calibrate(small_conv_model(seed=5), random_batches(1), "minmax")
    with pytest.raises(InputError, match="calibration table was computed for another model"):
        simulate_quantized(model, table)
    table = calibrate(model, random_batches(1), "minmax")
    del table.ranges["r1"]
    with pytest.raises(InputError, match="no range for tensor 'r1'"):
        simulate_quantized(model, table)
    table.ranges["r1"] = TensorRange(1.0, 1.0 / 127)
    assert simulate_quantized(model, table) is not None


def test_duplicate_layer_names_are_refused():
    model = small_conv_model()
    model.graph.nodes[2].name = "conv1"
    with pytest.raises(GraphError, match=r"layers \['conv1'\] share a name"):
        calibrate(model, random_batches(1), "minmax")


def test_fp8_pairs_round_to_e4m3_with_amax_over_448():
    """Each fp8 pair stores E4M3 with zero point 0 and scale `amax / 448`; every fake-quantized activation is a
    multiple of its scale by an E4M3 value."""
    model = small_conv_model()
    table = calibrate(model, random_batches(2), "minmax")
    simulated = simulate_quantized(model, table, quant="fp8e4m3")
    quantize = [n for n in simulated.graph.nodes if n.op_type == "QuantizeLinear"]
    assert len(quantize) == 8 and {n.outputs[0].dtype for n in quantize} == {DType.FLOAT8E4M3FN}
    x_scale = next(n for n in quantize if n.inputs[0].name == "x").inputs[1].const
    assert float(x_scale) == pytest.approx(table.ranges["x"].amax / 448, rel=1e-6)
    (fake_x,) = [v.name for n in simulated.graph.nodes for v in n.outputs if v.name.startswith("x.fake_quant")]
    steps = Executor(_observing(simulated, [fake_x])).run(random_batches(1, seed=5)[0])[fake_x] / x_scale
    assert torch.equal(steps, steps.to(torch.float8_e4m3fn).float()) and steps.abs().max() <= 448
    with pytest.raises(InputError, match="unknown quantized type"):
        simulate_quantized(model, table, quant="int4")
