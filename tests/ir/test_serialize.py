"""The JSON + tensors form of a model: a lossless round trip, and clear errors for malformed input."""

import json
import math

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge import Executor, GraphError, zoo
from tensorforge.frontend import import_model
from tensorforge.ir import DType, Graph, Model, Node, Value, format_graph
from tensorforge.ir.serialize import model_from_dict, model_to_dict
from tensorforge.passes.pipeline import optimize
from tests.helpers import make_model, tensor_info


def _round_trip(model: Model) -> Model:
    data, tensors = model_to_dict(model)
    text = json.dumps(data, allow_nan=False)  # strict JSON: no inf/nan literals
    return model_from_dict(json.loads(text), tensors)


def test_every_attribute_kind_and_value_detail_survives():
    x = Value("x", DType.FLOAT, ("batch", 3, None))
    w = Value("w", DType.INT4, (4,), const=torch.tensor([-8, 0, 7, 1], dtype=torch.int8))
    y, unused = Value("y", DType.FLOAT, ("batch", 3, None)), Value("", DType.FLOAT)
    attributes = {
        "i": 3, "f": 0.1, "b": True, "s": "text", "inf": math.inf, "nan": math.nan, "ints": [1, -2], "floats": [1.5],
        "strs": ["a", "b"], "t": torch.arange(6, dtype=torch.float16).reshape(2, 3),
        "strings": np.array([["a", "bc"]], dtype=object), "none": None, "raw": b"\x00\xff",
        "type": helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [2]),
    }  # fmt: skip
    node = Node("Custom", [x, None, w], [y, unused], attributes, domain="test.domain", name="n0")
    node.doc = "a node"
    graph = Graph("g", [x], [y], [node], [w])
    model = Model(graph, {"": 17, "test.domain": 1}, ir_version=9, producer="tests", metadata={"k": "v"})
    copy = _round_trip(model)
    (back,) = copy.graph.nodes
    assert back.inputs[1] is None and back.outputs[1].name == "" and back.doc == "a node"
    assert copy.graph.inputs[0].shape == ("batch", 3, None) and copy.graph.initializers["w"].dtype == DType.INT4
    assert torch.equal(copy.graph.initializers["w"].const, w.const)
    a = back.attributes
    assert a["i"] == 3 and type(a["i"]) is int and a["b"] is True and type(a["f"]) is float and a["f"] == 0.1
    assert a["inf"] == math.inf and math.isnan(a["nan"]) and a["none"] is None and a["raw"] == b"\x00\xff"
    assert a["t"].dtype == torch.float16 and torch.equal(a["t"], attributes["t"])
    assert a["strings"].tolist() == [["a", "bc"]] and a["type"] == attributes["type"]
    assert (copy.opset_imports, copy.ir_version, copy.producer, copy.metadata) == (
        model.opset_imports, 9, "tests", {"k": "v"},
    )  # fmt: skip


def test_subgraphs_read_outer_values_as_the_same_objects():
    then_branch = helper.make_graph([helper.make_node("Add", ["x", "one"], ["t"])], "then", [], [tensor_info("t", [2])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor_info("e", [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    proto = make_model(
        nodes,
        [tensor_info("c", [], onnx.TensorProto.BOOL), tensor_info("x", [2])],
        [tensor_info("y", [2])],
        initializers=[numpy_helper.from_array(np.ones(2, np.float32), "one")],
    )
    model = import_model(proto)
    copy = _round_trip(model)
    (if_node,) = copy.graph.nodes
    (add,) = if_node.attributes["then_branch"].nodes
    assert add.inputs[0] is copy.graph.inputs[1] and add.inputs[1] is copy.graph.initializers["one"]
    feeds = {"c": torch.tensor(True), "x": torch.randn(2)}
    assert torch.equal(Executor(copy).run(feeds)["y"], Executor(model).run(feeds)["y"])
    assert format_graph(copy.graph) == format_graph(model.graph)


def test_string_initializers_survive():
    strings = numpy_helper.from_array(np.array(["a", "b"], dtype=object), "labels")
    proto = make_model(
        [helper.make_node("Identity", ["labels"], ["y"])],
        [],
        [tensor_info("y", [2], onnx.TensorProto.STRING)],
        initializers=[strings],
    )
    copy = _round_trip(import_model(proto))
    assert copy.graph.initializers["labels"].const.tolist() == ["a", "b"]


@pytest.mark.parametrize("name", ["mobilenetv3", "transformer"])
def test_optimized_zoo_models_run_bit_identically_after_the_round_trip(name):
    model, _ = optimize(import_model(zoo.export(name)))
    copy = _round_trip(model)
    assert format_graph(copy.graph) == format_graph(model.graph)
    feeds = {"input": torch.randn(zoo.input_shape(name))}
    assert torch.equal(Executor(copy).run(feeds)["output"], Executor(model).run(feeds)["output"])


def _serialized():
    x, y = Value("x", DType.FLOAT, (2,)), Value("y", DType.FLOAT, (2,))
    return model_to_dict(Model(Graph("g", [x], [y], [Node("Relu", [x], [y])]), {"": 17}))


def test_malformed_input_gets_a_graph_error_that_says_what():
    data, tensors = _serialized()
    data["graph"]["nodes"][0]["inputs"] = ["nowhere"]
    with pytest.raises(GraphError, match="names value 'nowhere', which is not defined"):
        model_from_dict(data, tensors)
    data, tensors = _serialized()
    data["graph"]["values"][0]["dtype"] = "FLOAT128"
    with pytest.raises(GraphError, match="unknown element type 'FLOAT128'"):
        model_from_dict(data, tensors)
    data, tensors = _serialized()
    del data["graph"]["nodes"]
    with pytest.raises(GraphError, match="malformed"):
        model_from_dict(data, tensors)
    data, _ = model_to_dict(import_model(zoo.export("transformer")))
    with pytest.raises(GraphError, match="which the weights do not hold"):
        model_from_dict(data, {})
