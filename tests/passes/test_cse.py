import numpy as np
import torch
from onnx import TensorProto, helper

from tensorforge.frontend import import_model
from tensorforge.ir.clone import clone_model
from tensorforge.ops import Executor
from tensorforge.passes import PassManager
from tensorforge.passes.cse import CommonSubexpressions, attribute_key
from tests.helpers import make_model, relative_error, tensor_info
from tests.passes.support import init, ops

RNG = np.random.default_rng(0)


def _optimize(proto):
    model = import_model(proto)
    original = clone_model(model)
    optimized, report = PassManager([CommonSubexpressions()]).run(model)
    return original, optimized, report


def _assert_same(original, optimized, feeds):
    expected = Executor(original).run(feeds)
    actual = Executor(optimized).run(feeds)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert relative_error(actual[name].numpy(), value.numpy()) <= 1e-5, name


def test_duplicated_subgraph_and_constants_merge():
    scale = RNG.standard_normal(4).astype(np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["r1"]),
        helper.make_node("Mul", ["r1", "s1"], ["m1"]),
        helper.make_node("Relu", ["x"], ["r2"]),
        helper.make_node("Mul", ["r2", "s2"], ["m2"]),
        helper.make_node("Add", ["m1", "m2"], ["y"]),
    ]
    proto = make_model(
        nodes,
        [tensor_info("x", [2, 4])],
        [tensor_info("y", [2, 4])],
        initializers=[init("s1", scale), init("s2", scale.copy())],
    )
    original, optimized, report = _optimize(proto)
    assert sorted(ops(optimized)) == ["Add", "Mul", "Relu"]
    assert list(optimized.graph.initializers) == ["s1"]
    assert len(report.fired("identical-constants")) == 1
    assert len(report.fired("cse")) == 2
    _assert_same(original, optimized, {"x": RNG.standard_normal((2, 4)).astype(np.float32)})


def test_identical_layers_merge_through_their_copied_weights():
    weight = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(8).astype(np.float32)
    other = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], **conv),
        helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], **conv),
        helper.make_node("Conv", ["x", "w3", "b1"], ["c3"], **conv),  # different weights: stays
        helper.make_node("Add", ["c1", "c2"], ["s"]),
        helper.make_node("Add", ["s", "c3"], ["y"]),
    ]
    inits = [init("w1", weight), init("w2", weight.copy()), init("w3", other)]
    inits += [init("b1", bias), init("b2", bias.copy())]
    proto = make_model(nodes, [tensor_info("x", [1, 3, 6, 6])], [tensor_info("y", [1, 8, 6, 6])], initializers=inits)
    original, optimized, report = _optimize(proto)
    assert ops(optimized).count("Conv") == 2
    assert len(report.fired("identical-constants")) == 2
    assert len(report.fired("cse")) == 1
    _assert_same(original, optimized, {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)})


def test_commutative_operands_are_one_but_subtraction_is_not():
    nodes = [
        helper.make_node("Add", ["a", "b"], ["p"]),
        helper.make_node("Add", ["b", "a"], ["q"]),
        helper.make_node("Sub", ["a", "b"], ["u"]),
        helper.make_node("Sub", ["b", "a"], ["v"]),
        helper.make_node("Mul", ["p", "q"], ["pq"]),
        helper.make_node("Mul", ["u", "v"], ["uv"]),
        helper.make_node("Sum", ["pq", "uv"], ["y"]),
    ]
    proto = make_model(nodes, [tensor_info("a", [3]), tensor_info("b", [3])], [tensor_info("y", [3])])
    original, optimized, report = _optimize(proto)
    assert ops(optimized).count("Add") == 1
    assert ops(optimized).count("Sub") == 2
    feeds = {"a": RNG.standard_normal(3).astype(np.float32), "b": RNG.standard_normal(3).astype(np.float32)}
    _assert_same(original, optimized, feeds)


def test_attributes_are_compared_exactly():
    nodes = [
        helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
        helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.1),
        helper.make_node("LeakyRelu", ["x"], ["c"], alpha=0.1000001),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["f1"], value=helper.make_tensor("v", 1, [1], [2.0])),
        helper.make_node("ConstantOfShape", ["shape"], ["f2"], value=helper.make_tensor("v", 1, [1], [2.0])),
        helper.make_node("ConstantOfShape", ["shape"], ["f3"], value=helper.make_tensor("v", 1, [1], [3.0])),
        helper.make_node("Sum", ["a", "b", "c", "f1", "f2", "f3"], ["y"]),
    ]
    proto = make_model(nodes, [tensor_info("x", [4])], [tensor_info("y", [4])])
    original, optimized, report = _optimize(proto)
    assert ops(optimized).count("LeakyRelu") == 2
    assert ops(optimized).count("ConstantOfShape") == 2
    _assert_same(original, optimized, {"x": RNG.standard_normal(4).astype(np.float32)})


def test_attribute_key_distinguishes_signed_zero_and_types():
    assert attribute_key(0.0) != attribute_key(-0.0)
    assert attribute_key(float("nan")) == attribute_key(float("nan"))
    assert attribute_key(1) != attribute_key(1.0)
    assert attribute_key([1, 2]) == attribute_key([1, 2])


