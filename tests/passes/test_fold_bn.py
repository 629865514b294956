"""BatchNormalization and per-channel Mul/Add folding into Conv, ConvTranspose, Gemm and MatMul."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import Model
from tensorforge.ir.clone import clone_model
from tensorforge.ops import Executor
from tensorforge.passes import Pass, PassManager, qualified_op
from tensorforge.passes.fold_bn import FoldBatchNorm
from tests.helpers import make_model, relative_error, tensor_info

REL_TOL = 1e-5


def optimize_and_compare(model: Model | onnx.ModelProto, passes: Sequence[Pass], feeds: dict[str, np.ndarray]):
    """Optimize a copy of `model` with `passes`; assert no pass failed and that the optimized graph computes
    what the original does on `feeds` (relative error ≤ 1e-5). Returns (optimized model, report, op counts)."""
    original = import_model(model) if isinstance(model, onnx.ModelProto) else model
    optimized, report = PassManager(list(passes)).run(clone_model(original))
    failures = [e for e in report.events if e.status == "failed"]
    assert not failures, failures
    expected = Executor(original).run(feeds)
    actual = Executor(optimized).run(feeds)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert tuple(actual[name].shape) == tuple(value.shape), name
        error = relative_error(actual[name].numpy(), value.numpy())
        assert error <= REL_TOL, f"{name}: relative error {error:.3g} > {REL_TOL:g}"
    return optimized, report, Counter(qualified_op(n) for n in optimized.graph)


def rand(*shape, low=-1.0, high=1.0, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed + sum(shape))
    return rng.uniform(low, high, shape).astype(np.float32)


def init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def bn_initializers(prefix: str, channels: int) -> list[onnx.TensorProto]:
    """Non-trivial BatchNormalization statistics: scale, bias, mean, variance."""
    return [
        init(f"{prefix}_scale", rand(channels, low=0.5, high=1.5, seed=1)),
        init(f"{prefix}_bias", rand(channels, seed=2)),
        init(f"{prefix}_mean", rand(channels, seed=3)),
        init(f"{prefix}_var", rand(channels, low=0.5, high=2.0, seed=4)),
    ]


def bn_node(x: str, y: str, prefix: str = "bn", **attrs) -> onnx.NodeProto:
    names = [x, f"{prefix}_scale", f"{prefix}_bias", f"{prefix}_mean", f"{prefix}_var"]
    return helper.make_node("BatchNormalization", names, [y], epsilon=1e-3, **attrs)


def conv_bn_model(*, bias=True, group=1, follower=None, opset=17, extra_outputs=(), weight_input=False):
    """x[2,4,6,6] → Conv(6 channels) → BatchNormalization (or `follower` nodes) → y."""
    weight = init("w", rand(6, 4 // group, 3, 3, seed=5))
    inits = [] if weight_input else [weight]
    inputs = [tensor_info("x", [2, 4, 6, 6])] + ([tensor_info("w", [6, 4 // group, 3, 3])] if weight_input else [])
    conv_inputs = ["x", "w"] + (["b"] if bias else [])
    if bias:
        inits.append(init("b", rand(6, seed=6)))
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1], group=group)]
    if follower is None:
        nodes.append(bn_node("c", "y"))
        inits += bn_initializers("bn", 6)
    else:
        more_nodes, more_inits = follower
        nodes += more_nodes
        inits += more_inits
    outputs = [tensor_info("y", None)] + [tensor_info(name, None) for name in extra_outputs]
    return make_model(nodes, inputs, outputs, opset=opset, initializers=inits)


X = {"x": rand(2, 4, 6, 6, seed=9)}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("group", [1, 2])
def test_conv_batchnorm_folds_into_weights_and_bias(bias, group):
    model, report, ops = optimize_and_compare(conv_bn_model(bias=bias, group=group), [FoldBatchNorm()], X)
    assert ops == {"Conv": 1}
    assert len(report.fired("fold-batchnorm")) == 1
    (conv,) = model.graph.nodes
    assert conv.outputs[0].name == "y" and conv.inputs[2] is not None
    assert conv.attributes["group"] == group
    assert set(model.graph.initializers) == {conv.inputs[1].name, conv.inputs[2].name}


def test_folding_makes_new_initializers_and_leaves_the_original_weights_alone():
    original = import_model(conv_bn_model())
    before = original.graph.initializers["w"].const.clone()
    model, _, _ = optimize_and_compare(original, [FoldBatchNorm()], X)
    assert torch.equal(original.graph.initializers["w"].const, before)
    (conv,) = model.graph.nodes
    assert conv.inputs[1].name != "w" and not torch.equal(conv.inputs[1].const, before)


def test_batchnorm_from_a_torch_module_with_random_statistics():
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, stride=2), torch.nn.BatchNorm2d(5))
    bn = module[1]
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-1, 1)
    from tensorforge import from_torch

    imported = from_torch(module, torch.randn(1, 3, 9, 9), keep_batchnorm=True)
    assert Counter(n.op_type for n in imported.graph)["BatchNormalization"] == 1
    _, _, ops = optimize_and_compare(imported, [FoldBatchNorm()], {"input": rand(1, 3, 9, 9)})
    assert ops == {"Conv": 1}


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_batchnorm_uses_weight_axis_1_per_group(group):
    weight = init("w", rand(4, 6 // group, 3, 3, seed=5))
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["c"], group=group, strides=[2, 2]),
        bn_node("c", "y"),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", [2, 4, 5, 5])],
        [tensor_info("y", None)],
        initializers=[weight, *bn_initializers("bn", 6)],
    )
    _, report, ops = optimize_and_compare(model, [FoldBatchNorm()], {"x": rand(2, 4, 5, 5)})
    assert ops == {"ConvTranspose": 1} and len(report.fired("fold-batchnorm")) == 1


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("with_c", [True, False])
def test_gemm_batchnorm_acts_on_output_features(trans_b, with_c):
    weight = rand(5, 3, seed=5) if trans_b else rand(3, 5, seed=5)
    inits = [init("w", weight), *bn_initializers("bn", 5)] + ([init("c", rand(5, seed=7))] if with_c else [])
    gemm = helper.make_node("Gemm", ["x", "w"] + (["c"] if with_c else []), ["g"], transB=trans_b, alpha=0.7, beta=1.3)
    model = make_model(
        [gemm, bn_node("g", "y")], [tensor_info("x", [4, 3])], [tensor_info("y", None)], initializers=inits
    )
    optimized, _, ops = optimize_and_compare(model, [FoldBatchNorm()], {"x": rand(4, 3)})
    assert ops == {"Gemm": 1}
    (node,) = optimized.graph.nodes
    assert node.attributes["beta"] == 1.0 and node.attributes["alpha"] == pytest.approx(0.7)


def test_matmul_batchnorm_becomes_matmul_and_a_bias_add():
    inits = [init("w", rand(3, 5, seed=5)), *bn_initializers("bn", 5)]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), bn_node("m", "y")]
    model = make_model(nodes, [tensor_info("x", [4, 3])], [tensor_info("y", [4, 5])], initializers=inits)
    optimized, report, ops = optimize_and_compare(model, [FoldBatchNorm()], {"x": rand(4, 3)})
    assert ops == {"MatMul": 1, "Add": 1}
    assert "bias Add" in report.fired("fold-batchnorm")[0].detail
    assert optimized.graph.outputs[0].name == "y"


@pytest.mark.parametrize("shape", [[6, 1, 1], [1, 6, 1, 1], [1], []])
def test_per_channel_mul_and_add_fold_into_the_conv(shape):
    size = int(np.prod(shape)) if shape else 1
    factor = rand(size, low=0.5, high=2.0, seed=11).reshape(shape)
    term = rand(size, seed=12).reshape(shape)
    follower = (
        [helper.make_node("Mul", ["k", "c"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])],
        [init("k", factor), init("t", term)],
    )
    _, report, ops = optimize_and_compare(conv_bn_model(follower=follower), [FoldBatchNorm()], X)
    assert ops == {"Conv": 1}
    assert len(report.fired("fold-channel-mul")) == 1 and len(report.fired("fold-channel-add")) == 1


def test_per_feature_mul_and_add_fold_into_gemm_and_mul_into_matmul():
    nodes = [
        helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1),
        helper.make_node("Mul", ["g", "k"], ["m"]),
        helper.make_node("Add", ["t", "m"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["p"]),
        helper.make_node("Mul", ["p", "k2"], ["y"]),
    ]
    inits = [
        init("w", rand(5, 3, seed=1)),
        init("c", rand(5, seed=2)),
        init("k", rand(5, seed=3)),
        init("t", rand(1, 5, seed=4)),
        init("w2", rand(5, 2, seed=5)),
        init("k2", rand(2, seed=6)),
    ]
    model = make_model(nodes, [tensor_info("x", [4, 3])], [tensor_info("y", [4, 2])], initializers=inits)
    _, report, ops = optimize_and_compare(model, [FoldBatchNorm()], {"x": rand(4, 3)})
    assert ops == {"Gemm": 1, "MatMul": 1}
    assert len(report.fired("fold-channel-mul")) == 2 and len(report.fired("fold-channel-add")) == 1


def test_a_scale_after_a_matmuls_bias_add_is_distributed_then_folded():
    """((x·W) + b)·k = (x·W)·k + b·k, and then x·(W·k) + b·k; a bias Add read elsewhere stays as it is."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Mul", ["pb", "k"], ["y"]),
    ]
    inits = [init("w", rand(3, 5, seed=1)), init("b", rand(5, seed=2)), init("k", rand(1, 5, seed=3))]
    model = make_model(nodes, [tensor_info("x", [4, 3])], [tensor_info("y", [4, 5])], initializers=inits)
    _, report, ops = optimize_and_compare(model, [FoldBatchNorm()], {"x": rand(4, 3)})
    assert ops == {"MatMul": 1, "Add": 1}
    assert len(report.fired("distribute-channel-mul")) == 1 and len(report.fired("fold-channel-mul")) == 1

    shared = make_model(
        nodes, [tensor_info("x", [4, 3])], [tensor_info("y", [4, 5]), tensor_info("pb", [4, 5])], initializers=inits
    )
    _, report, ops = optimize_and_compare(shared, [FoldBatchNorm()], {"x": rand(4, 3)})
    assert ops == {"MatMul": 1, "Add": 1, "Mul": 1}
    assert "read elsewhere" in report.declined("distribute-channel-mul")[0].detail


