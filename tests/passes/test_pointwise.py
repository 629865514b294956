import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tensorforge import from_torch
from tensorforge.frontend import import_model
from tensorforge.ops import Executor
from tensorforge.passes import PassManager
from tensorforge.passes.pointwise import FusePointwise, program_of
from tests.helpers import make_model, relative_error, tensor_info
from tests.passes.support import ops


def _optimize(model):
    return PassManager([FusePointwise()]).run(model)


def _assert_same(original, optimized, feeds, tol=1e-5):
    expected = Executor(original).run(feeds)
    actual = Executor(optimized).run(feeds)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        assert actual[name].shape == value.shape, name
        if value.is_floating_point():
            assert relative_error(actual[name].numpy(), value.numpy()) <= tol, name
        else:
            assert torch.equal(actual[name], value), name


def _fused(model):
    return [n for n in model.graph if n.op_type == "FusedPointwise"]


def _random(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3


@pytest.mark.parametrize(
    "module", [torch.nn.SiLU(), torch.nn.Mish(), torch.nn.Sequential(torch.nn.Mish(), torch.nn.SiLU())]
)
def test_swish_and_mish_chains_from_torch(module):
    x = torch.randn(2, 16)
    original = from_torch(module, x)
    model, report = _optimize(from_torch(module, x))
    assert ops(model) == ["FusedPointwise"]
    assert len(report.fired("fuse-pointwise")) == 1
    assert model.graph.outputs[0].name == original.graph.outputs[0].name
    _assert_same(original, model, {"input": _random(2, 16)})


def _shared_interior_model():
    # a = x + b is read by Relu and Sigmoid inside the group, by ReduceSum outside it, and is a graph output.
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Sigmoid", ["a"], ["s"]),
        helper.make_node("Mul", ["r", "s"], ["y"]),
        helper.make_node("ReduceSum", ["a"], ["total"], keepdims=0),
    ]
    bias = numpy_helper.from_array(np.linspace(-1, 1, 4).astype(np.float32), "b")
    outputs = [tensor_info("y", [2, 3, 4]), tensor_info("a", [2, 3, 4]), tensor_info("total", [])]
    return make_model(nodes, [tensor_info("x", [2, 3, 4])], outputs, initializers=[bias])


def test_a_dag_with_a_shared_interior_value_exports_it():
    model, report = _optimize(import_model(_shared_interior_model()))
    (fused,) = _fused(model)
    assert [step[0] for step in program_of(fused)] == ["Add", "Relu", "Sigmoid", "Mul"]
    assert [v.name for v in fused.inputs] == ["x", "b"]  # the broadcast bias initializer is an input
    assert sorted(v.name for v in fused.outputs) == ["a", "y"]
    assert fused.attributes["outputs"] == [2, 5]  # step 0 (a) and step 3 (y), after 2 inputs
    assert [v.name for v in model.graph.outputs] == ["y", "a", "total"]
    assert report.fired("fuse-pointwise")[0].detail.startswith("4 ops (Add+Relu+Sigmoid+Mul)")
    _assert_same(import_model(_shared_interior_model()), model, {"x": _random(2, 3, 4)})


def _cycle_model():
    # e = Exp(Relu(x)) feeds ReduceSum, whose result comes back into Add(e, total): fusing Exp with Add
    # would make the fused node read the ReduceSum that reads the fused node.
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Exp", ["r"], ["e"]),
        helper.make_node("ReduceSum", ["e"], ["total"], keepdims=1),
        helper.make_node("Add", ["e", "total"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["y"]),
    ]
    return make_model(nodes, [tensor_info("x", [3, 5])], [tensor_info("y", [3, 5])])


def test_fusion_never_creates_a_cycle():
    model, report = _optimize(import_model(_cycle_model()))
    assert ops(model) == ["FusedPointwise", "ReduceSum", "FusedPointwise"]
    first, second = _fused(model)
    assert [s[0] for s in program_of(first)] == ["Relu", "Exp"]
    assert [s[0] for s in program_of(second)] == ["Add", "Sigmoid"]
    (event,) = report.declined("fuse-pointwise")
    assert "would create a cycle through ReduceSum" in event.detail
    _assert_same(import_model(_cycle_model()), model, {"x": _random(3, 5)})


