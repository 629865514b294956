"""Resize's index tables: computed once per geometry and device (a per-call host-to-device copy would forbid
CUDA-graph capture), and constant float scales infer a static output shape (so the shape arithmetic behind
it folds away)."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from tensorforge import Executor
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tensorforge.ops import resize as resize_module
from tensorforge.ops.infer import infer_model
from tensorforge.passes.pipeline import optimize
from tests.helpers import make_model, relative_error, run_onnxruntime, tensor_info


def _upsample_then_reshape(mode: str = "nearest") -> onnx.ModelProto:
    """Resize ×2 by scales from a Constant node, then a Reshape whose target is computed from the Resize's
    Shape: the graph torch exports for nn.Upsample and a flattened detector head (ONNX's own shape inference
    at import leaves the Resize's output dims unknown)."""
    scales = helper.make_tensor("scales_value", TensorProto.FLOAT, [4], [1.0, 1.0, 2.0, 2.0])
    nodes = [
        helper.make_node("Constant", [], ["scales"], value=scales),
        helper.make_node("Resize", ["x", "", "scales"], ["up"], mode=mode, coordinate_transformation_mode="asymmetric"),
        helper.make_node("Shape", ["up"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["head"]),
        helper.make_node("Concat", ["head", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["up", "target"], ["y"]),
    ]
    ints = [
        helper.make_tensor(name, TensorProto.INT64, [1], [value])
        for name, value in (("zero", 0), ("two", 2), ("minus_one", -1))
    ]
    return make_model(nodes, [tensor_info("x", [1, 3, 5, 6])], [tensor_info("y", None)], opset=17, initializers=ints)


def test_constant_float_scales_give_the_resize_a_static_shape():
    model, _ = optimize(import_model(_upsample_then_reshape()), device="cpu")
    up = next(node for node in model.graph.nodes if node.op_type == "Resize").outputs[0]
    up.shape = ("n", 3, "h", "w")  # as ONNX's inference leaves an exported detector's upsampling
    infer_model(model, check=False)
    assert up.shape == (1, 3, 10, 12)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_the_optimized_graph_has_no_shape_arithmetic_left(mode):
    engine = build_engine(import_model(_upsample_then_reshape(mode)), BuildConfig(device="cpu", effort=0))
    ops = [node.op_type for node in engine.model.graph.nodes]
    assert "Shape" not in ops and "Concat" not in ops, ops
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 6)).astype(np.float32)
    got = engine.create_context().run({"x": x})["y"]
    want = run_onnxruntime(_upsample_then_reshape(mode), {"x": x})["y"]
    assert got.shape == (1, 3, 120) and relative_error(np.asarray(got), want) <= 1e-6


def test_a_second_resize_of_the_same_geometry_reuses_the_tables():
    model = import_model(_upsample_then_reshape("linear"))
    x = torch.randn(1, 3, 5, 6)
    executor = Executor(model)
    first = executor.run({"x": x})["y"]
    before = resize_module._axis_plan.cache_info()
    second = executor.run({"x": x})["y"]
    after = resize_module._axis_plan.cache_info()
    assert torch.equal(first, second)
    assert after.hits >= before.hits + 2 and after.misses == before.misses  # both axes, nothing recomputed


@pytest.mark.gpu
def test_an_engine_with_a_resize_replays_a_cuda_graph():
    """The tables moved to the GPU once: the engine's run is captured (before, every call copied them from
    pageable memory, the capture failed and the engine ran eagerly)."""
    proto = _upsample_then_reshape("nearest")
    engine = build_engine(import_model(proto), BuildConfig(device="cuda", effort=0, precisions=("fp32", "fp16")))
    assert engine.report["plan_selection"][0]["cuda_graph"] == "captured"
    context = engine.create_context()
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 6)).astype(np.float32)
    want = run_onnxruntime(proto, {"x": x})["y"]
    for _ in range(3):  # eager, capture, replay
        got = context.run({"x": x})["y"]
    assert not context.eager_shapes and len(context.captured_shapes) == 1
    assert relative_error(got.float().cpu().numpy(), want) <= 2e-3
