"""Epilogue fusion: Conv → FusedConv, Gemm / MatMul → FusedGemm, with bias, activations and residual adds."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from onnx import helper

from tensorforge import from_torch
from tensorforge.passes.epilogue import FuseEpilogue
from tensorforge.passes.fold_bn import FoldBatchNorm
from tests.helpers import make_model, tensor_info
from tests.passes.test_fold_bn import init, optimize_and_compare, rand

FUSED_CONV = "tensorforge::FusedConv"
FUSED_GEMM = "tensorforge::FusedGemm"
PASSES = [FoldBatchNorm(), FuseEpilogue()]


def _randomize_batchnorms(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-identity BatchNorm statistics, so folding them is really tested."""
    generator = torch.Generator().manual_seed(seed)
    for bn in module.modules():
        if isinstance(bn, torch.nn.BatchNorm2d):
            c = bn.num_features
            bn.running_mean.copy_(torch.rand(c, generator=generator) * 2 - 1)
            bn.running_var.copy_(torch.rand(c, generator=generator) * 1.5 + 0.5)
            bn.weight.data.copy_(torch.rand(c, generator=generator) + 0.5)
            bn.bias.data.copy_(torch.rand(c, generator=generator) * 2 - 1)
    return module.eval()


def _conv_bn(cin: int, cout: int, stride: int = 1, groups: int = 1, kernel: int = 3) -> list[torch.nn.Module]:
    return [
        torch.nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        torch.nn.BatchNorm2d(cout),
    ]


