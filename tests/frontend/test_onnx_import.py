import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tensorforge import ModelLoadError, from_torch, load_onnx
from tensorforge.frontend import import_model
from tensorforge.ops import Executor
from tests.helpers import assert_matches_onnxruntime, make_model, tensor_info


def _conv_model(opset=17, weights_as_constant=False):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")]
    if weights_as_constant:
        nodes = [
            helper.make_node("Constant", [], ["w"], value=inits[0], name="cw"),
            helper.make_node("Constant", [], ["b"], value=inits[1], name="cb"),
            *nodes,
        ]
        inits = []
    return make_model(
        nodes, [tensor_info("x", ["batch", 3, 8, 8])], [tensor_info("y", None)], opset, initializers=inits
    )


def test_initializers_become_constant_values():
    model = import_model(_conv_model())
    assert set(model.graph.initializers) == {"w", "b"}
    assert model.graph.initializers["w"].shape == (4, 3, 3, 3)
    assert model.parameter_count() == 4 * 27 + 4


def test_constant_nodes_holding_weights_import_as_initializers(rng):
    proto = _conv_model(weights_as_constant=True)
    model = import_model(proto)
    assert [n.op_type for n in model.graph] == ["Conv"]
    assert model.parameter_count() == 4 * 27 + 4
    assert_matches_onnxruntime(proto, {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)})


def test_dynamic_dims_stay_symbolic_and_accept_any_size(rng):
    proto = _conv_model()
    model = import_model(proto)
    assert model.graph.inputs[0].shape == ("batch", 3, 8, 8)
    for batch in (1, 5):
        assert_matches_onnxruntime(proto, {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)})


