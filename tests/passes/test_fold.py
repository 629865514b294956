import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.frontend.torch_import import export_onnx
from tensorforge.ir import DType
from tensorforge.ops import Executor
from tensorforge.passes import PassManager, fold
from tensorforge.passes.fold import ConstantFolding, DeadCodeElimination
from tests.helpers import make_model, relative_error, tensor_info
from tests.passes.support import init, ops, optimize_and_compare

PASSES = (ConstantFolding(), DeadCodeElimination())


def _optimize(proto: onnx.ModelProto, feeds_list, passes=PASSES):
    """Optimize an import of `proto` and compare it with an unoptimized import on every feeds dict."""
    return optimize_and_compare(proto, feeds_list, passes)


def test_folds_a_constant_subgraph(rng):
    nodes = [
        helper.make_node("Add", ["a", "b"], ["c"]),
        helper.make_node("Sqrt", ["c"], ["d"]),
        helper.make_node("Mul", ["x", "d"], ["y"]),
    ]
    inits = [init("a", rng.random((3, 4), np.float32)), init("b", rng.random((3, 4), np.float32))]
    proto = make_model(nodes, [tensor_info("x", [3, 4])], [tensor_info("y", [3, 4])], initializers=inits)
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32)}
    model, report = _optimize(proto, [feeds])
    assert ops(model) == ["Mul"]
    assert len(report.fired("fold-constant")) == 2
    assert set(model.graph.initializers) == {"d"}  # a, b and c are gone: dead-code elimination
    assert model.graph.initializers["d"].shape == (3, 4)


def test_a_folded_graph_output_keeps_its_name_and_type():
    nodes = [
        helper.make_node("Add", ["a", "b"], ["c"]),
        helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT16),
        helper.make_node("Neg", ["x"], ["z"]),
    ]
    inits = [init("a", np.arange(6, dtype=np.float32)), init("b", np.ones(6, np.float32))]
    outputs = [tensor_info("y", [6], TensorProto.FLOAT16), tensor_info("z", [2])]
    proto = make_model(nodes, [tensor_info("x", [2])], outputs, initializers=inits)
    model, report = _optimize(proto, [{"x": np.array([1, -2], np.float32)}])
    assert [v.name for v in model.graph.outputs] == ["y", "z"]
    y = model.graph.outputs[0]
    assert y.dtype == DType.FLOAT16 and y.const is not None and y.producer() is None
    assert ops(model) == ["Neg"]


def test_multiple_outputs_and_zero_input_nodes_fold():
    nodes = [
        helper.make_node("Constant", [], ["k"], value_ints=[4, 6]),
        helper.make_node("Split", ["k"], ["k0", "k1"], axis=0),
        helper.make_node("Add", ["x", "k0"], ["s"]),
        helper.make_node("Mul", ["s", "k1"], ["y"]),
    ]
    proto = make_model(nodes, [tensor_info("x", [1], TensorProto.INT64)], [tensor_info("y", [1], TensorProto.INT64)])
    model, report = _optimize(proto, [{"x": np.array([3], np.int64)}])
    assert ops(model) == ["Add", "Mul"]
    assert len(report.fired("fold-constant")) == 2  # Constant, then Split (two outputs)


def test_folding_an_identity_of_a_weight_copies_nothing(rng):
    nodes = [
        helper.make_node("Identity", ["w"], ["w2"]),
        helper.make_node("Reshape", ["w", "same"], ["w3"]),
        helper.make_node("Mul", ["x", "w2"], ["m"]),
        helper.make_node("Add", ["m", "w3"], ["y"]),
        helper.make_node("Identity", ["w"], ["z"]),
    ]
    inits = [init("w", rng.random(4, np.float32)), init("same", np.array([4], np.int64))]
    outputs = [tensor_info("y", [4]), tensor_info("z", [4])]
    proto = make_model(nodes, [tensor_info("x", [4])], outputs, initializers=inits)
    model, report = _optimize(proto, [{"x": rng.standard_normal(4).astype(np.float32)}])
    assert ops(model) == ["Mul", "Add"]
    mul, add = model.graph.nodes
    assert mul.inputs[1].name == "w" and add.inputs[1].name == "w"
    assert set(model.graph.initializers) == {"w", "z"}  # the graph output z needs its own copy
    assert len(report.fired("fold-constant")) == 3


