"""model_to_dict / model_from_dict: a lossless round trip through strict JSON and safetensors, clear errors."""

import json
import math
import struct

import numpy as np
import onnx
import pytest
import safetensors.torch
import torch
from onnx import TensorProto, helper, numpy_helper

from tensorforge import Executor, GraphError, zoo
from tensorforge.frontend import import_model
from tensorforge.ir import DType, Graph, Model, Node, Value, format_graph, model_from_dict, model_to_dict
from tensorforge.ops.fused import DOMAIN
from tensorforge.passes.pipeline import optimize
from tests.helpers import make_model, tensor_info


def _round_trip(model: Model) -> Model:
    """Through the bytes an engine file would hold: strict UTF-8 JSON and a safetensors blob."""
    data, tensors = model_to_dict(model)
    text = json.dumps(data, allow_nan=False, ensure_ascii=False).encode("utf-8")
    blob = safetensors.torch.save({key: tensor.contiguous() for key, tensor in tensors.items()})
    return model_from_dict(json.loads(text), safetensors.torch.load(blob))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _assert_same_item(a, b, mapping):
    assert type(a) is type(b), (a, b)
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_item(x, y, mapping)
    elif isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b)
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape) and torch.equal(_bits(a), _bits(b))
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape, a.tolist()) == (b.dtype, b.shape, b.tolist())
    elif isinstance(a, Graph):
        _assert_same_graph(a, b, mapping)
    else:
        assert a == b


def _assert_same_graph(a: Graph, b: Graph, mapping: dict[Value, Value]) -> None:
    """Same structure, names, types and contents; `mapping` pairs the values seen so far (outer scopes too),
    so a subgraph reading an outer value must read the very copy of that outer value."""

    def define(x: Value, y: Value) -> None:
        assert x not in mapping
        assert (x.name, x.dtype, x.shape, x.doc) == (y.name, y.dtype, y.shape, y.doc)
        assert (x.const is None) == (y.const is None)
        if x.const is not None:
            _assert_same_item(x.const, y.const, mapping)
        mapping[x] = y

    def same(x: Value | None, y: Value | None) -> None:
        assert (x is None and y is None) or mapping[x] is y

    assert (a.name, a.doc, list(a.initializers)) == (b.name, b.doc, list(b.initializers))
    for x, y in zip(_graph_values(a), _graph_values(b), strict=True):
        define(x, y)
    for x, y in zip(a.inputs, b.inputs, strict=True):
        same(x, y)
    assert len(a) == len(b)
    for m, n in zip(a.nodes, b.nodes, strict=True):
        for x, y in zip(m.outputs, n.outputs, strict=True):
            define(x, y)
    for m, n in zip(a.nodes, b.nodes, strict=True):
        assert (m.op_type, m.domain, m.name, m.doc, list(m.attributes)) == (
            n.op_type, n.domain, n.name, n.doc, list(n.attributes),
        )  # fmt: skip
        assert n.graph is b and all(sub.parent is b for sub in n.subgraphs())
        for x, y in zip(m.inputs, n.inputs, strict=True):
            same(x, y)
        for key, attr in m.attributes.items():
            _assert_same_item(attr, n.attributes[key], mapping)
    for x, y in zip(a.outputs, b.outputs, strict=True):
        same(x, y)


def _graph_values(graph: Graph) -> list[Value]:
    return list(dict.fromkeys([*graph.inputs, *graph.initializers.values()]))


def _assert_same_model(a: Model, b: Model) -> None:
    assert (a.opset_imports, a.ir_version, a.producer, a.metadata, a.doc) == (
        b.opset_imports, b.ir_version, b.producer, b.metadata, b.doc,
    )  # fmt: skip
    _assert_same_graph(a.graph, b.graph, {})
    assert format_graph(a.graph) == format_graph(b.graph)


def _float_from_bits(bits: int) -> float:
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0]


def _branch(name: str, outer: Value) -> Graph:
    """A subgraph reading `outer`, with an initializer named "c" (as is every branch's)."""
    c = Value("c", DType.FLOAT, (), const=torch.tensor(2.0))
    out = Value(f"{name}_out", DType.FLOAT, ("batch", 3, None))
    return Graph(name, outputs=[out], nodes=[Node("Mul", [outer, c], [out])], initializers=[c])


