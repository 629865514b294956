import numpy as np
import pytest
import torch
from onnx import helper

import tensorforge
from tensorforge.frontend import import_model
from tensorforge.ir import DType
from tensorforge.ir.clone import clone_model
from tensorforge.ops import Executor
from tensorforge.passes import PassManager
from tensorforge.passes.cse import CommonSubexpressions
from tensorforge.passes.horizontal import MergeParallel
from tests.helpers import make_model, relative_error, tensor_info
from tests.passes.support import init, ops

RNG = np.random.default_rng(0)


def _optimize(model, passes=None):
    original = clone_model(model)
    optimized, report = PassManager(passes or [MergeParallel()]).run(model)
    return original, optimized, report


def _assert_same(original, optimized, feeds):
    expected = Executor(original).run(feeds)
    actual = Executor(optimized).run(feeds)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert relative_error(actual[name].numpy(), value.numpy()) <= 1e-5, name


def _randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


class Inception(torch.nn.Module):
    """Four branches; three of them start with a 1×1 convolution of the block input."""

    def __init__(self):
        super().__init__()
        self.b1 = torch.nn.Conv2d(8, 6, 1)
        self.b2a, self.b2b = torch.nn.Conv2d(8, 4, 1), torch.nn.Conv2d(4, 5, 3, padding=1)
        self.b3a, self.b3b = torch.nn.Conv2d(8, 3, 1, bias=False), torch.nn.Conv2d(3, 4, 5, padding=2)
        self.pool, self.b4 = torch.nn.MaxPool2d(3, 1, 1), torch.nn.Conv2d(8, 2, 1)

    def forward(self, x):
        branches = [self.b1(x), self.b2b(torch.relu(self.b2a(x))), self.b3b(self.b3a(x)), self.b4(self.pool(x))]
        return torch.cat(branches, 1)


@pytest.mark.parametrize("opset", [11, 17])
def test_inception_1x1_branches_become_one_conv_and_a_split(opset):
    model = tensorforge.from_torch(Inception(), torch.randn(1, 8, 7, 7), opset=opset)
    original, optimized, report = _optimize(model)
    assert ops(optimized).count("Conv") == 4  # 1×1 merged, 3×3, 5×5, pool branch
    (fired,) = report.fired("merge-parallel-conv")
    assert "width 13" in fired.detail and "[6, 4, 3]" in fired.detail
    (split,) = [n for n in optimized.graph if n.op_type == "Split"]
    merged = split.inputs[0].producer()
    assert merged.inputs[1].const.shape == (13, 8, 1, 1)
    assert torch.equal(merged.inputs[2].const[10:], torch.zeros(3))  # b3a had no bias
    if opset >= 13:
        assert split.inputs[1].const.tolist() == [6, 4, 3]
    else:
        assert split.attributes["split"] == [6, 4, 3] and len(split.inputs) == 1
    assert split.attributes["axis"] == 1
    _assert_same(original, optimized, {"input": _randn(1, 8, 7, 7)})