def test_random_ops_are_not_folded():
    nodes = [
        helper.make_node("RandomUniformLike", ["c"], ["r"]),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    proto = make_model(
        nodes, [tensor_info("x", [4])], [tensor_info("y", [4])], initializers=[init("c", np.zeros(4, np.float32))]
    )
    model, report = PassManager(list(PASSES)).run(import_model(proto))
    assert ops(model) == ["RandomUniformLike", "Add"]
    (event,) = report.declined("fold-constant")
    assert "random" in event.detail


def test_dequantize_of_a_weight_is_kept():
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale"], ["w"]), helper.make_node("Mul", ["x", "w"], ["y"])]
    inits = [init("q", np.array([1, -2, 3], np.int8)), init("scale", np.array(0.5, np.float32))]
    proto = make_model(nodes, [tensor_info("x", [3])], [tensor_info("y", [3])], initializers=inits)
    model, report = _optimize(proto, [{"x": np.ones(3, np.float32)}])
    assert ops(model) == ["DequantizeLinear", "Mul"]
    assert "quantization scale" in report.declined("fold-constant")[0].detail


def test_training_dropout_is_not_folded():
    nodes = [helper.make_node("Dropout", ["c", "", "t"], ["d"]), helper.make_node("Add", ["x", "d"], ["y"])]
    inits = [init("c", np.ones(4, np.float32)), init("t", np.array(True))]
    proto = make_model(nodes, [tensor_info("x", [4])], [tensor_info("y", [4])], initializers=inits)
    model, report = PassManager(list(PASSES)).run(import_model(proto))
    assert "Dropout" in ops(model)
    assert "training_mode is true" in report.declined("fold-constant")[0].detail


def test_broadcast_fills_stay_lazy(rng):
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Expand", ["one", "shape"], ["wide"]),
        helper.make_node("Add", ["big", "wide"], ["s"]),
        helper.make_node("ReduceSum", ["s"], ["y"], keepdims=0),
    ]
    inits = [init("shape", np.array([1024, 1025], np.int64)), init("one", np.ones((1, 1), np.float32))]
    proto = make_model(nodes, [], [tensor_info("y", [])], initializers=inits)
    model, report = PassManager(list(PASSES)).run(import_model(proto))
    assert ops(model) == ["ConstantOfShape", "Expand", "Add", "ReduceSum"]
    reasons = [e.detail for e in report.declined("fold-constant")]
    assert len(reasons) == 2 and all("stays lazy" in r for r in reasons)
    assert Executor(model).run({})["y"].item() == 2 * 1024 * 1025


def test_huge_results_are_not_folded(monkeypatch, rng):
    monkeypatch.setattr(fold, "MAX_ELEMENTS", 10)
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["x", "c"], ["y"])]
    inits = [init("a", np.ones((4, 4), np.float32)), init("b", np.ones((4, 4), np.float32))]
    proto = make_model(nodes, [tensor_info("x", [4, 4])], [tensor_info("y", [4, 4])], initializers=inits)
    model, report = PassManager(list(PASSES)).run(import_model(proto))
    assert ops(model) == ["Add", "Mul"]
    assert "16 elements (more than 10)" in report.declined("fold-constant")[0].detail


def test_an_op_that_fails_is_left_alone():
    nodes = [helper.make_node("Reshape", ["a", "s"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])]
    inits = [init("a", np.ones(6, np.float32)), init("s", np.array([4, 2], np.int64))]
    proto = make_model(nodes, [tensor_info("x", [4, 2])], [tensor_info("y", [4, 2])], initializers=inits)
    model, report = PassManager(list(PASSES)).run(import_model(proto))
    assert ops(model) == ["Reshape", "Add"]
    assert report.declined("fold-constant")[0].detail.startswith("evaluation failed")


