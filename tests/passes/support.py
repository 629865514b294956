"""Helpers shared by the pass tests."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ops import Executor
from tensorforge.passes import PassManager, Rule, RulePass
from tensorforge.passes.utils import bypass, is_graph_output, rewire_problem
from tests.helpers import relative_error


def init(name, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def ops(model) -> list[str]:
    return [n.op_type for n in model.graph]


def optimize_and_compare(proto: onnx.ModelProto, feeds_list, passes):
    """Run `passes` on an import of `proto`; compare with an unoptimized import on every feeds dict."""
    model, report = PassManager(list(passes)).run(import_model(proto))
    reference = Executor(import_model(proto))
    optimized = Executor(model)
    for feeds in feeds_list:
        expected = reference.run(feeds)
        actual = optimized.run(feeds)
        assert list(actual) == list(expected)  # same output names, same order
        for name, want in expected.items():
            got = actual[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            if want.dtype.is_floating_point:
                assert relative_error(got.numpy(), want.numpy()) <= 1e-5, name
            else:
                assert torch.equal(got, want), name
    assert not [e for e in report.events if e.status == "failed"], report.format()
    return model, report


class DropNeg(Rule):
    """Neg(Neg(x)) = x."""

    name = "double-neg"
    op_types = ("Neg",)

    def match(self, node, ctx):
        inner = node.inputs[0].producer()
        return (node, inner) if inner is not None and inner.op_type == "Neg" else None

    def check(self, match, ctx):
        node, inner = match
        return rewire_problem(node.outputs[0], inner.inputs[0])

    def rewrite(self, match, ctx):
        node, inner = match
        bypass(node, node.outputs[0], inner.inputs[0])
        if not inner.outputs[0].uses() and not is_graph_output(inner.outputs[0]):
            ctx.model.graph.remove(inner)
        return "removed a Neg pair"


class DropNegPass(RulePass):
    name = "drop-neg"
    rules = (DropNeg,)
