"""Pointwise operations hoisted above a Transpose, next to the layer whose output they transform.

    B(Transpose(y, p), o) = Transpose(B(y, o′), p)        o′ = o carried back through p⁻¹

for a binary pointwise B (Add, Sub, Mul, Div; operand order kept). A constant `o` is broadcast to the output's
rank and permuted by p⁻¹ at build time; a value of the output's exact shape is read through `Transpose(o, p⁻¹)`,
a view at run time, which cancels against a Transpose that produced `o` (`cleanup.CancelTransposes`).

Why: ConvNeXt's block ends `Linear → Transpose (back to NCHW) → Mul γ → Add x`. Hoisted, the layer-scale Mul
folds into the Linear's weights (`fold_bn`, after `DistributeChannelMul`) and the residual Add fuses into its
epilogue, instead of a separate pass over memory each. The rule fires only when `y` comes from a layer (MatMul,
Gemm, Conv or their fused forms), directly or through single-use pointwise ops with a constant operand, so the
hoisted op always lands next to something that can absorb it, and not when its other operand is such a layer's
output already (then it can be absorbed where it is, and hoisting would only trade sides, back and forth).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir import Graph, Node, Value, qualified_op
from ..ops.fused import DOMAIN
from .base import PassContext, Rule, RulePass
from .cleanup import is_graph_input, transpose_perm
from .utils import add_initializer, constant, is_graph_output, replace_node

POINTWISE = ("Add", "Sub", "Mul", "Div")
_LAYERS = {"MatMul", "Gemm", "Conv", f"{DOMAIN}::FusedGemm", f"{DOMAIN}::FusedConv"}


@dataclass
class _Hoist:
    node: Node
    transpose: Node
    side: int  # which input of `node` the Transpose feeds
    perm: list[int]
    other: Value
    other_const: torch.Tensor | None


def _initializer(value: Value) -> torch.Tensor | None:
    tensor = constant(value)
    return None if tensor is None or is_graph_input(value) else tensor


def from_layer(value: Value) -> bool:
    """Whether `value` is read only once and is a layer's output, directly or through pointwise ops with a constant
    operand (a bias Add, a scale Mul) whose outputs are each read once: what an op hoisted next to it can be
    absorbed into. (The single use also keeps the rule from hoisting an op back: a carried operand's Transpose
    reads a value that its other reader needs too.)"""
    while True:
        producer = value.producer()
        if producer is None or len(value.uses()) != 1 or is_graph_output(value):
            return False
        if qualified_op(producer) in _LAYERS:
            return True
        if qualified_op(producer) not in POINTWISE:
            return False
        a, b = producer.inputs[:2]
        if _initializer(b) is not None:
            value = a
        elif _initializer(a) is not None:
            value = b
        else:
            return False


def inverse(perm: list[int]) -> list[int]:
    """q with q[p[i]] = i: Transpose(Transpose(x, p), q) = x."""
    result = [0] * len(perm)
    for index, axis in enumerate(perm):
        result[axis] = index
    return result


class HoistThroughTranspose(Rule):
    """`B(Transpose(y, p), o)` = `Transpose(B(y, o′), p)` (module docstring)."""

    name = "hoist-through-transpose"
    op_types = POINTWISE

    def match(self, node: Node, ctx: PassContext) -> _Hoist | None:
        if qualified_op(node) not in POINTWISE or len(node.inputs) != 2 or None in node.inputs:
            return None
        for side in (0, 1):
            transpose = node.inputs[side].producer()
            if transpose is None or qualified_op(transpose) != "Transpose":
                continue
            perm = transpose_perm(transpose)
            other = node.inputs[1 - side]
            if perm is None or not from_layer(transpose.inputs[0]):
                continue
            return _Hoist(node, transpose, side, perm, other, _initializer(other))
        return None

    def check(self, match: _Hoist, ctx: PassContext) -> str | None:
        between = match.transpose.outputs[0]
        if is_graph_output(between) or len(between.uses()) != 1:
            return "the Transpose's output is read elsewhere (hoisting would compute it twice)"
        out = match.node.outputs[0]
        if out.shape is None or len(out.shape) != len(match.perm):
            return "the output's rank is unknown or differs from the Transpose's"
        if match.other_const is not None:
            if match.other_const.dim() > len(match.perm):
                return f"the constant of shape {list(match.other_const.shape)} has a higher rank than the output"
            return None
        if match.other.shape is None or tuple(match.other.shape) != tuple(out.shape):
            return "the other operand is broadcast (only a constant or a tensor of the output's shape is carried)"
        if match.other.dtype != out.dtype:
            return "the other operand's type differs from the output's"
        if from_layer(match.other):
            # Already next to a layer that can absorb it; hoisting would only trade sides (and back again).
            return "the other operand is a layer's output already"
        return None

    def rewrite(self, match: _Hoist, ctx: PassContext) -> str:
        graph: Graph = ctx.model.graph
        node, transpose, back = match.node, match.transpose, inverse(match.perm)
        source = transpose.inputs[0]
        if match.other_const is not None:
            tensor = match.other_const
            tensor = tensor.reshape([1] * (len(back) - tensor.dim()) + list(tensor.shape)).permute(back)
            carried = add_initializer(graph, ctx.new_value(match.other.name), tensor.contiguous())
        else:
            carried = ctx.new_value(match.other.name, like=source)
            graph.append(Node("Transpose", [match.other], [carried], {"perm": back}))
        inputs = [source, carried] if match.side == 0 else [carried, source]
        hoisted = ctx.new_value(node.outputs[0].name, like=source)
        graph.append(Node(node.op_type, inputs, [hoisted], dict(node.attributes), name=node.name))
        out = node.outputs[0]
        final = Node("Transpose", [hoisted], [ctx.new_value(out.name, like=out)], {"perm": match.perm})
        replace_node(node, final)  # the users (and a graph output's name) move to the Transpose now last
        graph.remove(transpose)
        return f"hoisted {node.op_type} {node.name or out.name!r} above a Transpose"


class HoistThroughTransposes(RulePass):
    """Moves pointwise ops that follow a layer's transposed output above the Transpose."""

    name = "hoist-through-transposes"
    rules = (HoistThroughTranspose,)