def _every_kind_model() -> Model:
    x = Value("x", DType.FLOAT, ("batch", 3, None))
    x.doc = "the input"
    w = Value("w", DType.INT4, (4,), const=torch.tensor([-8, 0, 7, 1], dtype=torch.int8))  # int8 carries int4
    labels = Value("labels", DType.STRING, (2, 1), const=np.array([[b"a"], [b"\xff"]], dtype=object))
    y, z = Value("y", DType.FLOAT, ("batch", 3, None)), Value("z", DType.FLOAT, ("batch", 3, None))
    typed_unused, unused = Value("", DType.FLOAT, (2,)), Value("")
    attributes = {
        "int": 2**62,
        "negative": -7,
        "bool": True,
        "float": 0.1,
        "minus_zero": -0.0,
        "inf": math.inf,
        "minus_inf": -math.inf,
        "nan": math.nan,
        "minus_nan": _float_from_bits(0xFFF8000000000000),
        "nan_payload": _float_from_bits(0x7FF0000000000001),
        "str": "héllo ✓",
        "surrogates": "bad \udcff byte",
        "bytes": b"\x00\xff",
        "empty": [],
        "ints": [1, -2, 3],
        "floats": [1.5, math.inf, -0.0],
        "strs": ["a", "", "\udc80"],
        "float32": torch.randn(2, 3),
        "bfloat16": torch.randn(4).to(torch.bfloat16),
        "float8": torch.randn(4).to(torch.float8_e4m3fn),
        "complex128": torch.randn(3, dtype=torch.complex128),
        "e8m0": torch.tensor([1.0, 4.0]).to(torch.float8_e8m0fnu),
        "scalar": torch.tensor(5, dtype=torch.int64),
        "empty_tensor": torch.zeros(0, 3, dtype=torch.float16),
        "bools": torch.tensor([True, False]),
        "tensors": [torch.arange(3), torch.ones(2, dtype=torch.uint8)],
        "unicode_array": np.array([["ab", "c"]]),
        "bytes_array": np.array([b"x", b"yz"]),
        "type": helper.make_tensor_type_proto(TensorProto.FLOAT, [2, "n"]),
        "types": [helper.make_tensor_type_proto(TensorProto.INT64, [])],
        "sparse": helper.make_sparse_tensor(
            helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0]),
            helper.make_tensor("i", TensorProto.INT64, [2], [0, 3]),
            [4],
        ),
        "graph": _branch("body", x),
        "graphs": [_branch("first", x), _branch("second", w)],
    }
    custom = Node("Custom", [x, None, w, labels], [y, typed_unused, unused], attributes, domain="test.domain", name="n")
    custom.doc = "every kind"
    neg = Node("Neg", [y], [z], name="neg")  # listed before its producer: the order must survive
    graph = Graph("main", [x], [z], [neg, custom], [w, labels])
    graph.doc = "the graph"
    model = Model(graph, {"": 17, "test.domain": 1}, ir_version=9, producer="tests 1.0", metadata={"k": "v"})
    model.doc = "a model"
    return model


def test_every_attribute_kind_and_value_detail_survives():
    model = _every_kind_model()
    copy = _round_trip(model)
    _assert_same_model(model, copy)
    neg, custom = copy.graph.nodes
    assert custom.inputs[1] is None and [v.name for v in custom.outputs] == ["y", "", ""]
    (mul,) = custom.attributes["graph"].nodes
    assert mul.inputs[0] is copy.graph.inputs[0]  # the outer value itself, not a look-alike
    assert custom.attributes["graphs"][1].nodes[0].inputs[0] is copy.graph.initializers["w"]
    assert copy.graph.initializers["w"].dtype == DType.INT4
    assert math.copysign(1.0, custom.attributes["minus_nan"]) == -1.0


def test_tensor_keys_are_unique_and_readable():
    data, tensors = model_to_dict(_every_kind_model())
    assert {"init/w", "init/c", "init/c#2", "init/c#3", "attr/n/float32", "attr/n/tensors#2"} <= set(tensors)
    assert tensors["attr/n/complex128"].dtype == torch.uint8  # safetensors has no complex128: raw bytes
    json.dumps(data, allow_nan=False)


def test_non_finite_floats_are_strict_json():
    x, y = Value("x", DType.FLOAT, (2,)), Value("y", DType.FLOAT, (2,))
    node = Node("Clip", [x], [y], {"bounds": [-math.inf, math.nan], "max": math.inf})
    data, _ = model_to_dict(Model(Graph("g", [x], [y], [node]), {"": 17}))
    text = json.dumps(data, allow_nan=False)
    assert '"0x7ff0000000000000"' in text and '"0xfff0000000000000"' in text