def test_an_initializer_that_is_also_an_input_is_not_a_constant():
    nodes = [helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Add", ["x", "b"], ["y"])]
    inputs = [tensor_info("x", [2]), tensor_info("a", [2])]
    proto = make_model(nodes, inputs, [tensor_info("y", [2])], initializers=[init("a", np.ones(2, np.float32))])
    x = np.array([1, 2], np.float32)
    model, report = _optimize(proto, [{"x": x}, {"x": x, "a": np.array([5, 7], np.float32)}])
    assert ops(model) == ["Neg", "Add"]
    assert "a" in model.graph.initializers


def _shape_chain(shape, extra_nodes=()):
    """y = Reshape(x, [x.shape[0], -1]) written as Shape → Gather → Unsqueeze → Concat, as exporters do."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        *extra_nodes,
    ]
    inits = [
        init("zero", np.array(0, np.int64)),
        init("axes", np.array([0], np.int64)),
        init("minus_one", np.array([-1], np.int64)),
    ]
    return make_model(nodes, [tensor_info("x", shape)], [tensor_info("y", None)], initializers=inits)


def test_static_shape_chains_fold_away(rng):
    proto = _shape_chain([2, 3, 4])
    model, report = _optimize(proto, [{"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}])
    assert ops(model) == ["Reshape"]
    assert len(report.fired("fold-shape")) == 1 and len(report.fired("fold-constant")) == 3
    target = model.graph.nodes[0].inputs[1]
    assert target.const.tolist() == [2, -1]


def test_dynamic_dims_do_not_fold(rng):
    proto = _shape_chain(["N", 3, 4])
    feeds = [{"x": rng.standard_normal((n, 3, 4)).astype(np.float32)} for n in (1, 2, 5)]
    model, report = _optimize(proto, feeds)
    assert ops(model) == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    assert not report.fired()
    assert "dims 'N' are dynamic" in report.declined("fold-shape")[0].detail
    assert "dims 'N' are dynamic" in report.declined("fold-shape-element")[0].detail


def test_a_static_dim_of_a_dynamic_shape_folds(rng):
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "index"], ["dims"], axis=0),
        helper.make_node("ReduceProd", ["dims"], ["cols"], keepdims=1),
        helper.make_node("Concat", ["minus_one", "cols"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [init("index", np.array([1, -1], np.int64)), init("minus_one", np.array([-1], np.int64))]
    proto = make_model(nodes, [tensor_info("x", ["N", 3, 4])], [tensor_info("y", None)], initializers=inits)
    feeds = [{"x": rng.standard_normal((n, 3, 4)).astype(np.float32)} for n in (1, 2, 5)]
    model, report = _optimize(proto, feeds)
    assert ops(model) == ["Reshape"]
    assert report.fired("fold-shape-element")[0].detail == "dims [3, 4]"
    assert model.graph.nodes[0].inputs[1].const.tolist() == [-1, 12]


def test_an_out_of_range_shape_index_is_left_alone():
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "index"], ["y"], axis=0),
    ]
    proto = make_model(
        nodes,
        [tensor_info("x", ["N", 3])],
        [tensor_info("y", None, TensorProto.INT64)],
        initializers=[init("index", np.array(5, np.int64))],
    )
    model, report = PassManager(list(PASSES)).run(import_model(proto))
    assert ops(model) == ["Shape", "Gather"]
    assert "out of range" in report.declined("fold-shape-element")[0].detail


def test_shape_with_start_end_folds_its_static_part(rng):
    nodes = [
        helper.make_node("Shape", ["x"], ["tail"], start=1),
        helper.make_node("Shape", ["x"], ["head"], end=1),
        helper.make_node("Size", ["x"], ["size"]),
        helper.make_node("Concat", ["head", "tail"], ["y"], axis=0),
        helper.make_node("Add", ["tail", "one"], ["z"]),
    ]
    outputs = [tensor_info("y", [3], TensorProto.INT64), tensor_info("z", [2], TensorProto.INT64)]
    outputs.append(tensor_info("size", [], TensorProto.INT64))
    proto = make_model(
        nodes, [tensor_info("x", ["N", 3, 4])], outputs, opset=15, initializers=[init("one", np.ones(1, np.int64))]
    )
    feeds = [{"x": rng.standard_normal((n, 3, 4)).astype(np.float32)} for n in (1, 3)]
    model, report = _optimize(proto, feeds)
    assert sorted(ops(model)) == ["Concat", "Shape", "Size"]  # head and size stay, tail and z fold
    assert model.graph.outputs[1].const.tolist() == [4, 5]
    assert "dims 'N' are dynamic" in report.declined("fold-size")[0].detail


def test_static_size_folds():
    nodes = [helper.make_node("Size", ["x"], ["n"]), helper.make_node("Cast", ["n"], ["f"], to=TensorProto.FLOAT)]
    nodes.append(helper.make_node("Div", ["x", "f"], ["y"]))
    proto = make_model(nodes, [tensor_info("x", [2, 5])], [tensor_info("y", [2, 5])])
    model, report = _optimize(proto, [{"x": np.ones((2, 5), np.float32)}])
    assert ops(model) == ["Div"] and report.fired("fold-size")


class _Flatten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 5 * 5, 7)

    def forward(self, x):
        y = self.conv(x)
        flat = y.view(y.size(0), -1)
        rows = flat.reshape(-1, y.size(1) * y.size(2) * y.size(3))
        return self.fc(rows)


def test_torch_export_with_a_dynamic_batch_keeps_working(rng):
    torch.manual_seed(0)
    module = _Flatten().eval()
    proto = export_onnx(
        module, torch.randn(2, 3, 5, 5), input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}}
    )
    feeds = [{"x": rng.standard_normal((n, 3, 5, 5)).astype(np.float32)} for n in (1, 2, 7)]
    model, report = _optimize(proto, feeds)
    assert any("dynamic" in e.detail for e in report.declined())  # x.size(0) stays a Shape computation
    assert "Shape" in ops(model)
    assert report.fired("fold-shape-element")  # y.size(1) * y.size(2) * y.size(3) is static
    with torch.no_grad():
        for feed in feeds:
            expected = module(torch.from_numpy(feed["x"]))
            assert relative_error(Executor(model).run(feed)["y"].numpy(), expected.numpy()) <= 1e-5


# -- dead-code elimination ----------------------------------------------------------------------------


def test_dead_nodes_and_initializers_are_removed(rng):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mul", ["r", "w"], ["dead1"]),
        helper.make_node("Neg", ["dead1"], ["dead2"]),
        helper.make_node("Add", ["r", "b"], ["y"]),
    ]
    inits = [init("w", rng.random(3, np.float32)), init("b", rng.random(3, np.float32))]
    proto = make_model(nodes, [tensor_info("x", [3])], [tensor_info("y", [3])], initializers=inits)
    feeds = {"x": rng.standard_normal(3).astype(np.float32)}
    model, report = _optimize(proto, [feeds], passes=[DeadCodeElimination()])
    assert ops(model) == ["Relu", "Add"]
    assert set(model.graph.initializers) == {"b"}
    assert len(report.fired("dead-code-elimination")) == 3  # two nodes and the initializers


def test_subgraphs_are_black_boxes(rng):
    then_branch = helper.make_graph([helper.make_node("Add", ["h", "w"], ["t"])], "then", [], [tensor_info("t", [3])])
    else_branch = helper.make_graph([helper.make_node("Sub", ["h", "w"], ["e"])], "else", [], [tensor_info("e", [3])])
    dead_branch = helper.make_graph([], "dead", [], [tensor_info("v", [3])])
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Neg", ["x"], ["g"]),  # read only by the dead If's subgraph
        helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node(
            "If",
            ["c"],
            ["unused"],
            then_branch=helper.make_graph([helper.make_node("Abs", ["g"], ["a"])], "t2", [], [tensor_info("a", [3])]),
            else_branch=dead_branch,
        ),
    ]
    inits = [init("w", rng.random(3, np.float32)), init("v", rng.random(3, np.float32))]
    inputs = [tensor_info("x", [3]), tensor_info("c", [], TensorProto.BOOL)]
    proto = make_model(nodes, inputs, [tensor_info("y", [3])], initializers=inits)
    x = rng.standard_normal(3).astype(np.float32)
    feeds = [{"x": x, "c": np.array(True)}, {"x": x, "c": np.array(False)}]
    model, report = _optimize(proto, feeds, passes=[DeadCodeElimination()])
    assert ops(model) == ["Relu", "If"]
    assert set(model.graph.initializers) == {"w"}  # read inside the live If; v only by the dead one


def test_a_subgraph_output_that_is_an_outer_initializer_is_kept(rng):
    branch = helper.make_graph([], "b", [], [tensor_info("w", [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "o", [], [tensor_info("n", [3])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)]
    inputs = [tensor_info("x", [3]), tensor_info("c", [], TensorProto.BOOL)]
    proto = make_model(nodes, inputs, [tensor_info("y", [3])], initializers=[init("w", rng.random(3, np.float32))])
    x = rng.standard_normal(3).astype(np.float32)
    model, report = _optimize(proto, [{"x": x, "c": np.array(True)}], passes=[DeadCodeElimination()])
    assert "w" in model.graph.initializers and not report.fired()


@pytest.mark.parametrize("batch", [1, 4])
def test_folding_then_dce_on_an_exported_mlp(batch, rng):
    module = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(5, 2))
    proto = export_onnx(module.eval(), torch.randn(batch, 6), input_names=["x"])
    _optimize(proto, [{"x": rng.standard_normal((batch, 6)).astype(np.float32)}])