def test_a_scalar_scale_before_a_layer_folds_into_its_weight_through_shape_only_nodes():
    """(x·c) reshaped, then a product: x reshaped, then the product with W·c (PP-LCNet's dropout scale of 0.8
    before its classifier); a scale before a convolution the same; a scale read elsewhere stays."""
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["m"]),
        helper.make_node("Reshape", ["m", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["y"]),
    ]
    inits = [
        init("k", np.array(0.8, np.float32)),
        init("shape", np.array([2, -1], np.int64)),
        init("w", rand(12, 5, seed=1)),
        init("b", rand(5, seed=2)),
    ]
    model = make_model(nodes, [tensor_info("x", [2, 12, 1, 1])], [tensor_info("y", [2, 5])], initializers=inits)
    optimized, report, ops = optimize_and_compare(model, [FoldBatchNorm()], {"x": rand(2, 12, 1, 1)})
    assert ops == {"Reshape": 1, "MatMul": 1, "Add": 1}
    assert len(report.fired("fold-input-scale")) == 1
    assert "k" not in optimized.graph.initializers and "w" not in optimized.graph.initializers

    conv = [
        helper.make_node("Mul", ["k", "x"], ["m"]),
        helper.make_node("Conv", ["m", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = [init("k", np.array([1.7], np.float32)), init("w", rand(6, 4, 3, 3)), init("b", rand(6))]
    model = make_model(conv, [tensor_info("x", [2, 4, 6, 6])], [tensor_info("y", None)], initializers=inits)
    _, report, ops = optimize_and_compare(model, [FoldBatchNorm()], X)
    assert ops == {"Conv": 1} and len(report.fired("fold-input-scale")) == 1

    outputs = [tensor_info("y", None), tensor_info("m", None)]
    model = make_model(conv, [tensor_info("x", [2, 4, 6, 6])], outputs, initializers=inits)
    _, report, ops = optimize_and_compare(model, [FoldBatchNorm()], X)
    assert ops == {"Conv": 1, "Mul": 1}
    assert "read elsewhere" in report.declined("fold-input-scale")[0].detail


# -- declines ------------------------------------------------------------------------------------------------


def _declined(model, feeds=X, rule="fold-batchnorm") -> tuple[Counter, list[str]]:
    _, report, ops = optimize_and_compare(model, [FoldBatchNorm()], feeds)
    assert not report.fired(rule)
    return ops, [e.detail for e in report.declined(rule)]


def test_declines_a_weight_shared_with_another_node():
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        bn_node("c", "y"),
        helper.make_node("Conv", ["x", "w"], ["y2"], pads=[1, 1, 1, 1]),
    ]
    inits = [init("w", rand(6, 4, 3, 3)), *bn_initializers("bn", 6)]
    model = make_model(
        nodes, [tensor_info("x", [2, 4, 6, 6])], [tensor_info("y", None), tensor_info("y2", None)], initializers=inits
    )
    ops, reasons = _declined(model)
    assert ops["BatchNormalization"] == 1 and reasons == ["weight is shared with another node"]


def test_declines_a_bias_shared_with_another_node():
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        bn_node("c", "y"),
        helper.make_node("Mul", ["b", "b"], ["y2"]),
    ]
    inits = [init("w", rand(6, 4, 3, 3)), init("b", rand(6)), *bn_initializers("bn", 6)]
    outputs = [tensor_info("y", None), tensor_info("y2", None)]
    model = make_model(nodes, [tensor_info("x", [2, 4, 6, 6])], outputs, initializers=inits)
    _, reasons = _declined(model)
    assert reasons == ["bias is shared with another node"]


def test_declines_when_the_conv_output_is_used_by_another_node():
    follower = ([bn_node("c", "y"), helper.make_node("Relu", ["c"], ["r"])], bn_initializers("bn", 6))
    _, reasons = _declined(conv_bn_model(follower=follower, extra_outputs=["r"]))
    assert reasons == ["the Conv output is used by another node"]


def test_declines_when_the_conv_output_is_a_graph_output():
    _, reasons = _declined(conv_bn_model(extra_outputs=["c"]))
    assert reasons == ["the Conv output is a graph output"]


def test_declines_a_batchnorm_with_training_outputs():
    follower = (
        [
            helper.make_node(
                "BatchNormalization",
                ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                ["y", "running_mean", "running_var"],
                training_mode=1,
            )
        ],
        bn_initializers("bn", 6),
    )
    model = conv_bn_model(follower=follower, opset=15, extra_outputs=["running_mean", "running_var"])
    _, reasons = _declined(model)
    assert reasons == ["BatchNormalization is in training mode (training_mode=1)"]


def test_declines_batchnorm_training_outputs_before_opset_14():
    names = ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"]
    outputs = ["y", "mean_out", "var_out", "saved_mean", "saved_var"]
    follower = ([helper.make_node("BatchNormalization", names, outputs)], bn_initializers("bn", 6))
    model = conv_bn_model(follower=follower, opset=9, extra_outputs=outputs[1:])
    original = import_model(model)
    _, report = PassManager([FoldBatchNorm()]).run(clone_model(original))
    assert [e.detail for e in report.declined("fold-batchnorm")] == ["BatchNormalization has training outputs"]


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ([6], "constant of shape [6] does not broadcast per channel"),
        ([6, 6, 6], "constant of shape [6, 6, 6] does not broadcast per channel"),
        ([1, 1, 6, 1, 1], "constant of shape [1, 1, 6, 1, 1] broadcasts to a higher rank than the output's 4"),
    ],
)
@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_declines_a_constant_that_does_not_broadcast_per_channel(op, shape, reason):
    constant = init("k", rand(int(np.prod(shape)), seed=13).reshape(shape))
    follower = ([helper.make_node(op, ["c", "k"], ["y"])], [constant])
    rule = "fold-channel-mul" if op == "Mul" else "fold-channel-add"
    ops, reasons = _declined(conv_bn_model(follower=follower), rule=rule)
    assert ops[op] == 1 and reasons == [reason]


