import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from tensorforge.frontend import import_model
from tensorforge.passes import PassManager
from tensorforge.passes.cleanup import Cleanup, reshape_is_noop
from tests.helpers import make_model, tensor_info
from tests.passes.support import init, ops, optimize_and_compare


def _ints(name, values):
    return init(name, np.array(values, np.int64))


def _optimize(proto: onnx.ModelProto, feeds_list):
    """Run Cleanup on an import of `proto`; compare with an unoptimized import on every feeds dict."""
    return optimize_and_compare(proto, feeds_list, [Cleanup()])


def _feeds(rng, shape, batches=None):
    if batches is None:
        return [{"x": rng.standard_normal(shape).astype(np.float32)}]
    return [{"x": rng.standard_normal((n, *shape[1:])).astype(np.float32)} for n in batches]


def _chain(node, in_shape, out_shape=None, inits=(), opset=17):
    """x → Relu → `node` (reading "r", writing "n") → Neg → y, so that removing `node` needs no renaming."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), node, helper.make_node("Neg", ["n"], ["y"])]
    return make_model(
        nodes, [tensor_info("x", in_shape)], [tensor_info("y", out_shape)], opset=opset, initializers=list(inits)
    )


# -- no-op removal ---------------------------------------------------------------------------------------

NOOPS = {
    "identity": (helper.make_node("Identity", ["r"], ["n"]), [2, 3], (), "remove-identity"),
    "dropout": (helper.make_node("Dropout", ["r"], ["n"], seed=3), [2, 3], (), "remove-dropout"),
    "dropout-false": (
        helper.make_node("Dropout", ["r", "ratio", "mode"], ["n"]),
        [2, 3],
        (init("ratio", np.array(0.3, np.float32)), init("mode", np.array(False))),
        "remove-dropout",
    ),
    "reshape": (helper.make_node("Reshape", ["r", "s"], ["n"]), [2, 3, 4], (_ints("s", [2, -1, 4]),), None),
    "reshape-dynamic": (helper.make_node("Reshape", ["r", "s"], ["n"]), ["N", 3, 4], (_ints("s", [0, 3, -1]),), None),
    "reshape-allowzero": (
        helper.make_node("Reshape", ["r", "s"], ["n"], allowzero=1),
        [0, 3],
        (_ints("s", [0, 3]),),
        "remove-noop-reshape",
    ),
    "transpose": (helper.make_node("Transpose", ["r"], ["n"], perm=[0, 1, 2]), [2, 3, 4], (), None),
    "transpose-rank1": (helper.make_node("Transpose", ["r"], ["n"]), [5], (), "remove-noop-transpose"),
    "cast": (helper.make_node("Cast", ["r"], ["n"], to=TensorProto.FLOAT), [2, 3], (), None),
    "castlike": (
        helper.make_node("CastLike", ["r", "like"], ["n"]),
        [2, 3],
        (init("like", np.zeros(1, np.float32)),),
        "remove-noop-cast",
    ),
    "pad": (
        helper.make_node("Pad", ["r", "pads"], ["n"], mode="reflect"),
        [2, 3],
        (_ints("pads", [0, 0, 0, 0]),),
        None,
    ),
    "slice": (
        helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["n"]),
        ["N", 3, 4],
        (_ints("starts", [0, -3]), _ints("ends", [2**63 - 1, 100]), _ints("axes", [0, 1])),
        None,
    ),
    "squeeze": (helper.make_node("Squeeze", ["r"], ["n"]), [2, 3], (), None),
    "unsqueeze": (helper.make_node("Unsqueeze", ["r", "axes"], ["n"]), [2, 3], (_ints("axes", []),), None),
    "expand": (helper.make_node("Expand", ["r", "s"], ["n"]), ["N", 3, 4], (_ints("s", [1, 4]),), None),
}


@pytest.mark.parametrize("case", list(NOOPS))
def test_noop_nodes_are_removed(case, rng):
    node, shape, inits, rule = NOOPS[case]
    proto = _chain(node, shape, inits=inits)
    batches = (1, 3) if isinstance(shape[0], str) else None
    model, report = _optimize(proto, _feeds(rng, [2 if isinstance(d, str) else d for d in shape], batches))
    assert ops(model) == ["Relu", "Neg"]
    rule = rule or f"remove-noop-{node.op_type.lower()}"
    assert len(report.fired(rule)) == 1


SOMETHING = {
    "reshape": (helper.make_node("Reshape", ["r", "s"], ["n"]), [2, 3, 4], (_ints("s", [3, 2, 4]),)),
    "reshape-dynamic": (helper.make_node("Reshape", ["r", "s"], ["n"]), ["N", 3, 4], (_ints("s", [2, 3, -1]),)),
    "transpose": (helper.make_node("Transpose", ["r"], ["n"], perm=[1, 0, 2]), [2, 3, 4], ()),
    "transpose-default": (helper.make_node("Transpose", ["r"], ["n"]), [2, 3], ()),
    "cast": (helper.make_node("Cast", ["r"], ["n"], to=TensorProto.FLOAT16), [2, 3], ()),
    "pad": (helper.make_node("Pad", ["r", "pads"], ["n"]), [2, 3], (_ints("pads", [0, 1, 0, 0]),)),
    "slice-step": (
        helper.make_node("Slice", ["r", "starts", "ends", "axes", "steps"], ["n"]),
        [2, 3],
        (_ints("starts", [0]), _ints("ends", [3]), _ints("axes", [1]), _ints("steps", [2])),
    ),
    "slice-short": (
        helper.make_node("Slice", ["r", "starts", "ends"], ["n"]),
        [4, 3],
        (_ints("starts", [1]), _ints("ends", [100])),
    ),
    "slice-dynamic": (  # an end of 1000 may not cover a dynamic dim
        helper.make_node("Slice", ["r", "starts", "ends"], ["n"]),
        ["N", 3],
        (_ints("starts", [0]), _ints("ends", [1000])),
    ),
    "squeeze": (helper.make_node("Squeeze", ["r"], ["n"]), [2, 1, 3], ()),
    "squeeze-dynamic": (helper.make_node("Squeeze", ["r"], ["n"]), ["N", 3], ()),
    "expand": (helper.make_node("Expand", ["r", "s"], ["n"]), ["N", 3, 1], (_ints("s", [1, 4]),)),
    "expand-rank": (helper.make_node("Expand", ["r", "s"], ["n"]), [3, 4], (_ints("s", [1, 3, 4]),)),
}


@pytest.mark.parametrize("case", list(SOMETHING))
def test_nodes_that_do_something_stay(case, rng):
    node, shape, inits = SOMETHING[case]
    proto = _chain(node, shape, inits=inits)
    concrete = [1 if isinstance(d, str) else d for d in shape]
    batches = (1, 2) if isinstance(shape[0], str) else None
    model, report = _optimize(proto, _feeds(rng, concrete, batches))
    assert ops(model) == ["Relu", node.op_type, "Neg"]
    assert not report.fired() and not report.declined()


def test_reshape_noop_predicate():
    assert reshape_is_noop(["N", 3], [0, -1], allowzero=False)
    assert reshape_is_noop(["N", 3], [-1, 3], allowzero=False)
    assert not reshape_is_noop(["N", 3], [-1, -1], allowzero=False)
    assert not reshape_is_noop(["N", 3], [0, -1], allowzero=True)
    assert not reshape_is_noop([0, 3], [0, -1], allowzero=False)  # -1 is ambiguous with zero elements
    assert not reshape_is_noop(None, [2, 3], allowzero=False)


def test_a_graph_output_does_not_become_an_input():
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Cast", ["w"], ["z"], to=TensorProto.FLOAT)]
    outputs = [tensor_info("y", [2]), tensor_info("z", [2])]
    proto = make_model(nodes, [tensor_info("x", [2])], outputs, initializers=[init("w", np.ones(2, np.float32))])
    model, report = _optimize(proto, [{"x": np.array([1, 2], np.float32)}])
    assert ops(model) == ["Identity", "Cast"]
    details = [e.detail for e in report.declined()]
    assert len(details) == 2 and all("is a graph output" in d for d in details)


def test_a_graph_output_keeps_its_name_when_its_producer_is_removed(rng):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])]
    proto = make_model(nodes, [tensor_info("x", [3])], [tensor_info("y", [3])])
    model, report = _optimize(proto, _feeds(rng, [3]))
    assert ops(model) == ["Relu"] and model.graph.outputs[0].name == "y"


def test_dropout_declines():
    nodes = [
        helper.make_node("Dropout", ["x"], ["a", "mask"]),
        helper.make_node("Dropout", ["x", "", "on"], ["b"]),
        helper.make_node("Dropout", ["x", "", "mode"], ["c"]),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Sum", ["a", "m"], ["y"]),
    ]
    inputs = [tensor_info("x", [4]), tensor_info("mode", [], TensorProto.BOOL)]
    outputs = [tensor_info("y", [4]), tensor_info("b", [4]), tensor_info("c", [4])]
    proto = make_model(nodes, inputs, outputs, initializers=[init("on", np.array(True))])
    model, report = PassManager([Cleanup()]).run(import_model(proto))
    assert ops(model).count("Dropout") == 3
    reasons = sorted(e.detail for e in report.declined("remove-dropout"))
    assert reasons == ["its mask output is used", "training_mode is not a constant", "training_mode is true"]


def test_old_dropout_in_training_mode_stays(rng):
    nodes = [helper.make_node("Dropout", ["r"], ["n"], is_test=0), helper.make_node("Dropout", ["n"], ["t"], is_test=1)]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), *nodes, helper.make_node("Neg", ["t"], ["y"])]
    proto = make_model(nodes, [tensor_info("x", [4])], [tensor_info("y", [4])], opset=6)
    model, report = PassManager([Cleanup()]).run(import_model(proto))
    assert ops(model) == ["Relu", "Dropout", "Neg"]
    assert "is_test=0" in report.declined("remove-dropout")[0].detail


# -- pairs -----------------------------------------------------------------------------------------------


def _pair(first, second, in_shape, inits=(), outputs=("y",), extra=()):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), first, second, helper.make_node("Neg", ["b"], ["y"]), *extra]
    infos = [tensor_info(name, None) for name in outputs]
    return make_model(nodes, [tensor_info("x", in_shape)], infos, initializers=list(inits))


def test_cancelling_transposes_vanish(rng):
    proto = _pair(
        helper.make_node("Transpose", ["r"], ["a"], perm=[1, 2, 0]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[2, 0, 1]),
        [2, 3, 4],
    )
    model, report = _optimize(proto, _feeds(rng, [2, 3, 4]))
    assert ops(model) == ["Relu", "Neg"] and len(report.fired("cancel-transposes")) == 1


def test_cancelling_transposes_keep_a_shared_intermediate(rng):
    extra = [helper.make_node("Abs", ["a"], ["z"])]
    proto = _pair(
        helper.make_node("Transpose", ["r"], ["a"]),
        helper.make_node("Transpose", ["a"], ["b"]),
        [2, 3, 4],
        outputs=("y", "z"),
        extra=extra,
    )
    model, report = _optimize(proto, _feeds(rng, [2, 3, 4]))
    assert sorted(ops(model)) == ["Abs", "Neg", "Relu", "Transpose"]
    (neg,) = [n for n in model.graph if n.op_type == "Neg"]
    assert neg.inputs[0].name == "r" and len(report.fired("cancel-transposes")) == 1


def test_consecutive_transposes_merge(rng):
    proto = _pair(
        helper.make_node("Transpose", ["r"], ["a"], perm=[1, 0, 2, 3]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 3, 1]),
        [2, 3, 4, 5],
    )
    model, report = _optimize(proto, _feeds(rng, [2, 3, 4, 5]))
    assert ops(model) == ["Relu", "Transpose", "Neg"]
    assert model.graph.nodes[1].attributes["perm"] == [1, 2, 3, 0]
    assert len(report.fired("merge-transposes")) == 1


def test_merging_transposes_declines_for_a_shared_or_output_intermediate(rng):
    first = helper.make_node("Transpose", ["r"], ["a"], perm=[1, 0, 2])
    second = helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1])
    shared = _pair(first, second, [2, 3, 4], outputs=("y", "z"), extra=[helper.make_node("Abs", ["a"], ["z"])])
    model, report = _optimize(shared, _feeds(rng, [2, 3, 4]))
    assert ops(model).count("Transpose") == 2
    assert "'a' is used by another node" in report.declined("merge-transposes")[0].detail
    output = _pair(first, second, [2, 3, 4], outputs=("y", "a"))
    model, report = _optimize(output, _feeds(rng, [2, 3, 4]))
    assert ops(model).count("Transpose") == 2
    assert "'a' is a graph output" in report.declined("merge-transposes")[0].detail


def test_consecutive_reshapes_merge(rng):
    proto = _pair(
        helper.make_node("Reshape", ["r", "s1"], ["a"]),
        helper.make_node("Reshape", ["a", "s2"], ["b"]),
        [2, 3, 4],
        inits=[_ints("s1", [6, 4]), _ints("s2", [-1, 12])],
    )
    model, report = _optimize(proto, _feeds(rng, [2, 3, 4]))
    assert ops(model) == ["Relu", "Reshape", "Neg"]
    assert model.graph.nodes[1].inputs[0].name == "r"
    assert len(report.fired("merge-reshapes")) == 1


def test_merged_reshapes_resolve_copied_dims(rng):
    # The 0 in s2 copies dim 0 of the intermediate (6), not of x (2): it must become 6.
    proto = _pair(
        helper.make_node("Reshape", ["r", "s1"], ["a"]),
        helper.make_node("Reshape", ["a", "s2"], ["b"]),
        [2, 3, 4],
        inits=[_ints("s1", [6, 4]), _ints("s2", [0, 2, 2])],
    )
    model, report = _optimize(proto, _feeds(rng, [2, 3, 4]))
    assert ops(model) == ["Relu", "Reshape", "Neg"]
    assert model.graph.nodes[1].inputs[1].const.tolist() == [6, 2, 2]


def test_merging_reshapes_declines(rng):
    first = helper.make_node("Reshape", ["r", "s1"], ["a"])
    second = helper.make_node("Reshape", ["a", "s2"], ["b"])
    # A 0 that copies a dynamic dim of the intermediate cannot be resolved.
    dynamic = _pair(first, second, ["N", 3, 4], inits=[_ints("s1", [-1, 4]), _ints("s2", [0, 2, 2])])
    model, report = _optimize(dynamic, _feeds(rng, [2, 3, 4], batches=(1, 2)))
    assert ops(model).count("Reshape") == 2
    assert "not static" in report.declined("merge-reshapes")[0].detail
    inits = [_ints("s1", [6, 4]), _ints("s2", [4, 6])]
    shared = _pair(
        first, second, [2, 3, 4], inits=inits, outputs=("y", "z"), extra=[helper.make_node("Abs", ["a"], ["z"])]
    )
    model, report = _optimize(shared, _feeds(rng, [2, 3, 4]))
    assert ops(model).count("Reshape") == 2
    assert "used by another node" in report.declined("merge-reshapes")[0].detail
    output = _pair(first, second, [2, 3, 4], inits=inits, outputs=("y", "a"))
    model, report = _optimize(output, _feeds(rng, [2, 3, 4]))
    assert "is a graph output" in report.declined("merge-reshapes")[0].detail
    computed = make_model(
        [
            helper.make_node("Reshape", ["x", "s1"], ["a"]),
            helper.make_node("Reshape", ["a", "t"], ["y"]),
        ],
        [tensor_info("x", [2, 3, 4]), tensor_info("t", [2], TensorProto.INT64)],
        [tensor_info("y", None)],
        initializers=[_ints("s1", [6, 4])],
    )
    model, report = PassManager([Cleanup()]).run(import_model(computed))
    assert "not a constant" in report.declined("merge-reshapes")[0].detail


def test_an_exported_reshape_chain_merges(rng):
    class Net(torch.nn.Module):
        def forward(self, x):
            y = x.permute(0, 2, 3, 1).permute(0, 3, 1, 2)  # cancels
            y = torch.nn.functional.dropout(y, 0.5, training=False)
            y = y.reshape(y.shape[0], 3, -1).reshape(-1, 12)
            return y.transpose(0, 1).contiguous().transpose(1, 0) * 2

    proto = _export(Net(), torch.randn(2, 3, 2, 2))
    model, report = _optimize(proto, _feeds(rng, [2, 3, 2, 2]))
    assert ops(model) == ["Reshape", "Mul"]  # the exporter already cancelled the transposes
    assert len(report.fired("merge-reshapes")) == 1


def _export(module, example):
    from tensorforge.frontend.torch_import import export_onnx

    return export_onnx(module.eval(), example, input_names=["x"])