def test_a_duplicate_graph_output_keeps_its_name():
    nodes = [
        helper.make_node("Exp", ["x"], ["e1"]),
        helper.make_node("Exp", ["x"], ["e2"]),
        helper.make_node("Neg", ["e1"], ["y"]),
    ]
    proto = make_model(nodes, [tensor_info("x", [3])], [tensor_info("y", [3]), tensor_info("e2", [3])])
    original, optimized, report = _optimize(proto)
    assert ops(optimized).count("Exp") == 1
    assert [v.name for v in optimized.graph.outputs] == ["y", "e2"]
    _assert_same(original, optimized, {"x": RNG.standard_normal(3).astype(np.float32)})


def test_declines_when_both_are_graph_outputs():
    nodes = [helper.make_node("Exp", ["x"], ["e1"]), helper.make_node("Exp", ["x"], ["e2"])]
    proto = make_model(nodes, [tensor_info("x", [3])], [tensor_info("e1", [3]), tensor_info("e2", [3])])
    original, optimized, report = _optimize(proto)
    assert ops(optimized) == ["Exp", "Exp"]
    events = report.declined("cse")
    assert events and "both 'e1' and 'e2' are graph outputs" in events[0].detail
    _assert_same(original, optimized, {"x": RNG.standard_normal(3).astype(np.float32)})


def test_random_ops_are_never_merged():
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["r1"], seed=1.0),
        helper.make_node("RandomUniformLike", ["x"], ["r2"], seed=1.0),
        helper.make_node("Add", ["r1", "r2"], ["y"]),
    ]
    proto = make_model(nodes, [tensor_info("x", [3])], [tensor_info("y", [3])])
    _, optimized, report = _optimize(proto)
    assert ops(optimized).count("RandomUniformLike") == 2
    assert not report.fired() and not report.declined()


def test_training_dropout_is_not_merged_but_inference_dropout_is():
    def model(training):
        nodes = [
            helper.make_node("Dropout", ["x", "ratio", "mode"], ["d1"]),
            helper.make_node("Dropout", ["x", "ratio", "mode"], ["d2"]),
            helper.make_node("Add", ["d1", "d2"], ["y"]),
        ]
        inits = [init("ratio", np.float32(0.5)), init("mode", np.bool_(training))]
        return make_model(nodes, [tensor_info("x", [3])], [tensor_info("y", [3])], initializers=inits)

    _, optimized, _ = _optimize(model(True))
    assert ops(optimized).count("Dropout") == 2
    original, optimized, _ = _optimize(model(False))
    assert ops(optimized).count("Dropout") == 1
    _assert_same(original, optimized, {"x": RNG.standard_normal(3).astype(np.float32)})


def test_constants_that_are_graph_inputs_or_outputs():
    value = np.arange(3, dtype=np.float32)
    nodes = [
        helper.make_node("Add", ["x", "c_in"], ["a"]),
        helper.make_node("Add", ["a", "c1"], ["y"]),
    ]
    inits = [init("c_in", value), init("c1", value), init("c2", value.copy())]
    proto = make_model(
        nodes,
        [tensor_info("x", [3]), tensor_info("c_in", [3])],  # an overridable initializer
        [tensor_info("y", [3]), tensor_info("c1", [3]), tensor_info("c2", [3])],
        initializers=inits,
    )
    _, optimized, report = _optimize(proto)
    assert set(optimized.graph.initializers) == {"c_in", "c1", "c2"}
    (event,) = report.declined("identical-constants")
    assert "'c2' is a graph output" in event.detail
    assert optimized.graph.nodes[0].inputs[1].name == "c_in"


def test_float_constants_compare_by_bytes_and_dtype():
    nodes = [
        helper.make_node("Add", ["x", "z1"], ["a"]),
        helper.make_node("Add", ["a", "z2"], ["b"]),
        helper.make_node("Cast", ["z3"], ["z3f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["b", "z3f"], ["y"]),
    ]
    inits = [
        init("z1", np.array([0.0], np.float32)),
        init("z2", np.array([-0.0], np.float32)),  # equal value, other bytes
        init("z3", np.array([0.0], np.float64)),  # other dtype
    ]
    proto = make_model(nodes, [tensor_info("x", [1])], [tensor_info("y", [1])], initializers=inits)
    _, optimized, report = _optimize(proto)
    assert len(optimized.graph.initializers) == 3
    assert not report.fired("identical-constants")


def test_nodes_requesting_other_optional_outputs_are_not_merged():
    pool = {"kernel_shape": [2], "strides": [2]}
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p1", ""], **pool),
        helper.make_node("MaxPool", ["x"], ["p2", "indices"], **pool),
        helper.make_node("Add", ["p1", "p2"], ["y"]),
    ]
    outputs = [tensor_info("y", [1, 1, 2]), tensor_info("indices", [1, 1, 2], TensorProto.INT64)]
    proto = make_model(nodes, [tensor_info("x", [1, 1, 4])], outputs)
    original, optimized, _ = _optimize(proto)
    assert ops(optimized).count("MaxPool") == 2
    _assert_same(original, optimized, {"x": RNG.standard_normal((1, 1, 4)).astype(np.float32)})


def test_tensor_keys_of_broadcast_views_equal_their_dense_copies():
    # Folded Expand/ConstantOfShape results can be stride-0 views; their bytes must still be keyed.
    from tensorforge.passes.cse import tensor_key

    scalar_view = torch.tensor(2.0).expand(1)
    assert scalar_view.stride() == (0,)
    assert tensor_key(scalar_view) == tensor_key(torch.tensor([2.0]))
    assert tensor_key(torch.ones(3, 1).expand(3, 4)) == tensor_key(torch.ones(3, 4))
    assert tensor_key(torch.tensor(2.0).expand(1)) != tensor_key(torch.tensor([3.0]))
