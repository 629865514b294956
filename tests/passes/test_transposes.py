"""Pointwise ops hoisted above a layer's transposed output (passes.transposes), and what that lets fold and fuse."""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import helper

from tensorforge.passes import qualified_op
from tensorforge.passes.cleanup import Cleanup
from tensorforge.passes.epilogue import FuseEpilogue
from tensorforge.passes.fold_bn import FoldBatchNorm
from tensorforge.passes.shapes import InferShapes
from tensorforge.passes.transposes import HoistThroughTransposes, inverse
from tests.helpers import make_model, tensor_info
from tests.passes.support import init, optimize_and_compare

N, H, W, C = 2, 3, 4, 8
TO_NCHW = [0, 3, 1, 2]
PASSES = (InferShapes(), HoistThroughTransposes(), Cleanup(), FoldBatchNorm(), FuseEpilogue())


def _rand(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _linear_then(tail: list, inputs: list, initializers: list, outputs=("y",)):
    """h [N, H, W, C] → MatMul W → Add b → Transpose to NCHW ("t"), then `tail`."""
    nodes = [
        helper.make_node("MatMul", ["h", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Transpose", ["pb"], ["t"], perm=TO_NCHW),
        *tail,
    ]
    return make_model(
        nodes,
        [tensor_info("h", [N, H, W, C]), *inputs],
        [tensor_info(name, None) for name in outputs],
        initializers=[init("w", _rand(C, C, seed=1)), init("b", _rand(C, seed=2)), *initializers],
    )


def _feeds(*names):
    shapes = {"h": (N, H, W, C), "r": (N, C, H, W), "x": (N, C, H, W)}
    return [{name: _rand(*shapes[name], seed=10 + i) for i, name in enumerate(names)}]


def _ops(model) -> Counter:
    return Counter(qualified_op(n) for n in model.graph)


def test_a_layer_scale_and_residual_after_the_transpose_fold_and_fuse_into_the_linear_layer():
    """ConvNeXt's block tail: Linear → Transpose → Mul γ[C,1,1] → Add r. The Mul folds into W, the Add becomes
    the FusedGemm's residual (r read through the inverse Transpose), one Transpose is left at the end."""
    proto = _linear_then(
        [helper.make_node("Mul", ["t", "gamma"], ["s"]), helper.make_node("Add", ["s", "r"], ["y"])],
        [tensor_info("r", [N, C, H, W])],
        [init("gamma", _rand(C, 1, 1, seed=3))],
    )
    model, report = optimize_and_compare(proto, _feeds("h", "r"), PASSES)
    ops = _ops(model)
    assert ops == Counter({"tensorforge::FusedGemm": 1, "Transpose": 2}), ops
    (gemm,) = [n for n in model.graph if n.op_type == "FusedGemm"]
    assert gemm.inputs[3] is not None and gemm.inputs[3].producer().op_type == "Transpose"
    assert gemm.inputs[3].producer().attributes["perm"] == inverse(TO_NCHW) == [0, 2, 3, 1]
    assert model.graph.outputs[0].producer().op_type == "Transpose"
    assert any(e.rule == "distribute-channel-mul" for e in report.events if e.status == "fired")


def test_a_residual_that_is_itself_transposed_back_cancels():
    """Add(Transpose(y), Transpose(z)) with the same perm: the carried operand is z itself, no new Transpose."""
    proto = _linear_then(
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]),
            helper.make_node("Relu", ["xt"], ["xr"]),
            helper.make_node("Transpose", ["xr"], ["z"], perm=TO_NCHW),
            helper.make_node("Add", ["t", "z"], ["y"]),
        ],
        [tensor_info("x", [N, C, H, W])],
        [],
    )
    model, _ = optimize_and_compare(proto, _feeds("h", "x"), PASSES)
    (gemm,) = [n for n in model.graph if n.op_type == "FusedGemm"]
    assert gemm.inputs[3].producer().op_type == "Relu"  # the pair of Transposes cancelled
    assert _ops(model)["Transpose"] == 2  # x's own, and the one after the product


def test_constants_of_lower_rank_and_operand_order_are_carried_through_the_inverse_permutation():
    """Sub(c, Transpose(y)) and Div(·, c) with constants of rank 1 and 3: the order of operands is kept and each
    constant is broadcast to the output's rank, then permuted."""
    proto = _linear_then(
        [
            helper.make_node("Sub", ["c1", "t"], ["s"]),
            helper.make_node("Div", ["s", "c3"], ["y"]),
        ],
        [],
        [init("c1", _rand(W, seed=4)), init("c3", _rand(C, 1, W, seed=5) + 2.0)],
    )
    model, _ = optimize_and_compare(proto, _feeds("h"), (InferShapes(), HoistThroughTransposes(), Cleanup()))
    assert [n.op_type for n in model.graph][-1] == "Transpose"
    sub = next(n for n in model.graph if n.op_type == "Sub")
    assert sub.inputs[1].producer().op_type == "Add"  # the operand order kept: the constant first
    assert tuple(sub.inputs[0].const.shape) == (1, 1, W, 1)


def test_a_transpose_read_elsewhere_or_not_fed_by_a_layer_stays():
    """The Transpose's output also a graph output: hoisting would compute it twice. A Transpose of a graph
    input: nothing to absorb the op."""
    shared = _linear_then(
        [helper.make_node("Mul", ["t", "gamma"], ["y"])], [], [init("gamma", _rand(C, 1, 1))], outputs=("y", "t")
    )
    model, report = optimize_and_compare(shared, _feeds("h"), (InferShapes(), HoistThroughTransposes()))
    assert [n.op_type for n in model.graph] == ["MatMul", "Add", "Transpose", "Mul"]
    assert any("read elsewhere" in e.detail for e in report.events)

    plain = make_model(
        [
            helper.make_node("Transpose", ["h"], ["t"], perm=TO_NCHW),
            helper.make_node("Add", ["t", "c"], ["y"]),
        ],
        [tensor_info("h", [N, H, W, C])],
        [tensor_info("y", None)],
        initializers=[init("c", _rand(C, 1, 1))],
    )
    model, _ = optimize_and_compare(plain, _feeds("h"), (InferShapes(), HoistThroughTransposes()))
    assert [n.op_type for n in model.graph] == ["Transpose", "Add"]


def test_an_op_between_two_layers_outputs_stays_next_to_one_of_them():
    """Add(Transpose(MatMul₁), MatMul₂), both products read once: the Add is next to a layer already (MatMul₂,
    which absorbs it), so it is not hoisted; hoisted, it would be next to a layer on both sides and the rule
    would swap sides forever."""
    proto = _linear_then(
        [helper.make_node("MatMul", ["x", "w2"], ["q"]), helper.make_node("Add", ["t", "q"], ["y"])],
        [tensor_info("x", [N, C, H, W])],
        [init("w2", _rand(W, W, seed=6))],
    )
    model, report = optimize_and_compare(proto, _feeds("h", "x"), PASSES)
    assert not [e for e in report.events if e.rule == "hoist-through-transpose" and e.status == "fired"]
    assert any("a layer's output already" in e.detail for e in report.events)
    ops = _ops(model)
    assert ops == Counter({"tensorforge::FusedGemm": 2, "Transpose": 1}), ops
