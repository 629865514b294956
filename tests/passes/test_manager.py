import numpy as np
from onnx import helper

from tensorforge.frontend import import_model
from tensorforge.ir import Node, Value
from tensorforge.ops import Executor
from tensorforge.passes import Pass, PassManager
from tests.helpers import make_model, tensor_info
from tests.passes.support import DropNegPass


class _Vandal(Pass):
    """A broken pass: wires a node to a value nothing defines."""

    name = "vandal"

    def run(self, ctx):
        graph = ctx.model.graph
        graph.nodes[0].set_input(0, Value("nowhere"))
        graph.append(Node("Relu", [Value("ghost")], [Value("junk")]))
        return True


def _model():
    nodes = [
        helper.make_node("Neg", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Neg", ["c"], ["d"]),
        helper.make_node("Neg", ["d"], ["y"]),
    ]
    return make_model(nodes, [tensor_info("x", [4])], [tensor_info("y", [4])])


def test_rules_fire_to_a_fixed_point_and_are_recorded():
    model, report = PassManager([DropNegPass()]).run(import_model(_model()))
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert model.graph.outputs[0].name == "y"  # the graph output keeps its name
    assert report.nodes_before == 5 and report.nodes_after == 1
    assert len(report.fired("double-neg")) == 2
    x = np.array([-1, 2, -3, 4], np.float32)
    np.testing.assert_array_equal(Executor(model).run({"x": x})["y"].numpy(), np.maximum(x, 0))


def test_a_rule_declines_with_its_reason():
    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    model = import_model(make_model(nodes, [tensor_info("x", [4])], [tensor_info("y", [4])]))
    model, report = PassManager([DropNegPass()]).run(model)
    assert len(model.graph) == 2
    (event,) = report.declined("double-neg")
    assert "'y' is a graph output" in event.detail


def test_a_broken_pass_is_rolled_back_and_reported():
    original = import_model(_model())
    model, report = PassManager([_Vandal(), DropNegPass()]).run(original)
    assert [n.op_type for n in model.graph] == ["Relu"]
    failures = [e for e in report.events if e.status == "failed"]
    assert failures and "left an invalid graph" in failures[0].detail
    assert "FAILED and rolled back" in report.format()
