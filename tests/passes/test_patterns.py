import math

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge import from_torch
from tensorforge.frontend import import_model
from tensorforge.ops import Executor
from tensorforge.passes import PassManager
from tensorforge.passes.patterns import RecognizePatterns
from tensorforge.passes.pointwise import FusePointwise
from tests.helpers import make_model, relative_error, tensor_info

SHAPE = [2, 3, 8]


def _optimize(model, *passes):
    return PassManager(list(passes) or [RecognizePatterns()]).run(model)


def _feeds(model):
    rng = np.random.default_rng(0)
    return {v.name: (rng.standard_normal(v.shape) * 2).astype(np.float32) for v in model.graph.inputs}


def _assert_same(proto_or_module, optimized):
    original = import_model(proto_or_module) if isinstance(proto_or_module, onnx.ModelProto) else proto_or_module
    feeds = _feeds(original)
    expected = Executor(original).run(feeds)
    actual = Executor(optimized).run(feeds)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert actual[name].shape == value.shape
        assert relative_error(actual[name].numpy(), value.numpy()) <= 1e-5, name


def _ops(model):
    return [n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in model.graph]


def _const(name, value):
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _model(nodes, consts, outputs=("y",), opset=17, shape=SHAPE, extra_inits=()):
    inits = [_const(name, value) for name, value in consts.items()] + list(extra_inits)
    return make_model(nodes, [tensor_info("x", shape)], [tensor_info(name, None) for name in outputs], opset, inits)


# -- GELU --------------------------------------------------------------------------------------------------


def test_gelu_exported_by_torch():
    x = torch.randn(*SHAPE)
    model, report = _optimize(from_torch(torch.nn.GELU(), x))
    assert _ops(model) == ["tensorforge::Gelu"]
    assert model.graph.nodes[0].attributes["approximate"] == "none"
    assert len(report.fired("gelu-erf")) == 1
    _assert_same(from_torch(torch.nn.GELU(), x), model)