class Projections(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        self.v = torch.nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.q(x) * self.k(x), self.v(x)


def test_qkv_matmul_projections_merge():
    model = tensorforge.from_torch(Projections(), torch.randn(2, 5, 16), output_names=["qk", "v"])
    original, optimized, report = _optimize(model)
    assert ops(optimized).count("MatMul") == 1
    (fired,) = report.fired("merge-parallel-matmul")
    assert "width 40" in fired.detail
    (split,) = [n for n in optimized.graph if n.op_type == "Split"]
    assert split.attributes["axis"] == 2
    assert [v.name for v in optimized.graph.outputs] == ["qk", "v"]  # a Split output took the name over
    _assert_same(original, optimized, {"input": _randn(2, 5, 16)})


def test_qkv_gemm_projections_merge_with_transposed_weights():
    model = tensorforge.from_torch(Projections(), torch.randn(5, 16))
    original, optimized, report = _optimize(model)
    assert ops(optimized).count("Gemm") == 1  # q and k; v is a MatMul of its own
    (gemm,) = [n for n in optimized.graph if n.op_type == "Gemm"]
    assert gemm.attributes["transB"] == 1 and gemm.inputs[1].const.shape == (32, 16)
    assert len(report.fired("merge-parallel-gemm")) == 1
    declined = report.declined("merge-parallel-matmul")
    assert declined and "only one sibling" in declined[0].detail
    _assert_same(original, optimized, {"input": _randn(5, 16)})


def _gemm_model(biases, trans_b=0, extra=None):
    """Gemm siblings on `a` ([4, 6]); `biases[i]` is the shape of sibling i's C (None for none)."""
    nodes, inits, outputs = [], [], []
    for i, bias in enumerate(biases):
        width = 3 + i
        weight = _randn(width, 6) if trans_b else _randn(6, width)
        inits.append(init(f"w{i}", weight))
        inputs = ["a", f"w{i}"]
        if bias is not None:
            inits.append(init(f"c{i}", _randn(*bias) if bias != "width" else _randn(width)))
            inputs.append(f"c{i}")
        nodes.append(helper.make_node("Gemm", inputs, [f"y{i}"], transB=trans_b, alpha=0.5, beta=2.0))
        outputs.append(tensor_info(f"y{i}", [4, width]))
    return make_model(nodes + (extra or []), [tensor_info("a", [4, 6])], outputs, initializers=inits)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_biases_of_every_broadcast_shape_merge(trans_b):
    proto = _gemm_model(["width", None, (4, 1), (1,), (4, 7)], trans_b=trans_b)
    original, optimized, report = _optimize(import_model(proto))
    assert ops(optimized) == ["Gemm", "Split"]
    assert optimized.graph.nodes[0].inputs[2].const.shape == (4, 3 + 4 + 5 + 6 + 7)
    _assert_same(original, optimized, {"a": _randn(4, 6)})


def _fused_conv_model(specs, opset=17):
    """FusedConv siblings on `x`; each spec is a dict of attributes plus optional `z` / `width` / `bias`."""
    nodes, inits, outputs = [], [], []
    inputs_info = [tensor_info("x", [1, 4, 6, 6])]
    for i, spec in enumerate(specs):
        spec = dict(spec)
        width = spec.pop("width", 3)
        inits.append(init(f"w{i}", _randn(width, 4, 3, 3)))
        inputs = ["x", f"w{i}"]
        if spec.pop("bias", True):
            inits.append(init(f"b{i}", _randn(width)))
            inputs.append(f"b{i}")
        else:
            inputs.append("")
        if spec.pop("z", False):
            inputs.append(f"z{i}")
            inputs_info.append(tensor_info(f"z{i}", [1, width, 6, 6]))
        attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], **spec}
        nodes.append(helper.make_node("FusedConv", inputs, [f"y{i}"], domain="tensorforge", **attrs))
        outputs.append(tensor_info(f"y{i}", [1, width, 6, 6]))
    graph = helper.make_graph(nodes, "fused", inputs_info, outputs, inits)
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("tensorforge", 1)]
    )
    proto.ir_version = 10
    return proto


def _feeds(model):
    return {v.name: _randn(*v.shape) for v in model.graph.inputs if v.name not in model.graph.initializers}


def test_fused_convs_with_the_same_activation_merge_and_keep_it():
    relu = {"pre": "Relu"}
    leaky = {"post": "LeakyRelu", "post_params": [0.2]}
    specs = [relu, {**relu, "width": 5, "bias": False}, leaky, {**leaky, "width": 2}, {"z": True, **relu}]
    model = import_model(_fused_conv_model(specs))
    original, optimized, report = _optimize(model)
    merged = [n for n in optimized.graph if n.op_type == "FusedConv"]
    assert len(merged) == 3  # Relu pair, LeakyRelu pair, the one with a residual
    assert sorted(n.attributes.get("pre", n.attributes.get("post")) for n in merged) == ["LeakyRelu", "Relu", "Relu"]
    assert len(report.fired("merge-parallel-conv")) == 2
    _assert_same(original, optimized, _feeds(model))
    reasons = [e.detail for e in report.declined("merge-parallel-conv")]
    assert any("different attributes" in r and "pre" in r for r in reasons)


def test_fused_gemm_siblings_merge():
    nodes, inits, outputs = [], [], []
    for i, width in enumerate([4, 6]):
        inits += [init(f"w{i}", _randn(width, 8)), init(f"c{i}", _randn(width))]
        attrs = {"transB": 1, "pre": "Gelu"}
        nodes.append(helper.make_node("FusedGemm", ["a", f"w{i}", f"c{i}"], [f"y{i}"], domain="tensorforge", **attrs))
        outputs.append(tensor_info(f"y{i}", [2, 3, width]))
    graph = helper.make_graph(nodes, "g", [tensor_info("a", [2, 3, 8])], outputs, inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tensorforge", 1)])
    proto.ir_version = 10
    original, optimized, report = _optimize(import_model(proto))
    assert [qualified for qualified in ops(optimized)] == ["FusedGemm", "Split"]
    assert optimized.graph.nodes[0].attributes["pre"] == "Gelu"
    assert optimized.graph.nodes[1].attributes["axis"] == 2
    _assert_same(original, optimized, {"a": _randn(2, 3, 8)})


# -- declines ------------------------------------------------------------------------------------------------


def _conv_pair(second=None, weight_as_input=False, share_weight=False):
    second = second or {}
    attrs = {"kernel_shape": [1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["y0"], **attrs),
        helper.make_node("Conv", ["x", "w0" if share_weight else "w1"], ["y1"], **{**attrs, **second}),
    ]
    inputs = [tensor_info("x", [1, 4, 6, 6])]
    inits = [init("w0", _randn(3, 4, 1, 1)), init("w1", _randn(2, 4, 1, 1))]
    if weight_as_input:
        inputs.append(tensor_info("w1", [2, 4, 1, 1]))
        inits = inits[:1]
    out = [tensor_info("y0", None), tensor_info("y1", None)]
    return import_model(make_model(nodes, inputs, out, initializers=inits))


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (lambda: _conv_pair(weight_as_input=True), "weight 'w1' is not constant"),
        (lambda: _conv_pair({"strides": [2, 2]}), "different attributes: strides [1,1] vs [2,2]"),
        (lambda: _conv_pair(share_weight=True), "weight 'w0' is shared with another node"),
        (lambda: _conv_pair({"group": 2}), "grouped convolution (group=2)"),
    ],
)
def test_declines(model, reason):
    original, optimized, report = _optimize(model())
    assert ops(optimized) == ["Conv", "Conv"]
    assert not report.fired()
    assert any(reason in e.detail for e in report.declined("merge-parallel-conv")), report.declined()