def test_external_data_is_read_from_beside_the_model(tmp_path, rng):
    proto = _conv_model()
    path = tmp_path / "model.onnx"
    onnx.save_model(proto, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    model = load_onnx(path)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = Executor(import_model(_conv_model())).run({"x": x})["y"]
    torch.testing.assert_close(Executor(model).run({"x": x})["y"], expected, rtol=0, atol=0)


def test_missing_external_data_file_is_named(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save_model(_conv_model(), path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelLoadError, match="weights.bin"):
        load_onnx(path)


def test_metadata_and_producer_are_kept():
    proto = _conv_model()
    proto.producer_name, proto.producer_version = "exporter", "1.2"
    helper.set_model_props(proto, {"labels": "cat\ndog", "author": "someone"})
    model = import_model(proto)
    assert model.metadata == {"labels": "cat\ndog", "author": "someone"}
    assert model.producer == "exporter 1.2"
    assert model.opset() == 17


# Ops whose attributes became inputs (or changed meaning) between opsets: each version against ONNX Runtime.
def _split(opset):
    if opset < 13:
        node = helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[1, 3])
        return [node], []
    node = helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
    return [node], [numpy_helper.from_array(np.array([1, 3], np.int64), "s")]


def _squeeze(opset):
    if opset < 13:
        return [
            helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
            helper.make_node("Squeeze", ["u"], ["a"], axes=[0]),
            helper.make_node("Identity", ["x"], ["b"]),
        ], []
    axes = numpy_helper.from_array(np.array([0], np.int64), "ax")
    return [
        helper.make_node("Unsqueeze", ["x", "ax"], ["u"]),
        helper.make_node("Squeeze", ["u", "ax"], ["a"]),
        helper.make_node("Identity", ["x"], ["b"]),
    ], [axes]


def _reduce(opset):
    op_since = 18
    if opset < op_since:
        return [
            helper.make_node("ReduceMean", ["x"], ["a"], axes=[1], keepdims=1),
            helper.make_node("ReduceMax", ["x"], ["b"], axes=[0, 1], keepdims=0),
        ], []
    axes1 = numpy_helper.from_array(np.array([1], np.int64), "ax1")
    axes01 = numpy_helper.from_array(np.array([0, 1], np.int64), "ax01")
    return [
        helper.make_node("ReduceMean", ["x", "ax1"], ["a"], keepdims=1),
        helper.make_node("ReduceMax", ["x", "ax01"], ["b"], keepdims=0),
    ], [axes1, axes01]


def _reduce_sum(opset):
    if opset < 13:
        return [
            helper.make_node("ReduceSum", ["x"], ["a"], axes=[1]),
            helper.make_node("ReduceSum", ["x"], ["b"], keepdims=0),
        ], []
    axes = numpy_helper.from_array(np.array([1], np.int64), "ax")
    return [
        helper.make_node("ReduceSum", ["x", "ax"], ["a"]),
        helper.make_node("ReduceSum", ["x"], ["b"], keepdims=0),
    ], [axes]


def _clip(opset):
    if opset < 11:
        return [
            helper.make_node("Clip", ["x"], ["a"], min=-0.5, max=0.5),
            helper.make_node("Clip", ["x"], ["b"], min=0.0),
        ], []
    lo = numpy_helper.from_array(np.array(-0.5, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(0.5, np.float32), "hi")
    return [
        helper.make_node("Clip", ["x", "lo", "hi"], ["a"]),
        helper.make_node("Clip", ["x", "", "hi"], ["b"]),
    ], [lo, hi]


def _resize(opset):
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")
    if opset == 10:
        return [
            helper.make_node("Resize", ["x4", "scales"], ["a"], mode="nearest"),
            helper.make_node("Resize", ["x4", "scales"], ["b"], mode="linear"),
        ], [scales]
    roi = numpy_helper.from_array(np.array([], np.float32), "roi")
    sizes = numpy_helper.from_array(np.array([1, 2, 5, 7], np.int64), "sizes")
    # Before opset 13 the scales input is required: an empty tensor stands for "use sizes".
    no_scales = numpy_helper.from_array(np.array([], np.float32), "no_scales")
    cubic_scales = "no_scales" if opset < 13 else ""
    return [
        helper.make_node("Resize", ["x4", "roi", "scales"], ["a"], mode="linear"),
        helper.make_node(
            "Resize",
            ["x4", "roi", cubic_scales, "sizes"],
            ["b"],
            mode="cubic",
            coordinate_transformation_mode="half_pixel",
        ),
    ], [roi, scales, sizes, no_scales]


VERSIONED = [
    (_split, 11),
    (_split, 13),
    (_split, 18),
    (_squeeze, 11),
    (_squeeze, 13),
    (_reduce, 13),
    (_reduce, 18),
    (_reduce_sum, 11),
    (_reduce_sum, 13),
    (_clip, 7),
    (_clip, 11),
    (_clip, 13),
    (_resize, 10),
    (_resize, 11),
    (_resize, 13),
    (_resize, 18),
    (_resize, 19),
]


@pytest.mark.parametrize(("build", "opset"), VERSIONED, ids=[f"{b.__name__[1:]}-opset{o}" for b, o in VERSIONED])
def test_opset_dependent_semantics_match_onnxruntime(build, opset, rng):
    nodes, inits = build(opset)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x4 = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    used = {name for node in nodes for name in node.input}
    inputs = [tensor_info("x", [3, 4])] if "x" in used else []
    inputs += [tensor_info("x4", [1, 2, 3, 4])] if "x4" in used else []
    feeds = {"x": x, "x4": x4}
    model = make_model(nodes, inputs, [tensor_info("a", None), tensor_info("b", None)], opset, inits)
    assert_matches_onnxruntime(model, {i.name: feeds[i.name] for i in inputs})


def test_if_branches_read_outer_scope_values(rng):
    then_graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [tensor_info("t", [2, 3])])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor_info("e", [2, 3])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    model = make_model(
        nodes, [tensor_info("c", [], TensorProto.BOOL), tensor_info("x", [2, 3])], [tensor_info("y", [2, 3])]
    )
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for cond in (True, False):
        assert_matches_onnxruntime(model, {"c": np.array(cond), "x": x})


def test_loop_carries_state_and_stacks_scan_outputs(rng):
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
            helper.make_node("Mul", ["acc_out", "acc_out"], ["scan"]),
        ],
        "body",
        [
            tensor_info("i", [], TensorProto.INT64),
            tensor_info("cond_in", [], TensorProto.BOOL),
            tensor_info("acc_in", [2]),
        ],
        [
            tensor_info("cond_out", [], TensorProto.BOOL),
            tensor_info("acc_out", [2]),
            tensor_info("scan", [2]),
        ],
    )
    nodes = [helper.make_node("Loop", ["n", "", "acc0"], ["acc", "scans"], body=body)]
    model = make_model(
        nodes,
        [tensor_info("n", [], TensorProto.INT64), tensor_info("acc0", [2]), tensor_info("step", [2])],
        [tensor_info("acc", [2]), tensor_info("scans", None)],
    )
    feeds = {
        "acc0": rng.standard_normal(2).astype(np.float32),
        "step": rng.standard_normal(2).astype(np.float32),
    }
    for trips in (0, 4):
        out = assert_matches_onnxruntime(model, {"n": np.array(trips, np.int64), **feeds})
        assert out["scans"].shape == (trips, 2)


class _SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return torch.softmax(self.fc(y.mean(dim=(2, 3))), dim=1)


def test_from_torch_matches_the_module():
    torch.manual_seed(0)
    net = _SmallNet().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 16, 16)
    model = from_torch(net, x, dynamic_axes={"input": {0: "batch"}})
    assert model.graph.inputs[0].shape[0] == "batch"
    with torch.no_grad():
        expected = net(x)
        expected_4 = net(torch.cat([x, x]))
    actual = Executor(model).run({"input": x})
    torch.testing.assert_close(next(iter(actual.values())), expected, rtol=1e-5, atol=1e-6)
    actual_4 = Executor(model).run({"input": torch.cat([x, x])})
    torch.testing.assert_close(next(iter(actual_4.values())), expected_4, rtol=1e-5, atol=1e-6)
