"""Attention recognition: the two MatMuls around a softmax become one Attention node, with the scale and the
additive mask; declines where an intermediate is needed; the vendor SDPA tactic against the reference."""

import math

import numpy as np
import pytest
import torch
from onnx import helper

from tensorforge import zoo
from tensorforge.frontend import import_model
from tensorforge.passes.attention import RecognizeAttention
from tensorforge.passes.patterns import RecognizePatterns
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import DEVICES, make_model, tensor_info
from tests.passes.support import init, ops, optimize_and_compare

Q, KT, V, MASK = [2, 4, 6, 8], [2, 4, 8, 5], [2, 4, 5, 3], [2, 1, 1, 5]


def _attention_model(scaling="Div", mask=True, expose=None):
    """softmax(Q @ Kᵀ (/ or ·) c (+ mask)) @ V; `expose` makes an intermediate a graph output too."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"])]
    last = "s"
    if scaling:
        nodes.append(helper.make_node(scaling, ["s", "c"], ["t"]))
        last = "t"
    if mask:
        nodes.append(helper.make_node("Add", [last, "mask"], ["l"]))
        last = "l"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [tensor_info("q", Q), tensor_info("kt", KT), tensor_info("v", V)]
    inputs += [tensor_info("mask", MASK)] if mask else []
    outputs = [tensor_info("y", None)] + ([tensor_info(expose, None)] if expose else [])
    return make_model(nodes, inputs, outputs, 17, [init("c", np.float32(math.sqrt(8)))])


def _feeds(mask=True):
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in (("q", Q), ("kt", KT), ("v", V))}
    if mask:
        feeds["mask"] = np.where(rng.random(MASK) < 0.3, -1e4, 0).astype(np.float32)
    return feeds


@pytest.mark.parametrize(("scaling", "mask"), [("Div", True), ("Mul", True), ("Div", False), (None, True)])
def test_attention_is_one_node_and_computes_the_same(scaling, mask):
    proto = _attention_model(scaling, mask)
    model, report = optimize_and_compare(proto, [_feeds(mask)], [RecognizeAttention()])
    assert ops(model) == ["Attention"]
    (node,) = model.graph.nodes
    expected = {"Div": 1 / math.sqrt(8), "Mul": math.sqrt(8), None: 1.0}[scaling]
    assert node.attributes["scale"] == pytest.approx(expected)
    assert (node.inputs[3] is not None) == mask
    assert len(report.fired()) == 1


def test_attention_declines_when_the_probabilities_are_an_output():
    model, report = optimize_and_compare(_attention_model(expose="p"), [_feeds()], [RecognizeAttention()])
    assert "Attention" not in ops(model)
    assert any("'p' is a graph output" in e.detail for e in report.declined("attention"))


def _heads_merged_model(perm=(0, 2, 1, 3), expose=False):
    """The attention's result transposed by `perm` and reshaped to [B, Sq, H·Dv]; `expose`: the result an output."""
    proto = _attention_model()
    graph = proto.graph
    graph.output[0].name = "o"
    graph.node[-1].output[0] = "y"
    graph.node.extend([
        helper.make_node("Transpose", ["y"], ["yt"], perm=list(perm)),
        helper.make_node("Reshape", ["yt", "merged"], ["o"]),
    ])  # fmt: skip
    shape = [Q[0], Q[2], -1] if list(perm) == [0, 2, 1, 3] else [Q[0], -1]
    graph.initializer.append(init("merged", np.array(shape, np.int64)))
    if expose:
        graph.output.append(tensor_info("y", None))
    return proto


def test_the_heads_transpose_goes_into_the_attention():
    model, report = optimize_and_compare(_heads_merged_model(), [_feeds()], [RecognizeAttention()])
    assert ops(model) == ["Attention", "Reshape"]
    attention = model.graph.nodes[0]
    assert attention.attributes["transposed"] == 1
    assert attention.outputs[0].shape == (Q[0], Q[2], Q[1], V[3])
    assert sorted(e.rule for e in report.fired()) == ["attention", "transposed-attention"]


def test_the_heads_transpose_stays_where_the_plain_result_is_needed_or_the_order_differs():
    model, report = optimize_and_compare(_heads_merged_model(expose=True), [_feeds()], [RecognizeAttention()])
    assert ops(model) == ["Attention", "Transpose", "Reshape"]
    assert any("is a graph output" in e.detail for e in report.declined("transposed-attention"))
    model, _ = optimize_and_compare(_heads_merged_model(perm=(0, 2, 3, 1)), [_feeds()], [RecognizeAttention()])
    assert ops(model) == ["Attention", "Transpose", "Reshape"]
    assert not model.graph.nodes[0].attributes.get("transposed", 0)


def test_the_zoo_transformers_get_one_attention_per_layer():
    for name, layers in (("bert_base", 12), ("vit_s16", 12)):
        model, _ = optimize(import_model(zoo.export(name, dynamic_batch=False)))
        assert ops(model).count("Attention") == layers, name
        assert "Softmax" not in ops(model), name
        attentions = [node for node in model.graph.nodes if node.op_type == "Attention"]
        assert all(node.attributes.get("transposed") == 1 for node in attentions), name  # the heads' Transpose in


def test_recognition_runs_after_softmax_recognition():
    """A written-out softmax is recognized first, then the attention around it."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("ReduceMax", ["s", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["s", "m"], ["d"]),
        helper.make_node("Exp", ["d"], ["e"]),
        helper.make_node("ReduceSum", ["e", "axes"], ["z"], keepdims=1),
        helper.make_node("Div", ["e", "z"], ["p"]),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = [tensor_info("q", Q), tensor_info("kt", KT), tensor_info("v", V)]
    proto = make_model(nodes, inputs, [tensor_info("y", None)], 18, [init("axes", np.array([-1], np.int64))])
    model, _ = optimize_and_compare(proto, [_feeds(mask=False)], [RecognizePatterns(), RecognizeAttention()])
    assert ops(model) == ["Attention"]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_the_sdpa_tactic_matches_the_reference(device, transposed):
    model, _ = optimize(import_model(_heads_merged_model() if transposed else _attention_model()))
    node = model.graph.nodes[0]
    assert node.op_type == "Attention" and node.attributes.get("transposed", 0) == transposed
    feeds = [torch.from_numpy(a).to(device) for a in _feeds().values()]
    choice = autotune(node, 1, feeds, device, effort=0)
    sdpa = next(c for c in choice.candidates if c.tactic == "vendor.torch-sdpa")
    assert math.isfinite(sdpa.median_ms), sdpa.note
    dev = torch.device(device)
    ours = build_layer_kernel(tactic_by_key("vendor.torch-sdpa"), node, 1, dev, sdpa.config, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, dev, sdpa.config, {})(feeds)[0]
    assert ours.shape == want.shape == node.outputs[0].shape and ours.is_contiguous()
    assert relative_error(ours, want) <= 1e-5