def _if_model() -> onnx.ModelProto:
    """Each branch reads the outer "x" and "one" and holds its own Constant "k" (an initializer after import)."""

    def branch(name: str, op: str, value: float) -> onnx.GraphProto:
        nodes = [
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(value))),
            helper.make_node(op, ["x", "one"], [f"{name}_a"]),
            helper.make_node("Mul", [f"{name}_a", "k"], [f"{name}_out"]),
        ]
        return helper.make_graph(nodes, name, [], [tensor_info(f"{name}_out", ["batch", 2])])

    branches = {"then_branch": branch("then", "Add", 2.0), "else_branch": branch("else", "Sub", 3.0)}
    nodes = [helper.make_node("Relu", ["x0"], ["x"]), helper.make_node("If", ["c"], ["y"], **branches)]
    return make_model(
        nodes,
        [tensor_info("c", [], TensorProto.BOOL), tensor_info("x0", ["batch", 2])],
        [tensor_info("y", ["batch", 2])],
        initializers=[numpy_helper.from_array(np.ones(2, np.float32), "one")],
    )


def _loop_model() -> onnx.ModelProto:
    """The body reads the outer "step" and a Constant; the Loop's optional condition input is absent."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.float32(0.5))),
            helper.make_node("Mul", ["acc_in", "half"], ["scaled"]),
            helper.make_node("Add", ["scaled", "step"], ["acc_out"]),
            helper.make_node("Mul", ["acc_out", "acc_out"], ["scan"]),
        ],
        "body",
        [
            tensor_info("i", [], TensorProto.INT64),
            tensor_info("cond_in", [], TensorProto.BOOL),
            tensor_info("acc_in", [2]),
        ],
        [tensor_info("cond_out", [], TensorProto.BOOL), tensor_info("acc_out", [2]), tensor_info("scan", [2])],
    )
    return make_model(
        [helper.make_node("Loop", ["n", "", "acc0"], ["acc", "scans"], body=body)],
        [tensor_info("n", [], TensorProto.INT64), tensor_info("acc0", [2]), tensor_info("step", [2])],
        [tensor_info("acc", [2]), tensor_info("scans", None)],
    )


def _assert_runs_identically(model: Model, copy: Model, feeds: dict) -> None:
    ours, theirs = Executor(model).run(feeds), Executor(copy).run(feeds)
    assert ours.keys() == theirs.keys()
    for name, expected in ours.items():
        assert torch.equal(theirs[name], expected), name


def test_if_branches_read_outer_values_as_the_same_objects():
    model = import_model(_if_model())
    copy = _round_trip(model)
    _assert_same_model(model, copy)
    relu, if_node = copy.graph.nodes
    add = if_node.attributes["then_branch"].nodes[0]
    assert add.inputs[0] is relu.outputs[0] and add.inputs[1] is copy.graph.initializers["one"]
    for cond in (True, False):
        _assert_runs_identically(model, copy, {"c": torch.tensor(cond), "x0": torch.randn(3, 2)})


def test_loop_body_reads_outer_values_as_the_same_objects():
    model = import_model(_loop_model())
    copy = _round_trip(model)
    _assert_same_model(model, copy)
    (loop,) = copy.graph.nodes
    assert loop.inputs[1] is None
    add = next(node for node in loop.attributes["body"].nodes if node.op_type == "Add")
    assert add.inputs[1] is copy.graph.inputs[2]
    for trips in (0, 3):
        feeds = {"n": torch.tensor(trips), "acc0": torch.randn(2), "step": torch.randn(2)}
        _assert_runs_identically(model, copy, feeds)


def test_string_initializers_survive():
    strings = numpy_helper.from_array(np.array(["a", "bé", ""], dtype=object), "labels")
    proto = make_model(
        [helper.make_node("Identity", ["labels"], ["y"])],
        [],
        [tensor_info("y", [3], TensorProto.STRING)],
        initializers=[strings],
    )
    model = import_model(proto)
    copy = _round_trip(model)
    _assert_same_model(model, copy)
    assert copy.graph.initializers["labels"].const.tolist() == ["a", "bé", ""]
    assert Executor(copy).run({})["y"].tolist() == ["a", "bé", ""]


@pytest.mark.parametrize("name", ["inception", "mobilenetv3", "transformer"])
def test_optimized_zoo_models_run_bit_identically_after_the_round_trip(name):
    model, _ = optimize(import_model(zoo.export(name)))
    fused = [node for node in model.graph.nodes if node.domain == DOMAIN]
    assert fused and any(isinstance(a, str) for node in fused for a in node.attributes.values())
    copy = _round_trip(model)
    _assert_same_model(model, copy)  # before running: the executor sorts the graphs it plans
    feeds = {"input": torch.randn(zoo.input_shape(name, batch=2))}
    _assert_runs_identically(model, copy, feeds)


# -- malformed input -------------------------------------------------------------------------------------


def _small():
    """A serialized Relu(x) · w, with a float attribute on the Mul."""
    x, w = Value("x", DType.FLOAT, ("n", 2)), Value("w", DType.FLOAT, (2,), const=torch.ones(2))
    a, y = Value("a", DType.FLOAT, ("n", 2)), Value("y", DType.FLOAT, ("n", 2))
    nodes = [Node("Relu", [x], [a], name="relu"), Node("Mul", [a, w], [y], {"scale": 0.5, "data": b"z"}, name="mul")]
    return model_to_dict(Model(Graph("g", [x], [y], nodes, [w]), {"": 17}))


def _set(path, value):
    def mutate(data, tensors):
        *parents, last = path
        target = data
        for key in parents:
            target = target[key]
        target[last] = value

    return mutate


def _drop(path):
    def mutate(data, tensors):
        *parents, last = path
        target = data
        for key in parents:
            target = target[key]
        del target[last]

    return mutate


def _clear_tensors(data, tensors):
    tensors.clear()


def _halve_tensor(data, tensors):
    tensors["init/w"] = tensors["init/w"].half()


_NODES = ("graph", "nodes")
_MALFORMED = {
    "format version": (_set(("format_version",), 2), "format version 2; this tensorforge reads version 1"),
    "unknown dtype": (
        _set(("graph", "values", 0, "dtype"), "FLOAT128"),
        r"graph 'g', values\[0\] 'x' has the unknown element type 'FLOAT128'",
    ),
    "missing tensor": (_clear_tensors, "the tensor 'init/w' is missing from the weights"),
    "tensor of another dtype": (
        _halve_tensor,
        r"'init/w' in the weights is torch.float16 \[2\], expected torch.float32",
    ),
    "undefined input": (
        _set((*_NODES, 1, "inputs", 0), "nowhere"),
        r"graph 'g', node 1 \(Mul 'mul'\), input 0 names the value 'nowhere', which is not defined in its scope",
    ),
    "undefined graph output": (_set(("graph", "outputs", 0), "a_typo"), "output names the value 'a_typo'"),
    "op type of the wrong type": (_set((*_NODES, 0, "op_type"), 3), "'op_type' must be a string, got 3"),
    "missing nodes": (_drop(("graph", "nodes")), "graph 'g' has no 'nodes'"),
    "graph not an object": (_set(("graph",), [1]), r"'graph' must be an object, got \[1\]"),
    "unknown attribute kind": (
        _set((*_NODES, 1, "attributes", "scale", "kind"), "pickle"),
        r"attribute 'scale' has the unknown kind 'pickle'",
    ),
    "bool for an int": (_set(("ir_version",), True), "'ir_version' must be an integer, got True"),
    "float spelled as a word": (_set((*_NODES, 1, "attributes", "scale", "value"), "nan"), "a float, or its bits"),
    "bad base64": (_set((*_NODES, 1, "attributes", "data", "value"), "!!"), "attribute 'data' is not base64"),
    "fractional dim": (_set(("graph", "values", 0, "shape", 0), 2.5), "dim 0 must be an integer or a string or null"),
    "value defined twice": (_set((*_NODES, 1, "outputs", 0, "name"), "a"), r"output 0 'a' is defined twice"),
}


@pytest.mark.parametrize("case", list(_MALFORMED))
def test_malformed_input_gets_a_graph_error_saying_what_and_where(case):
    mutate, message = _MALFORMED[case]
    data, tensors = _small()
    mutate(data, tensors)
    with pytest.raises(GraphError, match=message):
        model_from_dict(data, tensors)


def test_not_a_dict_gets_a_graph_error():
    with pytest.raises(GraphError, match="the serialized model must be an object"):
        model_from_dict([], {})


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ((1, 2), "attribute 'a' of Relu node 'r' is a tuple, which cannot be stored"),
        ([1, 2.0], "attribute 'a' of Relu node 'r' is a list mixing float, int"),
    ],
)
def test_attributes_that_cannot_be_stored_are_refused_when_saving(attr, message):
    x, y = Value("x", DType.FLOAT, (2,)), Value("y", DType.FLOAT, (2,))
    model = Model(Graph("g", [x], [y], [Node("Relu", [x], [y], {"a": attr}, name="r")]), {"": 17})
    with pytest.raises(GraphError, match=message):
        model_to_dict(model)


def test_a_value_its_scope_does_not_define_is_refused_when_saving():
    x, z = Value("x", DType.FLOAT, (2,)), Value("z", DType.FLOAT, (2,))
    stray = Value("x", DType.FLOAT, (2,))  # a second value named "x", read but defined nowhere
    model = Model(Graph("g", [x], [z], [Node("Add", [x, stray], [z], name="add")]), {"": 17})
    with pytest.raises(GraphError, match="Add node 'add' reads the value 'x', which is not the one its scope defines"):
        model_to_dict(model)