class BasicBlock(torch.nn.Module):
    """ResNet basic block: conv-bn-relu-conv-bn + shortcut (identity or strided 1×1 conv-bn) + relu."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(*_conv_bn(cin, cout, stride), torch.nn.ReLU(), *_conv_bn(cout, cout))
        self.shortcut = torch.nn.Sequential(*_conv_bn(cin, cout, stride, kernel=1)) if stride > 1 else None

    def forward(self, x):
        shortcut = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(self.body(x) + shortcut)


class InvertedResidual(torch.nn.Module):
    """MobileNet block: 1×1 expand-bn-act, 3×3 depthwise-bn-act, 1×1 project-bn, + identity."""

    def __init__(self, channels: int, expand: int, activation: type[torch.nn.Module]) -> None:
        super().__init__()
        hidden = channels * expand
        self.layers = torch.nn.Sequential(
            *_conv_bn(channels, hidden, kernel=1),
            activation(),
            *_conv_bn(hidden, hidden, groups=hidden),
            activation(),
            *_conv_bn(hidden, channels, kernel=1),
        )

    def forward(self, x):
        return x + self.layers(x)


def _torch_model(module: torch.nn.Module, shape, opset: int = 17):
    module = _randomize_batchnorms(module)
    return from_torch(module, torch.randn(*shape), keep_batchnorm=True, opset=opset), {"input": rand(*shape)}


def _fused(model, op=FUSED_CONV):
    return [n for n in model.graph if f"{n.domain}::{n.op_type}" == op]


def test_resnet_basic_block_becomes_two_fused_convs():
    model, feeds = _torch_model(BasicBlock(8, 8), (2, 8, 6, 6))
    assert Counter(n.op_type for n in model.graph) == {"Conv": 2, "BatchNormalization": 2, "Relu": 2, "Add": 1}
    optimized, report, ops = optimize_and_compare(model, PASSES, feeds)
    assert ops == {FUSED_CONV: 2}
    first, second = _fused(optimized)
    if len(first.inputs) == 4:
        first, second = second, first
    assert first.attributes["pre"] == "Relu" and len(first.inputs) == 3
    assert second.attributes["post"] == "Relu" and second.inputs[3].name == "input"
    assert len(report.fired("fold-batchnorm")) == 2 and len(report.fired("absorb-residual")) == 1


def test_resnet_downsample_block_fuses_the_residual_into_one_of_the_two_convs():
    model, feeds = _torch_model(BasicBlock(4, 8, stride=2), (2, 4, 8, 8))
    optimized, _, ops = optimize_and_compare(model, PASSES, feeds)
    assert ops == {FUSED_CONV: 3}
    assert sorted(len(n.inputs) for n in _fused(optimized)) == [3, 3, 4]


@pytest.mark.parametrize(
    ("activation", "fused"),
    [(torch.nn.Hardswish, "HardSwish"), (torch.nn.ReLU6, "Clip"), (torch.nn.SiLU, "SiLU")],
)
def test_mobilenet_inverted_residual_block(activation, fused):
    model, feeds = _torch_model(InvertedResidual(4, 3, activation), (2, 4, 7, 7))
    optimized, _, ops = optimize_and_compare(model, PASSES, feeds)
    assert ops == {FUSED_CONV: 3}
    pres = sorted(n.attributes.get("pre", "") for n in _fused(optimized))
    assert pres == ["", fused, fused]
    (project,) = [n for n in _fused(optimized) if len(n.inputs) == 4]
    assert project.inputs[3].name == "input"
    if fused == "Clip":
        assert all(n.attributes["pre_params"] == [0.0, 6.0] for n in _fused(optimized) if n.attributes.get("pre"))


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 8)])
def test_linear_gelu_becomes_one_fused_gemm(shape):
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 5))
    model, feeds = _torch_model(module, shape, opset=20)
    optimized, _, ops = optimize_and_compare(model, PASSES, feeds)
    assert ops == {FUSED_GEMM: 2}
    first, second = _fused(optimized, FUSED_GEMM)
    assert {first.attributes.get("pre"), second.attributes.get("pre")} == {"Gelu", None}
    assert all(len(n.inputs) == 3 for n in (first, second))  # the bias is in the C slot


# -- activations one by one, on a conv built with onnx.helper -------------------------------------------------


def _conv_then(nodes, inits=(), opset=17, extra_inputs=(), extra_outputs=(), bias=True):
    """x[2,4,6,6] → Conv(6 channels, pads 1) → c, then `nodes` ending in y."""
    conv_inputs = ["x", "w", "b"] if bias else ["x", "w"]
    conv = helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1])
    weights = [init("w", rand(6, 4, 3, 3, seed=1)), init("b", rand(6, seed=2))]
    inputs = [tensor_info("x", [2, 4, 6, 6]), *extra_inputs]
    outputs = [tensor_info("y", [2, 6, 6, 6])] + [tensor_info(n, None) for n in extra_outputs]
    return make_model([conv, *nodes], inputs, outputs, opset=opset, initializers=[*weights, *inits])


X = {"x": rand(2, 4, 6, 6, seed=3, low=-3, high=3)}


def _single(name, **attrs):
    return [helper.make_node(name, ["c"], ["y"], **attrs)]


ACTIVATION_CASES = {
    "Relu": (_single("Relu"), (), 17, "Relu", []),
    "Relu6 (Clip-11 inputs)": (
        [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
        [init("lo", np.array(0, np.float32)), init("hi", np.array(6, np.float32))],
        17,
        "Clip",
        [0.0, 6.0],
    ),
    "Clip-11 with only a max": (
        [helper.make_node("Clip", ["c", "", "hi"], ["y"])],
        [init("hi", np.array(0.5, np.float32))],
        13,
        "Clip",
        [-np.inf, 0.5],
    ),
    "Clip-6 attributes": (_single("Clip", min=-0.5, max=0.25), (), 6, "Clip", [-0.5, 0.25]),
    "LeakyRelu": (_single("LeakyRelu", alpha=0.3), (), 17, "LeakyRelu", [pytest.approx(0.3)]),
    "Sigmoid": (_single("Sigmoid"), (), 17, "Sigmoid", []),
    "HardSigmoid": (
        _single("HardSigmoid", alpha=0.3, beta=0.4),
        (),
        17,
        "HardSigmoid",
        [pytest.approx(0.3), pytest.approx(0.4)],
    ),
    "HardSwish": (_single("HardSwish"), (), 17, "HardSwish", []),
    "Tanh": (_single("Tanh"), (), 17, "Tanh", []),
    "Mish": (_single("Mish"), (), 18, "Mish", []),
    "Elu": (_single("Elu", alpha=0.7), (), 17, "Elu", [pytest.approx(0.7)]),
    "Gelu": (_single("Gelu"), (), 20, "Gelu", []),
    "Gelu tanh": (_single("Gelu", approximate="tanh"), (), 20, "GeluTanh", []),
    "SiLU = x·Sigmoid(x)": (
        [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])],
        (),
        17,
        "SiLU",
        [],
    ),
    "HardSwish = x·HardSigmoid(x)": (
        [
            helper.make_node("HardSigmoid", ["c"], ["s"], alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", ["c", "s"], ["y"]),
        ],
        (),
        17,
        "HardSwish",
        [],
    ),
    "Mish = x·Tanh(Softplus(x))": (
        [
            helper.make_node("Softplus", ["c"], ["sp"]),
            helper.make_node("Tanh", ["sp"], ["t"]),
            helper.make_node("Mul", ["c", "t"], ["y"]),
        ],
        (),
        17,
        "Mish",
        [],
    ),
}


@pytest.mark.parametrize("case", list(ACTIVATION_CASES))
def test_each_activation_is_absorbed_into_the_fused_conv(case):
    nodes, inits, opset, kind, params = ACTIVATION_CASES[case]
    model = _conv_then(nodes, inits, opset=opset)
    optimized, report, ops = optimize_and_compare(model, [FuseEpilogue()], X)
    assert ops == {FUSED_CONV: 1}
    (node,) = optimized.graph.nodes
    assert node.attributes["pre"] == kind and list(node.attributes["pre_params"]) == params
    assert node.outputs[0].name == "y"
    assert len(report.fired("absorb-activation")) == 1


def test_matmul_bias_activation_and_residual_into_fused_gemm():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["bias", "m"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Add", ["z", "r"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["y"]),
    ]
    inits = [init("w", rand(8, 5, seed=1)), init("bias", rand(1, 1, 5, seed=2))]
    inputs = [tensor_info("x", [2, 3, 8]), tensor_info("z", [2, 3, 5])]
    model = make_model(nodes, inputs, [tensor_info("y", [2, 3, 5])], initializers=inits)
    optimized, _, ops = optimize_and_compare(model, [FuseEpilogue()], {"x": rand(2, 3, 8), "z": rand(2, 3, 5)})
    assert ops == {FUSED_GEMM: 1}
    (node,) = optimized.graph.nodes
    assert [v.name for v in node.inputs][3] == "z" and tuple(node.inputs[2].shape) == (5,)
    assert node.attributes["pre"] == "Relu" and node.attributes["post"] == "Sigmoid"


def test_matmul_of_two_activations_becomes_fused_gemm_only_with_a_bias():
    nodes = [
        helper.make_node("MatMul", ["x", "k"], ["m"]),
        helper.make_node("Add", ["m", "bias"], ["y"]),
        helper.make_node("MatMul", ["x", "k"], ["y2"]),
    ]
    inputs = [tensor_info("x", [3, 4]), tensor_info("k", [4, 5])]
    outputs = [tensor_info("y", [3, 5]), tensor_info("y2", [3, 5])]
    model = make_model(nodes, inputs, outputs, initializers=[init("bias", rand(5))])
    _, _, ops = optimize_and_compare(model, [FuseEpilogue()], {"x": rand(3, 4), "k": rand(4, 5)})
    assert ops == {FUSED_GEMM: 1, "MatMul": 1}


def test_gemm_with_beta_takes_a_bias_add_when_it_has_no_c():
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["g"], transB=1, alpha=0.5, beta=3.0),
        helper.make_node("Add", ["g", "bias"], ["y"]),
    ]
    inits = [init("w", rand(5, 4, seed=1)), init("bias", rand(5, seed=2))]
    model = make_model(nodes, [tensor_info("x", [3, 4])], [tensor_info("y", [3, 5])], initializers=inits)
    optimized, _, ops = optimize_and_compare(model, [FuseEpilogue()], {"x": rand(3, 4)})
    assert ops == {FUSED_GEMM: 1}
    (node,) = optimized.graph.nodes
    assert node.attributes["beta"] == 1.0 and node.attributes["transB"] == 1


@pytest.mark.parametrize("order", [("c", "z"), ("z", "c")])
def test_residual_add_either_operand_with_post_activation(order):
    nodes = [helper.make_node("Add", list(order), ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = _conv_then(nodes, extra_inputs=[tensor_info("z", [2, 6, 6, 6])])
    optimized, _, ops = optimize_and_compare(model, [FuseEpilogue()], {**X, "z": rand(2, 6, 6, 6)})
    assert ops == {FUSED_CONV: 1}
    (node,) = optimized.graph.nodes
    assert node.inputs[3].name == "z" and node.attributes["post"] == "Relu" and not node.attributes.get("pre")


def test_residual_without_a_bias_leaves_the_bias_slot_empty():
    nodes = [helper.make_node("Add", ["c", "z"], ["y"])]
    model = _conv_then(nodes, extra_inputs=[tensor_info("z", [2, 6, 6, 6])], bias=False)
    optimized, _, ops = optimize_and_compare(model, [FuseEpilogue()], {**X, "z": rand(2, 6, 6, 6)})
    (node,) = optimized.graph.nodes
    assert ops == {FUSED_CONV: 1} and node.inputs[2] is None and node.inputs[3].name == "z"


@pytest.mark.parametrize("shape", [[6, 1, 1], [1, 6, 1, 1], [1]])
def test_bias_add_fills_the_empty_bias_slot_as_a_vector(shape):
    bias = init("k", rand(int(np.prod(shape)), seed=7).reshape(shape))
    model = _conv_then([helper.make_node("Add", ["k", "c"], ["y"])], [bias], bias=False)
    optimized, report, ops = optimize_and_compare(model, [FuseEpilogue()], X)
    (node,) = optimized.graph.nodes
    assert ops == {FUSED_CONV: 1} and tuple(node.inputs[2].shape) == (6,)
    assert len(report.fired("absorb-bias")) == 1


# -- declines ------------------------------------------------------------------------------------------------


def _declines(model, feeds=X, rule=None):
    optimized, report, ops = optimize_and_compare(model, [FuseEpilogue()], feeds)
    return ops, sorted({(e.rule, e.detail) for e in report.declined(rule)}), optimized


def test_declines_an_intermediate_used_elsewhere():
    nodes = [helper.make_node("Relu", ["c"], ["y"]), helper.make_node("Neg", ["c"], ["n"])]
    ops, declined, _ = _declines(_conv_then(nodes, extra_outputs=["n"]))
    assert ops == {FUSED_CONV: 1, "Relu": 1, "Neg": 1}
    assert declined == [("absorb-activation", "the intermediate is used by another node")]


def test_declines_an_intermediate_that_is_a_graph_output():
    ops, declined, _ = _declines(_conv_then(_single("Relu"), extra_outputs=["c"]))
    assert ops == {FUSED_CONV: 1, "Relu": 1}
    assert declined == [("absorb-activation", "the intermediate is a graph output")]


def test_declines_x_times_hardsigmoid_that_is_not_hardswish():
    nodes = [helper.make_node("HardSigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    ops, declined, _ = _declines(_conv_then(nodes))
    assert ops == {FUSED_CONV: 1, "HardSigmoid": 1, "Mul": 1}
    assert declined == [("absorb-activation", "the intermediate is used by another node")]


def test_declines_a_residual_that_broadcasts():
    nodes = [helper.make_node("Add", ["c", "z"], ["y"])]
    model = _conv_then(nodes, extra_inputs=[tensor_info("z", [1, 6, 1, 1])])
    ops, declined, _ = _declines(model, {**X, "z": rand(1, 6, 1, 1)})
    assert ops == {FUSED_CONV: 1, "Add": 1}
    assert declined == [
        ("absorb-residual", "residual broadcast does not fit: [1, 6, 1, 1] against the output's [2, 6, 6, 6]")
    ]


def test_declines_a_residual_that_depends_on_the_fused_output():
    nodes = [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["c", "r"], ["y"])]
    ops, declined, _ = _declines(_conv_then(nodes))
    assert ops == {FUSED_CONV: 1, "Relu": 1, "Add": 1}
    cycle = "the residual would create a cycle (its producer depends on the fused output)"
    assert ("absorb-residual", cycle) in declined
    assert ("absorb-activation", "the intermediate is used by another node") in declined


def test_declines_adding_the_output_to_itself():
    ops, declined, _ = _declines(_conv_then([helper.make_node("Add", ["c", "c"], ["y"])]))
    assert ops == {FUSED_CONV: 1, "Add": 1}
    assert declined == [
        ("absorb-residual", "the residual would create a cycle (its producer depends on the fused output)")
    ]


def test_declines_an_activation_parameter_that_is_not_constant():
    nodes = [helper.make_node("Clip", ["c", "lo"], ["y"])]
    model = _conv_then(nodes, extra_inputs=[tensor_info("lo", [])])
    ops, declined, _ = _declines(model, {**X, "lo": np.array(0.1, np.float32)})
    assert ops == {FUSED_CONV: 1, "Clip": 1}
    assert declined == [("absorb-activation", "activation parameter is not constant (Clip bound)")]


def test_declines_a_second_activation_when_the_slot_is_filled():
    nodes = [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    ops, declined, optimized = _declines(_conv_then(nodes))
    assert ops == {FUSED_CONV: 1, "Sigmoid": 1}
    assert declined == [("absorb-activation", "the fused node already has the pre activation slot filled")]


def test_declines_a_second_post_activation_and_a_second_residual():
    nodes = [
        helper.make_node("Add", ["c", "z"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Tanh", ["r"], ["t"]),
        helper.make_node("Add", ["t", "z"], ["y"]),
    ]
    model = _conv_then(nodes, extra_inputs=[tensor_info("z", [2, 6, 6, 6])])
    ops, declined, _ = _declines(model, {**X, "z": rand(2, 6, 6, 6)})
    assert ops == {FUSED_CONV: 1, "Tanh": 1, "Add": 1}
    assert declined == [("absorb-activation", "the fused node already has the post activation slot filled")]
    nodes = [helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Add", ["s", "z"], ["y"])]
    model = _conv_then(nodes, extra_inputs=[tensor_info("z", [2, 6, 6, 6])])
    ops, declined, _ = _declines(model, {**X, "z": rand(2, 6, 6, 6)})
    assert ops == {FUSED_CONV: 1, "Add": 1}
    assert declined == [("absorb-residual", "the fused node already has the residual slot filled")]


def test_declines_a_bias_when_the_slot_is_filled_or_an_activation_came_first():
    bias = init("k", rand(6, 1, 1, seed=7))
    ops, declined, _ = _declines(_conv_then([helper.make_node("Add", ["c", "k"], ["y"])], [bias]))
    assert ops == {FUSED_CONV: 1, "Add": 1}
    assert ("absorb-bias", "the fused node already has the bias slot filled") in declined
    nodes = [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "k"], ["y"])]
    ops, declined, _ = _declines(_conv_then(nodes, [bias], bias=False))
    assert ops == {FUSED_CONV: 1, "Add": 1}
    assert ("absorb-bias", "an activation or residual is already fused (the bias comes before them)") in declined
