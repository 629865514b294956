"""Bad models and bad feeds get clear errors that name what is wrong."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tensorforge import GraphError, InputError, ModelLoadError, OpError, UnsupportedError, load_onnx
from tensorforge.frontend import import_model
from tensorforge.ops import Executor
from tests.helpers import make_model, tensor_info


def _model():
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"])]
    return make_model(
        nodes,
        [tensor_info("x", ["batch", 4]), tensor_info("mask", [2], TensorProto.BOOL)],
        [tensor_info("y", ["batch", 3])],
        initializers=[weight],
    )


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_onnx(tmp_path / "nope.onnx")


def test_file_that_is_not_onnx(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a model\n" * 20)
    with pytest.raises(ModelLoadError, match="notes.onnx"):
        load_onnx(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        load_onnx(path)


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_truncated_model(tmp_path, keep):
    data = _model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises((ModelLoadError, GraphError)) as info:
        load_onnx(path)
    assert "cut.onnx" in str(info.value) or "graph" in str(info.value)


def test_corrupt_bytes(tmp_path):
    data = bytearray(_model().SerializeToString())
    data[10:30] = b"\xff" * 20
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(bytes(data))
    with pytest.raises((ModelLoadError, GraphError)):
        load_onnx(path)


def test_cycle_is_reported_with_its_nodes():
    nodes = [
        helper.make_node("Relu", ["b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Identity", ["a"], ["y"], name="out"),
    ]
    model = make_model(nodes, [], [tensor_info("y", [2])])
    with pytest.raises(GraphError, match=r"cycle.*Relu node 'first'.*Relu node 'second'"):
        import_model(model)


def test_dangling_input_is_reported_with_its_user():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")]
    model = make_model(nodes, [tensor_info("x", [2])], [tensor_info("y", [2])])
    with pytest.raises(GraphError, match="Add node 'add' reads input 1 'ghost', which nothing defines"):
        import_model(model)


def test_type_mismatch_is_reported():
    nodes = [helper.make_node("Add", ["x", "n"], ["y"], name="add")]
    model = make_model(
        nodes, [tensor_info("x", [2]), tensor_info("n", [2], TensorProto.INT64)], [tensor_info("y", [2])]
    )
    with pytest.raises(GraphError, match="Add node 'add': input 1 'n' is int64 but input 0 is float"):
        import_model(model)


def test_every_unsupported_op_is_listed_at_once():
    nodes = [
        helper.make_node("FancyOp", ["x"], ["a"], name="fancy1", domain="com.example"),
        helper.make_node("FancyOp", ["a"], ["b"], name="fancy2", domain="com.example"),
        helper.make_node("OtherOp", ["b"], ["y"], name="other", domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "g", [tensor_info("x", [2])], [tensor_info("y", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedError) as info:
        Executor(import_model(model))
    message = str(info.value)
    assert "2 unsupported op(s)" in message
    assert "com.example::FancyOp (opset 1) not supported: nodes 'fancy1', 'fancy2'" in message
    assert "com.example::OtherOp (opset 1) not supported: nodes 'other'" in message


def test_opset_newer_than_onnx_knows():
    model = _model()
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 5
    with pytest.raises(UnsupportedError, match="opset"):
        import_model(model)


@pytest.fixture
def executor():
    return Executor(import_model(_model()))


def _feeds(**changes):
    feeds = {"x": np.ones((2, 4), np.float32), "mask": np.array([True, False])}
    feeds.update(changes)
    return {k: v for k, v in feeds.items() if v is not None}


def test_missing_input(executor):
    with pytest.raises(InputError, match=r"missing input 'mask' \(bool\[2\]\)"):
        executor.run(_feeds(mask=None))


def test_misnamed_input_gets_a_suggestion(executor):
    feeds = _feeds()
    feeds["X"] = feeds.pop("x")
    with pytest.raises(InputError, match="unknown input 'X'; did you mean 'x'"):
        executor.run(feeds)


def test_extra_input(executor):
    with pytest.raises(InputError, match="unknown input 'extra'"):
        executor.run(_feeds(extra=np.zeros(1, np.float32)))


def test_wrong_rank(executor):
    with pytest.raises(InputError, match=r"input 'x' has shape \[8\] \(rank 1\), the model expects rank 2"):
        executor.run(_feeds(x=np.ones(8, np.float32)))


def test_wrong_static_dim(executor):
    with pytest.raises(InputError, match="input 'x' has size 5 on axis 1, the model expects 4"):
        executor.run(_feeds(x=np.ones((2, 5), np.float32)))


def test_wrong_dtype(executor):
    with pytest.raises(InputError, match="input 'x' has dtype f64, the model expects f32"):
        executor.run(_feeds(x=np.ones((2, 4), np.float64)))


def test_all_feed_problems_are_reported_together(executor):
    with pytest.raises(InputError) as info:
        executor.run({"x": np.ones((2, 4), np.int32), "bogus": np.ones(1)})
    message = str(info.value)
    assert "unknown input 'bogus'" in message and "missing input 'mask'" in message
    assert "dtype i32" in message


def test_inconsistent_symbolic_dims_across_inputs():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    model = make_model(nodes, [tensor_info("a", ["n"]), tensor_info("b", ["n"])], [tensor_info("y", ["n"])])
    with pytest.raises(InputError, match="'n'"):
        Executor(import_model(model)).run({"a": np.ones(3, np.float32), "b": np.ones(4, np.float32)})


def test_op_failure_names_the_node():
    # A failure inside an op at run time (a target shape the data cannot take) names the node and shapes.
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")]
    model = make_model(
        nodes,
        [tensor_info("x", [6]), tensor_info("s", [2], TensorProto.INT64)],
        [tensor_info("y", None)],
    )
    with pytest.raises(OpError, match=r"Reshape node 'reshape' \(ai.onnx::Reshape\) failed on inputs \(f32\[6\]"):
        Executor(import_model(model)).run({"x": torch.ones(6), "s": torch.tensor([4, 4])})