def _erf_gelu(form: str, half=0.5, erf_used_elsewhere=""):
    """0.5·x·(1 + erf(x/√2)) written several ways."""
    nodes = [
        helper.make_node("Mul", ["x", "inv_sqrt2"], ["s"])
        if form == "mul"
        else helper.make_node("Div", ["x", "sqrt2"], ["s"]),
        helper.make_node("Erf", ["s"], ["e"]),
        helper.make_node("Add", ["one", "e"], ["h"]),
    ]
    if form in ("div", "mul"):  # (x · 0.5) · h
        nodes += [helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Mul", ["xh", "h"], ["y"])]
    elif form == "const-first":  # (h · 0.5) · x
        nodes += [helper.make_node("Mul", ["h", "half"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])]
    elif form == "halved":  # (x · h) / 2
        nodes += [helper.make_node("Mul", ["h", "x"], ["t"]), helper.make_node("Div", ["t", "two"], ["y"])]
    outputs = ["y"]
    if erf_used_elsewhere == "output":
        outputs.append("e")
    elif erf_used_elsewhere == "node":
        nodes.append(helper.make_node("Neg", ["e"], ["z"]))
        outputs.append("z")
    consts = {"sqrt2": math.sqrt(2), "inv_sqrt2": 1 / math.sqrt(2), "one": 1.0, "half": half, "two": 2.0}
    return _model(nodes, consts, outputs)


@pytest.mark.parametrize("form", ["div", "mul", "const-first", "halved"])
def test_erf_gelu_in_any_operand_order(form):
    proto = _erf_gelu(form)
    model, report = _optimize(import_model(proto))
    assert _ops(model) == ["tensorforge::Gelu"]
    assert [e.rule for e in report.fired()] == ["gelu-erf"]
    assert model.graph.outputs[0].name == "y"
    _assert_same(proto, model)


@pytest.mark.parametrize(
    ("where", "reason"),
    [("output", "the intermediate 'e' is a graph output"), ("node", "the intermediate 'e' is used elsewhere")],
)
def test_erf_gelu_declines_when_an_intermediate_is_needed(where, reason):
    model, report = _optimize(import_model(_erf_gelu("div", erf_used_elsewhere=where)))
    assert "tensorforge::Gelu" not in _ops(model)
    (event,) = report.declined("gelu-erf")
    assert event.detail.startswith(reason)


def test_erf_gelu_declines_a_wrong_constant():
    model, report = _optimize(import_model(_erf_gelu("div", half=0.6)))
    assert "tensorforge::Gelu" not in _ops(model)
    (event,) = report.declined("gelu-erf")
    assert "not the expected 0.5" in event.detail


def _tanh_gelu(cube: str, inner=0.044715):
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), x³ as Pow or as products."""
    if cube == "pow":
        nodes = [helper.make_node("Pow", ["x", "three"], ["x3"])]
    else:
        nodes = [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["x3"])]
    nodes += [
        helper.make_node("Mul", ["x3", "c"], ["cx3"]),
        helper.make_node("Add", ["cx3", "x"], ["inner"]),
        helper.make_node("Mul", ["inner", "k"], ["arg"]),
        helper.make_node("Tanh", ["arg"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["h"]),
        helper.make_node("Mul", ["x", "h"], ["xh"]),
        helper.make_node("Mul", ["half", "xh"], ["y"]),
    ]
    consts = {"three": 3.0, "c": inner, "k": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5}
    return _model(nodes, consts)


@pytest.mark.parametrize("cube", ["pow", "products"])
def test_tanh_gelu_written_out(cube):
    proto = _tanh_gelu(cube)
    model, report = _optimize(import_model(proto))
    assert _ops(model) == ["tensorforge::Gelu"]
    assert model.graph.nodes[0].attributes["approximate"] == "tanh"
    assert len(report.fired("gelu-tanh")) == 1
    _assert_same(proto, model)


def test_tanh_gelu_exported_by_torch():
    x = torch.randn(*SHAPE)
    module = torch.nn.GELU(approximate="tanh")
    model, _ = _optimize(from_torch(module, x))
    assert _ops(model) == ["tensorforge::Gelu"]
    _assert_same(from_torch(module, x), model)


def test_tanh_gelu_declines_a_wrong_cubic_coefficient():
    model, report = _optimize(import_model(_tanh_gelu("pow", inner=0.05)))
    assert "tensorforge::Gelu" not in _ops(model)
    (event,) = report.declined("gelu-tanh")
    assert "not the expected 0.044715" in event.detail


def test_gelu_survives_pointwise_fusion_after_recognition():
    proto = _erf_gelu("div")
    nodes = [*proto.graph.node, helper.make_node("Relu", ["y"], ["r"]), helper.make_node("Neg", ["r"], ["z"])]
    proto = _model(nodes, {"sqrt2": math.sqrt(2), "one": 1.0, "half": 0.5}, outputs=["z"])
    model, _ = _optimize(import_model(proto), RecognizePatterns(), FusePointwise())
    assert _ops(model) == ["tensorforge::Gelu", "tensorforge::FusedPointwise"]
    _assert_same(proto, model)


# -- LayerNorm ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_exported_by_torch_at_opset_13(affine):
    x = torch.randn(*SHAPE)
    module = torch.nn.LayerNorm(8, elementwise_affine=affine)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-2, 2)
    model, report = _optimize(from_torch(module, x, opset=13))
    assert _ops(model) == ["tensorforge::LayerNormalization"]
    node = model.graph.nodes[0]
    assert node.attributes["axis"] == 2 and node.attributes["epsilon"] == pytest.approx(1e-5)
    assert len(report.fired("layernorm")) == 1
    _assert_same(from_torch(module, x, opset=13), model)


def test_torch_exports_layernorm_directly_at_opset_17():
    model = from_torch(torch.nn.LayerNorm(8), torch.randn(*SHAPE), opset=17)
    assert _ops(model) == ["LayerNormalization"]


def _layernorm(
    opset=18,
    axes=(-2, -1),
    var_axes=None,
    square="mul",
    divide="reciprocal",
    gamma_shape=(3, 8),
    beta=True,
    keepdims=1,
):
    """The decomposed LayerNorm written by hand; axes as an input from opset 18, an attribute before."""

    def mean(source, out, reduce_axes, tag):
        if opset >= 18:
            return [helper.make_node("ReduceMean", [source, f"axes_{tag}"], [out], keepdims=keepdims)]
        return [helper.make_node("ReduceMean", [source], [out], axes=list(reduce_axes), keepdims=keepdims)]

    var_axes = axes if var_axes is None else var_axes
    nodes = [*mean("x", "m", axes, "m"), helper.make_node("Sub", ["x", "m"], ["d"])]
    nodes.append(
        helper.make_node("Mul", ["d", "d"], ["sq"])
        if square == "mul"
        else helper.make_node("Pow", ["d", "two"], ["sq"])
    )
    nodes += mean("sq", "v", var_axes, "v")
    nodes += [helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"])]
    if divide == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["s"], ["rs"]), helper.make_node("Mul", ["rs", "d"], ["n"])]
    else:
        nodes.append(helper.make_node("Div", ["d", "s"], ["n"]))
    last = "n"
    inits = [numpy_helper.from_array(np.array(a, np.int64), f"axes_{t}") for a, t in ((axes, "m"), (var_axes, "v"))]
    rng = np.random.default_rng(1)
    if gamma_shape is not None:
        inits.append(numpy_helper.from_array(rng.uniform(-2, 2, gamma_shape).astype(np.float32), "gamma"))
        nodes.append(helper.make_node("Mul", [last, "gamma"], ["g"]))
        last = "g"
    if beta:
        inits.append(numpy_helper.from_array(rng.uniform(-2, 2, [8]).astype(np.float32), "beta"))
        nodes.append(helper.make_node("Add", [last, "beta"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    return _model(nodes, {"eps": 1e-3, "two": 2.0}, opset=opset, extra_inits=inits)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"opset": 13, "axes": (-1,), "square": "pow", "divide": "div", "gamma_shape": (8,)},
        {"opset": 17, "axes": (1, 2), "gamma_shape": (1, 3, 8), "beta": False},
        {"gamma_shape": None},
        {"gamma_shape": None, "beta": False},
    ],
)
def test_layernorm_written_out(options):
    proto = _layernorm(**options)
    model, report = _optimize(import_model(proto))
    assert "tensorforge::LayerNormalization" in _ops(model)
    assert not {"ReduceMean", "Sqrt", "Sub"} & set(_ops(model))
    (event,) = report.fired("layernorm")
    axes = options.get("axes", (-2, -1))
    assert model.graph.nodes[0].attributes["axis"] == 3 - len(axes)
    assert model.graph.nodes[0].attributes["epsilon"] == pytest.approx(1e-3)
    _assert_same(proto, model)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"axes": (1,)}, "the reduction axes [-2] are not the trailing axes"),
        ({"axes": (-1,), "var_axes": (-2, -1)}, "the mean and variance reduce different axes"),
        ({"axes": (-1,), "gamma_shape": (3, 1)}, "γ varies along an axis that is not normalized"),
        ({"keepdims": 0}, "a mean does not keep the reduced axes"),
    ],
)
def test_layernorm_declines(options, reason):
    model, report = _optimize(import_model(_layernorm(**options)))
    assert "tensorforge::LayerNormalization" not in _ops(model)
    (event,) = report.declined("layernorm")
    assert event.detail.startswith(reason)


def test_layernorm_declines_a_wrong_exponent():
    proto = _layernorm(square="pow")
    for init in proto.graph.initializer:
        if init.name == "two":
            init.CopyFrom(_const("two", 3.0))
    model, report = _optimize(import_model(proto))
    (event,) = report.declined("layernorm")
    assert "the exponent 2 is 3.0" in event.detail


def test_layernorm_declines_when_the_mean_is_a_graph_output():
    proto = _layernorm()
    proto.graph.output.append(tensor_info("m", None))
    model, report = _optimize(import_model(proto))
    (event,) = report.declined("layernorm")
    assert event.detail == "the intermediate 'm' is a graph output"


# -- Softmax -----------------------------------------------------------------------------------------------


def _softmax(opset=13, max_axis=-1, sum_axis=-1, divide="div", exp_elsewhere=False):
    """exp(x − max x) / Σ exp(x − max x); ReduceSum takes axes as input from 13, ReduceMax from 18."""
    if opset >= 18:
        top = helper.make_node("ReduceMax", ["x", "max_axes"], ["mx"])
    else:
        top = helper.make_node("ReduceMax", ["x"], ["mx"], axes=list(np.atleast_1d(max_axis)))
    nodes = [top, helper.make_node("Sub", ["x", "mx"], ["d"]), helper.make_node("Exp", ["d"], ["e"])]
    nodes.append(helper.make_node("ReduceSum", ["e", "sum_axes"], ["total"]))
    if divide == "div":
        nodes.append(helper.make_node("Div", ["e", "total"], ["y"]))
    else:
        nodes += [helper.make_node("Reciprocal", ["total"], ["r"]), helper.make_node("Mul", ["e", "r"], ["y"])]
    outputs = ["y"]
    if exp_elsewhere:
        nodes.append(helper.make_node("Log", ["e"], ["z"]))
        outputs.append("z")
    inits = [
        numpy_helper.from_array(np.atleast_1d(np.array(max_axis, np.int64)), "max_axes"),
        numpy_helper.from_array(np.atleast_1d(np.array(sum_axis, np.int64)), "sum_axes"),
    ]
    return _model(nodes, {}, outputs, opset=opset, extra_inits=inits)


@pytest.mark.parametrize(
    "options",
    [{}, {"opset": 18, "divide": "reciprocal"}, {"max_axis": 1, "sum_axis": -2}, {"max_axis": 0, "sum_axis": 0}],
)
def test_softmax_written_out(options):
    proto = _softmax(**options)
    model, report = _optimize(import_model(proto))
    assert _ops(model) == ["tensorforge::Softmax"]
    assert len(report.fired("softmax")) == 1
    _assert_same(proto, model)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"max_axis": -1, "sum_axis": -2}, "the max and the sum reduce different axes"),
        ({"opset": 18, "max_axis": [1, 2], "sum_axis": [1, 2]}, "ReduceMax reduces 2 axes"),
        ({"exp_elsewhere": True}, "the intermediate 'e' is used elsewhere"),
    ],
)
def test_softmax_declines(options, reason):
    model, report = _optimize(import_model(_softmax(**options)))
    assert "tensorforge::Softmax" not in _ops(model)
    (event,) = report.declined("softmax")
    assert event.detail.startswith(reason)