def test_declines_a_weight_that_is_not_constant():
    feeds = {**X, "w": rand(6, 4, 3, 3, seed=14)}
    _, reasons = _declined(conv_bn_model(weight_input=True), feeds)
    assert reasons == ["weight is not constant"]


def test_declines_batchnorm_parameters_that_are_not_constant():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn_node("c", "y")]
    inits = [init("w", rand(6, 4, 1, 1)), *bn_initializers("bn", 6)[1:]]
    inputs = [tensor_info("x", [2, 4, 6, 6]), tensor_info("bn_scale", [6])]
    model = make_model(nodes, inputs, [tensor_info("y", None)], initializers=inits)
    _, reasons = _declined(model, {**X, "bn_scale": rand(6, seed=15)})
    assert reasons == ["BatchNormalization parameters are not constant"]


def test_declines_batchnorm_on_a_matmul_whose_channel_axis_is_not_the_features():
    inits = [init("w", rand(3, 4, seed=5)), *bn_initializers("bn", 4)]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), bn_node("m", "y")]
    model = make_model(nodes, [tensor_info("x", [2, 4, 3])], [tensor_info("y", [2, 4, 4])], initializers=inits)
    _, reasons = _declined(model, {"x": rand(2, 4, 3)})
    assert reasons == ["BatchNormalization normalizes axis 1, not MatMul's output features (last axis)"]
