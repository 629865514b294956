"""Explicitly quantized models (ONNX Runtime's QDQ quantizer): Q/DQ pairs fold into QuantizedConv, and the
optimized graph and an engine compute exactly what ONNX Runtime computes on the quantized model."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from tensorforge import Executor
from tensorforge.build.builder import build_engine
from tensorforge.frontend import import_model
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, run_onnxruntime, tensor_info


def _float_model():
    """x[2,3,8,8] → Conv 3→8 (bias) → Relu → Conv 8→8 → + the Relu → Relu."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.normal(0, 0.4, (8, 3, 3, 3)),
        "b1": rng.normal(0, 0.1, 8),
        "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu2"),
    ]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    return make_model(nodes, [tensor_info("x", [2, 3, 8, 8])], [tensor_info("y", [2, 8, 8, 8])], 17, initializers)


class _Batches(CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


def _quantized(tmp_path, *, symmetric: bool, per_channel: bool = True):
    source, target = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(_float_model(), source)
    quantize_static(
        str(source), str(target), _Batches(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8, weight_type=QuantType.QInt8,
        extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True},
    )  # fmt: skip
    return target


def _x(seed=5):
    return np.random.default_rng(seed).normal(0, 1, (2, 3, 8, 8)).astype(np.float32)


def _ort(path, x):
    return run_onnxruntime(str(path), {"x": x}, quantized=True)["y"]


@pytest.mark.parametrize("per_channel", [True, False])
def test_symmetric_int8_qdq_folds_into_quantized_convs_and_matches_onnx_runtime(tmp_path, per_channel):
    path = _quantized(tmp_path, symmetric=True, per_channel=per_channel)
    model, report = optimize(import_model(onnx.load(path)))
    ops = [node.op_type for node in model.graph.nodes]
    assert ops.count("QuantizedConv") == 2 and "FusedConv" not in ops
    assert sum(1 for e in report.fired() if e.rule == "fold-qdq-into-conv") == 2
    conv1 = next(n for n in model.graph.nodes if n.name == "conv1")
    assert conv1.inputs[2].is_const  # the int32 bias folded to float
    assert conv1.attributes["explicit"] == 1
    reason = tactic_by_key("fallback.float-conv").supports(conv1, 1, torch.device("cpu"))
    assert "prescribe" in reason  # the model's Q/DQ fix the arithmetic: no float fallback
    x = _x()
    got = Executor(model).run({"x": x})["y"].numpy()
    np.testing.assert_array_equal(got, _ort(path, x))


def test_an_engine_of_the_quantized_model_matches_onnx_runtime(tmp_path):
    path = _quantized(tmp_path, symmetric=True)
    engine = build_engine(path, effort=0)
    assert [node.op_type for node in engine.model.graph.nodes].count("QuantizedConv") == 2
    x = _x(seed=9)
    got = engine.create_context().run({"x": x})["y"].cpu().numpy()
    want = _ort(path, x)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_asymmetric_activations_are_declined_with_the_reason_and_still_run(tmp_path):
    path = _quantized(tmp_path, symmetric=False)
    model, report = optimize(import_model(onnx.load(path)))
    assert "QuantizedConv" not in [node.op_type for node in model.graph.nodes]
    reasons = {e.detail for e in report.declined("fold-qdq-into-conv")}
    assert any("int8 or fp8e4m3 both" in r or "zero point is not 0" in r for r in reasons), reasons
    x = _x()
    np.testing.assert_allclose(Executor(model).run({"x": x})["y"].numpy(), _ort(path, x), rtol=0, atol=1e-5)


def _depthwise_qdq_model(group: int = 8):
    """x[2,8,6,6] → Q/DQ per channel (axis 1, scales 100× apart) → Conv 3×3 with `group` groups on an int8 weight
    behind its DequantizeLinear (per output channel) → y."""
    rng = np.random.default_rng(3)
    x_scale = np.logspace(-3, -1, 8).astype(np.float32)
    w = rng.integers(-127, 128, (8, 8 // group, 3, 3)).astype(np.int8)
    initializers = [
        numpy_helper.from_array(x_scale, "xs"),
        numpy_helper.from_array(np.zeros(8, np.int8), "xz"),
        numpy_helper.from_array(w, "wq"),
        numpy_helper.from_array(rng.uniform(1e-3, 1e-2, 8).astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], axis=1),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], axis=1),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
        helper.make_node("Conv", ["xf", "w", "b"], ["y"], name="dw", pads=[1, 1, 1, 1], group=group),
    ]
    return make_model(nodes, [tensor_info("x", [2, 8, 6, 6])], [tensor_info("y", [2, 8, 6, 6])], 17, initializers)


def test_per_channel_qdq_on_a_depthwise_input_folds_into_its_channel_scales(tmp_path):
    path = tmp_path / "depthwise.onnx"
    onnx.save(_depthwise_qdq_model(), path)
    model, _ = optimize(import_model(onnx.load(path)))
    (node,) = model.graph.nodes
    assert node.op_type == "QuantizedConv" and node.attributes["x_scale"] == 1.0 and len(node.inputs) == 6
    x = np.random.default_rng(4).normal(0, 0.05, (2, 8, 6, 6)).astype(np.float32) * np.logspace(-1, 1, 8).reshape(
        1, 8, 1, 1
    ).astype(np.float32)
    got = Executor(model).run({"x": x})["y"].numpy()
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_per_channel_activation_scales_of_a_dense_convolution_are_declined():
    model, report = optimize(import_model(_depthwise_qdq_model(group=1)))
    assert "QuantizedConv" not in [node.op_type for node in model.graph.nodes]
    reasons = {e.detail for e in report.declined("fold-qdq-into-conv")}
    assert any("neither per tensor nor per channel of a depthwise" in r for r in reasons), reasons
