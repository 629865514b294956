"""Scaled dot-product attention as one node.

    MatMul(Softmax(MatMul(Q, Kᵀ) · s + B, axis=-1), V)  =  tensorforge::Attention(Q, Kᵀ, V, B; scale = s)

where the scaling is a Div by a scalar constant c (s = 1/c) or a Mul by one (s = c) or absent (s = 1), and the
additive bias B (an attention mask) is optional. Kᵀ is the operand as the model has it, [..., D, Sk]: the
kernel reads it transposed (a view). The intermediate score and probability tensors, [..., Sq, Sk] each, are
never written to memory by a fused kernel. Run after softmax recognition, before pointwise fusion (which
would otherwise fuse the scale and the bias into a pointwise node first).

    Transpose(Attention(Q, Kᵀ, V, B), perm=[0, 2, 1, 3])  =  Attention(Q, Kᵀ, V, B; transposed=1)

A multi-head layer then merges the heads with a Reshape to [B, Sq, H·Dv], which is a view of the transposed
result where it would copy the transposed view of the plain one: the kernel writes each head's rows in place.
"""

from __future__ import annotations

from ..ir import Node, Value
from .base import PassContext, Rule, RulePass
from .patterns import (
    PatternMatch,
    _float_problem,
    _interior_problem,
    _producer,
    _replace_chain,
    _scalar,
    _tensorforge_producer,
    _users,
)


def _softmax_axis_is_last(node: Node) -> bool:
    axis = node.attributes.get("axis", -1)
    rank = node.inputs[0].rank
    return axis == -1 or (rank is not None and axis == rank - 1)


def _scores(value: Value | None) -> tuple[Node, Node | None, float] | None:
    """`MatMul(Q, Kᵀ)` behind `value`, through an optional Div or Mul by a scalar constant: the MatMul, the
    scaling node and the scale, or None."""
    for op_type in ("Div", "Mul"):
        scaling = _producer(value, op_type)
        if scaling is None:
            continue
        factor = _scalar(scaling.inputs[1])
        scores = _producer(scaling.inputs[0], "MatMul")
        if factor is None or factor == 0.0 or scores is None:
            return None
        return scores, scaling, 1.0 / factor if op_type == "Div" else factor
    scores = _producer(value, "MatMul")
    return None if scores is None else (scores, None, 1.0)


class AttentionPattern(Rule):
    """`MatMul(Softmax(MatMul(Q, Kᵀ) · s + B), V)` = `Attention(Q, Kᵀ, V, B; scale=s)` (see the module)."""

    name = "attention"
    op_types = ("Softmax", "tensorforge::Softmax")

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        if not _softmax_axis_is_last(node):
            return None
        readers = _users(node.outputs[0], "MatMul")
        if len(readers) != 1 or readers[0].inputs[0] is not node.outputs[0]:
            return None
        output = readers[0]
        chain: list[Node] = []
        value = node.inputs[0]
        bias: Value | None = None
        add = _producer(value, "Add")
        if add is not None:
            sides = [operand for operand in add.inputs if _scores(operand) is not None]
            if len(sides) != 1:
                return None
            value = sides[0]
            bias = add.inputs[1] if add.inputs[0] is value else add.inputs[0]
            chain.append(add)
        found = _scores(value)
        if found is None:
            return None
        scores, scaling, scale = found
        if scaling is not None:
            chain.append(scaling)
        q, kt = scores.inputs
        v = output.inputs[1]
        nodes = [scores, *reversed(chain), node, output]
        return PatternMatch(nodes, q, extra={"kt": kt, "v": v, "bias": bias, "scale": scale})

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        kt, v = match.extra["kt"], match.extra["v"]
        for operand in (match.x, kt, v):
            problem = _float_problem(operand)
            if problem:
                return problem
        ranks = {operand.rank for operand in (match.x, kt, v)}
        if None in ranks or min(ranks) < 2 or len(ranks) != 1:
            return f"Q, Kᵀ and V must have one known rank of at least 2, got {sorted(map(str, ranks))}"
        return _interior_problem(match)

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        extra = match.extra
        inputs = [match.x, extra["kt"], extra["v"], extra["bias"]]
        _replace_chain(ctx, match, "Attention", inputs, {"scale": float(extra["scale"])})
        with_bias = " with an additive mask" if extra["bias"] is not None else ""
        return f"{len(match.nodes)} nodes -> Attention{with_bias} (scale {extra['scale']:.6g})"


class TransposedAttention(Rule):
    """`Transpose(Attention(...), perm=[0, 2, 1, 3])` = `Attention(...; transposed=1)` (see the module)."""

    name = "transposed-attention"
    op_types = ("Transpose",)

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        attention = _tensorforge_producer(node.inputs[0], "Attention")
        if attention is None or list(node.attributes.get("perm", ())) != [0, 2, 1, 3]:
            return None
        return PatternMatch([attention, node], attention.inputs[0], extra={"attention": attention})

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        attention = match.extra["attention"]
        if attention.attributes.get("transposed", 0):
            return "the attention's result is transposed already"
        if attention.outputs[0].rank != 4:
            return f"a 4-D result, not {attention.outputs[0].rank}-D"
        return _interior_problem(match)

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        attention = match.extra["attention"]
        _replace_chain(ctx, match, "Attention", list(attention.inputs), {**attention.attributes, "transposed": 1})
        return "Attention + Transpose [0, 2, 1, 3] -> Attention (transposed)"


class RecognizeAttention(RulePass):
    """Recognize scaled dot-product attention, its result transposed too (see the module docstring)."""

    name = "recognize-attention"
    rules = (AttentionPattern, TransposedAttention)