def _cast_model():
    # Truncation toward zero by a Cast round trip, then x - trunc(x): the fractional part.
    nodes = [
        helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
        helper.make_node("Cast", ["i"], ["t"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["x", "t"], ["y"]),
    ]
    outputs = [tensor_info("y", [8]), tensor_info("t", [8])]
    return make_model(nodes, [tensor_info("x", [8])], outputs)


def test_casts_fuse_across_element_types():
    model, _ = _optimize(import_model(_cast_model()))
    assert ops(model) == ["FusedPointwise"]
    _assert_same(import_model(_cast_model()), model, {"x": _random(8)}, tol=0)


def _mixed_dtype_model():
    nodes = [
        helper.make_node("Add", ["n", "one"], ["p"]),
        helper.make_node("Abs", ["p"], ["q"]),
        helper.make_node("Pow", ["x", "q"], ["z"]),
        helper.make_node("Neg", ["z"], ["y"]),
    ]
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    inputs = [tensor_info("x", [6]), tensor_info("n", [6], TensorProto.INT64)]
    return make_model(nodes, inputs, [tensor_info("y", [6])], initializers=[one])


def test_an_element_type_change_outside_a_cast_stops_the_group():
    model, report = _optimize(import_model(_mixed_dtype_model()))
    assert ops(model) == ["FusedPointwise", "FusedPointwise"]
    (event,) = report.declined("fuse-pointwise")
    assert event.detail.startswith("'q' is i64 but Pow computes f32")
    assert "not a Cast" in event.detail
    feeds = {"x": _random(6), "n": np.array([0, 1, 2, 1, 0, 2], np.int64)}
    _assert_same(import_model(_mixed_dtype_model()), model, feeds)


def _masked_model(opset=17):
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["m"]),
        helper.make_node("Mul", ["x", "slope"], ["leak"]),
        helper.make_node("Where", ["m", "x", "leak"], ["w"]),
        helper.make_node("Clip", ["w", "low", "high"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(v, np.float32), name)
        for name, v in [("zero", 0), ("slope", 0.1), ("low", -0.2), ("high", 2.5)]
    ]
    return make_model(nodes, [tensor_info("x", [4, 4])], [tensor_info("y", [4, 4])], opset, inits)


def test_masks_and_constant_clip_bounds_fuse():
    model, _ = _optimize(import_model(_masked_model()))
    assert ops(model) == ["FusedPointwise"]
    assert [s[0] for s in program_of(model.graph.nodes[0])] == ["Greater", "Mul", "Where", "Clip"]
    _assert_same(import_model(_masked_model()), model, {"x": _random(4, 4)})


def _clip6_model():
    nodes = [
        helper.make_node("Clip", ["x"], ["c"], min=-1.0),
        helper.make_node("Clip", ["c"], ["d"], max=0.5),
        helper.make_node("Neg", ["d"], ["y"]),
    ]
    return make_model(nodes, [tensor_info("x", [10])], [tensor_info("y", [10])], opset=9)


def test_opset_6_clip_attributes_become_constant_inputs():
    model, _ = _optimize(import_model(_clip6_model()))
    assert ops(model) == ["FusedPointwise"]
    _assert_same(import_model(_clip6_model()), model, {"x": _random(10)})


def test_clip_with_a_computed_bound_is_not_fused():
    nodes = [
        helper.make_node("Neg", ["x"], ["n"]),
        helper.make_node("Clip", ["n", "low"], ["c"]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    inputs = [tensor_info("x", [5]), tensor_info("low", [])]
    model, report = _optimize(import_model(make_model(nodes, inputs, [tensor_info("y", [5])])))
    assert ops(model) == ["Neg", "Clip", "Relu"]
    assert [e.detail for e in report.declined("fuse-pointwise")] == ["Clip bounds are not constant"]
    assert not report.fired()


def test_a_single_op_is_left_alone():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceMax", ["r"], ["y"], keepdims=1)]
    model, report = _optimize(import_model(make_model(nodes, [tensor_info("x", [5])], [tensor_info("y", [1])])))
    assert ops(model) == ["Relu", "ReduceMax"]
    assert not report.fired()


def test_an_interior_graph_output_keeps_its_name():
    nodes = [
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("Log", ["e"], ["l"]),
        helper.make_node("Tanh", ["l"], ["y"]),
    ]
    outputs = [tensor_info("y", [3]), tensor_info("e", [3])]
    proto = make_model(nodes, [tensor_info("x", [3])], outputs)
    model, _ = _optimize(import_model(proto))
    (fused,) = _fused(model)
    assert [v.name for v in model.graph.outputs] == ["y", "e"]
    assert {v.name for v in fused.outputs} == {"y", "e"}
    _assert_same(import_model(proto), model, {"x": _random(3)})
