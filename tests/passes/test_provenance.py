"""Provenance through the optimizer: which original nodes each optimized node stands for (`Node.origins`),
and which original value each optimized value equals (`Value.origin`), kept by the rule infrastructure and
carried through clones and serialization."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
from onnx import helper

from tensorforge import zoo
from tensorforge.frontend import import_model
from tensorforge.ir import Model, Value, qualified_op
from tensorforge.ir.clone import clone_model
from tensorforge.ir.serialize import model_from_dict, model_to_dict
from tensorforge.ops import Executor
from tensorforge.passes.cleanup import Cleanup
from tensorforge.passes.cse import CommonSubexpressions
from tensorforge.passes.manager import PassManager
from tensorforge.passes.pipeline import optimize
from tests.helpers import make_model, relative_error, tensor_info

REL_TOL = 1e-5  # float32 rewrites of one graph (docs/design.md, "Accuracy metric")
ZOO = ["resnet50", "inception", "transformer", "mobilenetv3"]


@functools.cache
def _optimized(name: str) -> tuple[Model, Model]:
    """The imported zoo model and its optimized copy (shared by the tests; they do not change them)."""
    original = import_model(zoo.export(name))
    model, report = optimize(clone_model(original))
    assert not [e for e in report.events if e.status == "failed"], report.format()
    return original, model


@pytest.fixture(params=ZOO)
def optimized(request) -> tuple[str, Model, Model]:
    return request.param, *_optimized(request.param)


def _producers(model: Model) -> dict[str, str]:
    """Original value name -> the name of the node producing it."""
    return {v.name: node.name for node in model.graph.nodes for v in node.outputs if v.name}


def test_resnet50_fused_convs_name_their_conv_batchnorm_add_and_relu():
    original, model = _optimized("resnet50")
    by_name = {node.name: node for node in original.graph.nodes}
    fused = [node for node in model.graph.nodes if qualified_op(node) == "tensorforge::FusedConv"]
    assert len(fused) == 53
    for node in fused:
        kinds = [by_name[name].op_type for name in node.origins]
        assert kinds[:2] == ["Conv", "BatchNormalization"], node.origins
        assert kinds[2:] in ([], ["Relu"], ["Add", "Relu"]), node.origins
        # The origins are a chain of the original graph, and the fused output equals the chain's end.
        chain = [by_name[name] for name in node.origins]
        for producer, consumer in itertools.pairwise(chain):
            assert producer.outputs[0] in consumer.inputs, (producer.name, consumer.name)
        assert node.outputs[0].origin == chain[-1].outputs[0].name
        assert node.attributes.get("post", node.attributes.get("pre", "")) == ("Relu" if "Relu" in kinds else "")
    with_residual = [node for node in fused if len(node.origins) == 4]
    assert len(with_residual) == 16  # every Add of the 16 bottlenecks went into a convolution
    # No fusion merges layers here: the origins partition the original nodes.
    names = [name for node in model.graph.nodes for name in node.origins]
    assert sorted(names) == sorted(node.name for node in original.graph.nodes)


def test_every_origin_is_an_original_node_and_produces_the_values_it_names(optimized):
    name, original, model = optimized
    originals = {node.name for node in original.graph.nodes}
    producer_of = _producers(original)
    for node in model.graph.nodes:
        assert node.origins, f"{name}: {node.label} has no origins"
        assert set(node.origins) <= originals, node.origins
        for value in node.outputs:
            if value.origin is not None and value.origin in producer_of:
                assert producer_of[value.origin] in node.origins, (node.label, value.origin)
    if name in ("resnet50", "inception"):  # nothing is folded or dropped: every original node is accounted for
        assert {n for node in model.graph.nodes for n in node.origins} == originals


def test_values_with_an_origin_equal_it(optimized, rng):
    """Both graphs run on the executor with every intermediate as an output; each optimized value that names
    an original value must hold the same tensor."""
    name, original, model = optimized
    feeds = {"input": rng.standard_normal(zoo.input_shape(name)).astype(np.float32)}
    expected = _run_all(original, {v for node in original.graph.nodes for v in node.outputs})
    recorded = [v for node in model.graph.nodes for v in node.outputs if v.origin is not None]
    actual = _run_all(model, set(recorded))
    reference, ours = expected(feeds), actual(feeds)
    compared = 0
    for value in recorded:
        want, got = reference[value.origin], ours[value.name]
        assert tuple(got.shape) == tuple(want.shape), value.name
        if want.dtype.is_floating_point:
            error = relative_error(got.numpy(), want.numpy())
            assert error <= REL_TOL, f"{name}: {value.name} vs {value.origin}: relative error {error:.3g}"
        else:
            assert torch.equal(got, want), value.name
        compared += 1
    fused_values = [v for v in recorded if v.name != v.origin]  # renamed by a rewrite: the interesting ones
    assert compared >= 5 and len(fused_values) >= 3, (compared, len(fused_values))


def _run_all(model: Model, values: set[Value]):
    """A function running a copy of `model` whose outputs are its own plus `values` (by name)."""
    copy = clone_model(model)
    names = {v.name for v in values if v.name}
    extra = [v for node in copy.graph.nodes for v in node.outputs if v.name in names]
    copy.graph.outputs = list(dict.fromkeys([*copy.graph.outputs, *extra]))
    executor = Executor(copy)
    return executor.run


def test_merged_transposes_and_cse_keep_the_removed_nodes_with_the_survivor():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1], name="inner"),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0, 2], name="outer"),
        helper.make_node("Relu", ["t2"], ["r1"], name="relu_a"),
        helper.make_node("Relu", ["t2"], ["r2"], name="relu_b"),
        helper.make_node("Add", ["r1", "r2"], ["y"], name="add"),
    ]
    proto = make_model(nodes, [tensor_info("x", [2, 3, 4])], [tensor_info("y", None)])
    model, _ = PassManager([Cleanup(), CommonSubexpressions()]).run(import_model(proto))
    by_op = {node.op_type: node for node in model.graph.nodes}
    assert set(by_op) == {"Transpose", "Relu", "Add"}
    assert by_op["Transpose"].origins == ("inner", "outer")  # producers first
    assert by_op["Relu"].origins == ("relu_a", "relu_b")
    assert by_op["Add"].origins == ("add",)


def test_origins_survive_clone_and_serialization():
    model = _optimized("inception")[1]
    data, tensors = model_to_dict(model)
    for copy in (clone_model(model), model_from_dict(data, tensors)):
        assert [n.origins for n in copy.graph.nodes] == [n.origins for n in model.graph.nodes]
        values = [(v.name, v.origin) for n in copy.graph.nodes for v in n.outputs]
        assert values == [(v.name, v.origin) for n in model.graph.nodes for v in n.outputs]
    # A file written before provenance existed still loads, with none.
    for node in data["graph"]["nodes"]:
        del node["origins"]
        for value in node["outputs"]:
            del value["origin"]
    old = model_from_dict(data, tensors)
    assert all(n.origins == () and all(v.origin is None for v in n.outputs) for n in old.graph.nodes)


def test_a_second_optimization_keeps_the_first_origins():
    model = clone_model(_optimized("inception")[1])
    before = [(n.name, n.origins) for n in model.graph.nodes]
    again, _ = optimize(model)
    assert [(n.name, n.origins) for n in again.graph.nodes] == before