def test_declines_a_dtype_mismatch():
    model = _conv_pair()
    weight = model.graph.initializers["w1"]
    weight.const, weight.dtype = weight.const.half(), DType.FLOAT16
    _, optimized, report = _optimize(model)
    assert ops(optimized) == ["Conv", "Conv"]
    (event,) = report.declined("merge-parallel-conv")
    assert "dtype mismatch: weight dtype float32 vs float16" in event.detail


def test_declines_a_lone_layer():
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])]
    inputs, outputs = [tensor_info("x", [1, 4, 6, 6])], [tensor_info("y", None)]
    proto = make_model(nodes, inputs, outputs, initializers=[init("w", _randn(3, 4, 1, 1))])
    _, optimized, report = _optimize(import_model(proto))
    assert ops(optimized) == ["Conv"]
    (event,) = report.declined("merge-parallel-conv")
    assert event.detail == "only one sibling: no other Conv reads its input"


def test_declines_a_matmul_of_activations_silently():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y0"]), helper.make_node("Relu", ["y0"], ["y"])]
    proto = make_model(nodes, [tensor_info("a", [2, 3]), tensor_info("b", [3, 4])], [tensor_info("y", [2, 4])])
    _, _, report = _optimize(import_model(proto))
    assert not report.events


def test_declines_a_residual_input_and_keeps_the_others():
    model = import_model(_fused_conv_model([{"pre": "Relu"}, {"pre": "Relu", "z": True}]))
    original, optimized, report = _optimize(model)
    assert ops(optimized) == ["FusedConv", "FusedConv"]
    (event,) = report.declined("merge-parallel-conv")
    assert "only one sibling can merge" in event.detail and "residual input Z" in event.detail
    _assert_same(original, optimized, _feeds(model))


def test_cse_then_merge_parallel():
    """CSE removes a copied layer and makes the zero biases one shared constant; the merge still fires (a
    shared bias is copied into the merged one, only shared weights decline)."""
    weights = [_randn(3, 4, 1, 1), _randn(3, 4, 1, 1)]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["y0"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["x", "w1", "b1"], ["y1"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["x", "w2", "b2"], ["y2"], kernel_shape=[1, 1]),  # a copy of the first
        helper.make_node("Add", ["y0", "y2"], ["s"]),
    ]
    inits = [init("w0", weights[0]), init("w1", weights[1]), init("w2", weights[0].copy())]
    inits += [init(f"b{i}", np.zeros(3, np.float32)) for i in range(3)]
    outputs = [tensor_info("s", None), tensor_info("y1", None)]
    model = import_model(make_model(nodes, [tensor_info("x", [1, 4, 6, 6])], outputs, initializers=inits))
    original, optimized, report = _optimize(model, [CommonSubexpressions(), MergeParallel()])
    assert len(report.fired("identical-constants")) == 3 and len(report.fired("cse")) == 1
    assert len(report.fired("merge-parallel-conv")) == 1
    assert ops(optimized).count("Conv") == 1
    _assert_same(original, optimized, _feeds(model))


def test_declines_a_bias_that_is_not_constant_and_a_weight_that_is_an_output():
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["y0"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["x", "w1"], ["y1"], kernel_shape=[1, 1]),
    ]
    inputs = [tensor_info("x", [1, 4, 6, 6]), tensor_info("b0", [3])]
    outputs = [tensor_info("y0", None), tensor_info("y1", None), tensor_info("w1", [2, 4, 1, 1])]
    inits = [init("w0", _randn(3, 4, 1, 1)), init("w1", _randn(2, 4, 1, 1))]
    _, optimized, report = _optimize(import_model(make_model(nodes, inputs, outputs, initializers=inits)))
    assert ops(optimized) == ["Conv", "Conv"]
    (event,) = report.declined("merge-parallel-conv")
    assert "bias 'b0' is not constant" in event.detail
    nodes[0] = helper.make_node("Conv", ["x", "w0"], ["y0"], kernel_shape=[1, 1])
    _, optimized, report = _optimize(import_model(make_model(nodes, inputs[:1], outputs, initializers=inits)))
    (event,) = report.declined("merge-parallel-conv")
    assert "weight 'w1' is a graph output" in event.detail
