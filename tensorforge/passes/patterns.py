"""Pattern recognition: subgraphs that exporters decompose become single `tensorforge`-domain nodes.

Exporters write GELU, LayerNorm and softmax out as chains of primitive ops (torch's TorchScript exporter
does so for GELU before opset 20 and for LayerNorm before opset 17). Each rule finds one such chain, checks
that its intermediate values are used nowhere else and that its constants are what the formula needs, and
replaces the chain with the fused op of `ops/fused.py`, which computes the same function (more accurately:
in one piece, in float32 at least).

Matching is structural (which ops feed which); `check` then declines, with the reason, when an intermediate
is used elsewhere or is a graph output, a constant is not the expected value, or the reduction axes do not
fit the fused op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import DType, Node, Value
from ..ops.fused import DOMAIN
from .base import PassContext, Rule, RulePass
from .utils import add_initializer, attr, constant, is_graph_output, replace_node

_CONST_TOLERANCE = 1e-6
_FLOATS = frozenset({DType.FLOAT, DType.FLOAT16, DType.BFLOAT16, DType.DOUBLE})


@dataclass
class PatternMatch:
    """A matched chain: its nodes (the root, whose output the fused node takes over, last), the input `x`,
    the constants to verify as (value, expected, what it is), and what the fused node needs."""

    nodes: list[Node]
    x: Value
    constants: list[tuple[Value, float, str]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Node:
        return self.nodes[-1]


# -- shared queries -----------------------------------------------------------------------------------------


def _producer(value: Value | None, op_type: str) -> Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _tensorforge_producer(value: Value | None, op_type: str) -> Node | None:
    """The node of the tensorforge domain's `op_type` that produces `value`, or None."""
    node = value.producer() if value is not None else None
    return node if node is not None and (node.op_type, node.domain) == (op_type, DOMAIN) else None


def _users(value: Value, *op_types: str) -> list[Node]:
    found = [user for user, _ in value.uses() if user.op_type in op_types and user.domain in ("", "ai.onnx")]
    return list(dict.fromkeys(found))


def _other(node: Node, value: Value) -> Value | None:
    """The other operand of a binary node that reads `value` (None if it reads `value` twice or not at all)."""
    a, b = node.inputs[0], node.inputs[1]
    if a is value and b is not value:
        return b
    if b is value and a is not value:
        return a
    return None


def _is_const(value: Value | None) -> bool:
    return constant(value) is not None


def _scalar(value: Value) -> float | None:
    tensor = constant(value)
    if tensor is None or tensor.numel() != 1 or tensor.dtype.is_complex:
        return None
    return float(tensor.reshape(()).double())


def _close(found: float, expected: float, dtype: torch.dtype) -> bool:
    """Within 1e-6 of `expected`, or `expected` rounded to the constant's own type (fp16 constants)."""
    if abs(found - expected) <= _CONST_TOLERANCE * max(1.0, abs(expected)):
        return True
    return dtype.is_floating_point and found == float(torch.tensor(expected, dtype=dtype).double())


def _constants_problem(match: PatternMatch) -> str | None:
    for value, expected, what in match.constants:
        tensor = constant(value)
        if tensor is None:
            return f"{what} ({value.name!r}) is not a constant"
        if tensor.numel() != 1:
            return f"{what} ({value.name!r}) is not a single value"
        if match.x.rank is not None and tensor.dim() > match.x.rank:
            return f"{what} ({value.name!r}) has a higher rank than the input: it would broadcast"
        found = _scalar(value)
        if found is None or not _close(found, expected, tensor.dtype):
            return f"constant {what} is {found!r}, not the expected {expected:.9g}"
    return None


def _interior_problem(match: PatternMatch) -> str | None:
    """Why the intermediate values cannot disappear: one is a graph output or is read outside the chain."""
    inside = set(match.nodes)
    for node in match.nodes[:-1]:
        for value in node.outputs:
            if is_graph_output(value):
                return f"the intermediate {value.name!r} is a graph output"
            outside = [user for user, _ in value.uses() if user not in inside]
            if outside:
                return f"the intermediate {value.name!r} is used elsewhere (by {outside[0].label})"
    return None


def _float_problem(value: Value) -> str | None:
    if value.dtype not in _FLOATS:
        return f"{value.name!r} is {value.dtype}, not a floating-point type"
    return None


def reduce_axes(node: Node) -> tuple[int, ...] | str:
    """The axes a Reduce* node reduces (from the `axes` attribute before opset 18, or its second input),
    or why they are unknown. An empty tuple means every axis."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        tensor = constant(node.inputs[1])
        if tensor is None:
            return "the reduction axes are not constant"
        axes = tuple(int(a) for a in tensor.reshape(-1).tolist())
    else:
        axes = tuple(int(a) for a in attr(node, "axes", ()) or ())
    if not axes and attr(node, "noop_with_empty_axes", 0):
        return "the reduction is a no-op (empty axes)"
    return axes


def _normalized(axes: tuple[int, ...], rank: int | None) -> tuple[int, ...] | None:
    """Axes as negative indices (-1 is the last axis), or None when that needs an unknown rank."""
    if rank is None:
        return tuple(sorted(axes)) if all(a < 0 for a in axes) and axes else None
    if not axes:
        axes = tuple(range(rank))
    return tuple(sorted(a - rank if a >= 0 else a for a in axes))


def _replace_chain(ctx: PassContext, match: PatternMatch, op_type: str, inputs: list[Value | None], attrs) -> Node:
    """Put one `tensorforge::op_type` node where the chain was; its output takes over the root's."""
    old = match.root.outputs[0]
    fused = Node(
        op_type,
        inputs,
        [ctx.new_value(old.name, like=old)],
        attrs,
        domain=DOMAIN,
        name=ctx.fresh_name(op_type.lower()),
    )
    replace_node(match.root, fused)
    remaining = list(match.nodes[:-1])
    while remaining:
        dead = [n for n in remaining if not any(v.uses() for v in n.outputs)]
        if not dead:
            raise AssertionError("a matched chain still has users after its root was replaced")
        for node in dead:
            ctx.model.graph.remove(node)
            remaining.remove(node)
    return fused


def _product_tail(h: Value, x: Value) -> tuple[list[Node], list[tuple[Value, float, str]]] | None:
    """The nodes computing `0.5 · x · h` from `h`, in any association (also `x · h / 2`), and their constants."""
    for mul in _users(h, "Mul"):
        other = _other(mul, h)
        if other is None:
            continue
        t = mul.outputs[0]
        if other is x:  # (x · h) · 0.5  or  (x · h) / 2
            for last in _users(t, "Mul", "Div"):
                if last.op_type == "Mul" and _is_const(_other(last, t)):
                    return [mul, last], [(_other(last, t), 0.5, "the factor 0.5")]
                if last.op_type == "Div" and last.inputs[0] is t and _is_const(last.inputs[1]):
                    return [mul, last], [(last.inputs[1], 2.0, "the divisor 2")]
        elif _is_const(other):  # (h · 0.5) · x
            for last in _users(t, "Mul"):
                if _other(last, t) is x:
                    return [mul, last], [(other, 0.5, "the factor 0.5")]
        else:  # (x · 0.5) · h  or  (x / 2) · h
            half = other.producer()
            if half is None or half.domain not in ("", "ai.onnx"):
                continue
            if half.op_type == "Mul" and _is_const(_other(half, x)):
                return [half, mul], [(_other(half, x), 0.5, "the factor 0.5")]
            if half.op_type == "Div" and half.inputs[0] is x and _is_const(half.inputs[1]):
                return [half, mul], [(half.inputs[1], 2.0, "the divisor 2")]
    return None


def _one_plus(value: Value) -> tuple[Node, Value] | None:
    """The node computing `1 + value` (either order) and its constant operand."""
    for add in _users(value, "Add"):
        one = _other(add, value)
        if _is_const(one):
            return add, one
    return None


# -- GELU --------------------------------------------------------------------------------------------------


class ErfGelu(Rule):
    """`0.5 · x · (1 + erf(x / √2)) = Gelu(x)`.

    Also `erf(x · 1/√2)`, any order of the product and of the Add, and `x · (1 + erf(…)) / 2`.
    """

    name = "gelu-erf"
    op_types = ("Erf",)

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        scale = node.inputs[0].producer()
        if scale is None or scale.op_type not in ("Div", "Mul") or scale.domain not in ("", "ai.onnx"):
            return None
        if scale.op_type == "Div":
            x, c = scale.inputs
            expected, what = math.sqrt(2.0), "√2"
        else:
            x, c = scale.inputs if _is_const(scale.inputs[1]) else scale.inputs[::-1]
            expected, what = 1 / math.sqrt(2.0), "1/√2"
        if not _is_const(c) or _is_const(x):
            return None
        plus = _one_plus(node.outputs[0])
        if plus is None:
            return None
        tail = _product_tail(plus[0].outputs[0], x)
        if tail is None:
            return None
        nodes, tail_constants = tail
        constants = [(c, expected, what), (plus[1], 1.0, "the 1 in 1 + erf"), *tail_constants]
        chain = [scale, node, plus[0]] + [n for n in nodes if n not in (scale, node, plus[0])]
        return PatternMatch(_in_order(chain), x, constants)

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        return _float_problem(match.x) or _constants_problem(match) or _interior_problem(match)

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        _replace_chain(ctx, match, "Gelu", [match.x], {"approximate": "none"})
        return f"{len(match.nodes)} nodes -> Gelu"


class TanhGelu(Rule):
    """`0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))) = Gelu(x, approximate="tanh")`.

    `x³` may be `Pow(x, 3)`, `x · (x · x)` or `(x · x) · x`; sums and products in any order.
    """

    name = "gelu-tanh"
    op_types = ("Tanh",)

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        scale = _producer(node.inputs[0], "Mul")
        if scale is None:
            return None
        k, inner = scale.inputs if _is_const(scale.inputs[0]) else scale.inputs[::-1]
        add = _producer(inner, "Add")
        if not _is_const(k) or add is None:
            return None
        for x, term in (add.inputs, add.inputs[::-1]):
            cubic = _producer(term, "Mul")
            if cubic is None:
                continue
            c, cube = cubic.inputs if _is_const(cubic.inputs[0]) else cubic.inputs[::-1]
            cube_nodes = _cube_of(cube, x)
            if not _is_const(c) or cube_nodes is None:
                continue
            constants = [(k, math.sqrt(2 / math.pi), "√(2/π)"), (c, 0.044715, "0.044715")]
            if cube_nodes[0].op_type == "Pow":
                constants.append((cube_nodes[0].inputs[1], 3.0, "the exponent 3"))
            plus = _one_plus(node.outputs[0])
            if plus is None:
                return None
            tail = _product_tail(plus[0].outputs[0], x)
            if tail is None:
                return None
            constants += [(plus[1], 1.0, "the 1 in 1 + tanh")] + tail[1]
            chain = [*cube_nodes, cubic, add, scale, node, plus[0], *tail[0]]
            return PatternMatch(_in_order(list(dict.fromkeys(chain))), x, constants)
        return None

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        return _float_problem(match.x) or _constants_problem(match) or _interior_problem(match)

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        _replace_chain(ctx, match, "Gelu", [match.x], {"approximate": "tanh"})
        return f"{len(match.nodes)} nodes -> Gelu(approximate=tanh)"


def _cube_of(value: Value, x: Value) -> list[Node] | None:
    """The nodes computing `x³` as `value`: [Pow] or [x·x, x·(x·x)]."""
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Pow" and node.inputs[0] is x and _is_const(node.inputs[1]):
        return [node]
    if node.op_type == "Mul" and x in node.inputs:
        square = _producer(_other(node, x), "Mul")
        if square is not None and square.inputs[0] is x and square.inputs[1] is x:
            return [square, node]
    return None


def _in_order(nodes: list[Node]) -> list[Node]:
    """`nodes` with producers before users (the chains here are small)."""
    inside = set(nodes)
    ordered: list[Node] = []
    pending = list(nodes)
    while pending:
        for node in pending:
            deps = {v.producer() for v in node.inputs if v is not None} & inside
            if deps <= set(ordered):
                ordered.append(node)
                pending.remove(node)
                break
        else:
            raise AssertionError("a matched chain has a cycle")
    return ordered


# -- LayerNorm ----------------------------------------------------------------------------------------------


class LayerNormPattern(Rule):
    """`(x − mean(x)) / √(mean((x − mean(x))²) + ε) · γ + β = LayerNormalization(x, γ, β, axis, ε)`.

    The means reduce the trailing axes `axis..rank-1` with keepdims; the square is `Pow(d, 2)` or `d · d`;
    the division may be a multiplication by `Reciprocal(√…)`; γ and β are optional (γ = 1 then). γ and β
    must only vary along the normalized axes.
    """

    name = "layernorm"
    op_types = ("Sub",)

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        x, mean_value = node.inputs
        mean = _producer(mean_value, "ReduceMean")
        if mean is None or mean.inputs[0] is not x:
            return None
        d = node.outputs[0]
        square = next((u for u in _users(d, "Pow", "Mul") if _is_square(u, d)), None)
        if square is None:
            return None
        var = next(iter(_users(square.outputs[0], "ReduceMean")), None)
        add = next(iter(_users(var.outputs[0], "Add")), None) if var is not None else None
        if add is None or not _is_const(_other(add, var.outputs[0])):
            return None
        sqrt = next(iter(_users(add.outputs[0], "Sqrt")), None)
        if sqrt is None:
            return None
        chain = [mean, node, square, var, add, sqrt]
        divide = _divided_by(d, sqrt.outputs[0])
        if divide is None:
            return None
        chain += divide
        eps = _other(add, var.outputs[0])
        constants = [(square.inputs[1], 2.0, "the exponent 2")] if square.op_type == "Pow" else []
        extra: dict[str, Any] = {"eps": eps, "reductions": (mean, var), "scale": None, "bias": None}
        result = chain[-1].outputs[0]
        follow = _single_reader(result, "Mul")
        if follow is not None and _affine_fits(_other(follow, result), x, set(chain)):
            extra["scale"] = _other(follow, result)
            chain.append(follow)
            result = follow.outputs[0]
        follow = _single_reader(result, "Add")
        if follow is not None and _affine_fits(_other(follow, result), x, set(chain)):
            extra["bias"] = _other(follow, result)
            chain.append(follow)
        return PatternMatch(chain, x, constants, extra)

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        problem = _float_problem(match.x) or _constants_problem(match) or _interior_problem(match)
        if problem:
            return problem
        epsilon = _scalar(match.extra["eps"])
        if epsilon is None or not epsilon > 0 or constant(match.extra["eps"]).dim() > (match.x.rank or 1):
            return "ε is not one positive constant"
        axis = _layernorm_axis(match)
        if isinstance(axis, str):
            return axis
        if match.extra["scale"] is None and _normalized_shape(match.x, axis) is None:
            return "there is no γ and the normalized shape is not static (γ = 1 needs it)"
        return None

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        x = match.x
        axis = _layernorm_axis(match)
        scale = match.extra["scale"]
        if scale is None:
            ones = torch.ones(_normalized_shape(x, axis), dtype=x.dtype.torch)
            scale = add_initializer(ctx.model.graph, ctx.new_value("layernorm_scale"), ones)
        attrs = {
            "axis": axis,
            "epsilon": _scalar(match.extra["eps"]),
            "stash_type": int(DType.DOUBLE if x.dtype == DType.DOUBLE else DType.FLOAT),
        }
        _replace_chain(ctx, match, "LayerNormalization", [x, scale, match.extra["bias"]], attrs)
        affine = [name for name in ("scale", "bias") if match.extra[name] is not None]
        with_ = " and ".join(affine) or "no affine"
        return f"{len(match.nodes)} nodes -> LayerNormalization(axis={axis}, with {with_})"


def _is_square(node: Node, d: Value) -> bool:
    if node.op_type == "Pow":
        return node.inputs[0] is d and _is_const(node.inputs[1])
    return node.inputs[0] is d and node.inputs[1] is d


def _divided_by(d: Value, s: Value) -> list[Node] | None:
    """[Div(d, s)] or [Reciprocal(s), Mul(d, ·)]."""
    for div in _users(s, "Div"):
        if div.inputs[0] is d and div.inputs[1] is s:
            return [div]
    for rec in _users(s, "Reciprocal"):
        for mul in _users(rec.outputs[0], "Mul"):
            if _other(mul, rec.outputs[0]) is d:
                return [rec, mul]
    return None


def _single_reader(value: Value, op_type: str) -> Node | None:
    users = value.uses()
    if len(users) != 1 or is_graph_output(value):
        return None
    node = users[0][0]
    return node if node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _affine_fits(value: Value | None, x: Value, chain: set[Node]) -> bool:
    """Whether `value` can be LayerNormalization's γ or β: not computed by the chain, same type as x,
    and, aligned to the right, varying only along the trailing axes without growing the result."""
    if value is None or value.producer() in chain or value.dtype != x.dtype or value.shape is None:
        return False
    shape = list(value.shape)
    if x.rank is not None and len(shape) > x.rank:
        return False
    while shape and shape[0] == 1:
        shape.pop(0)
    if x.shape is not None:
        return all(dim == 1 or dim == x.shape[len(x.shape) - len(shape) + i] for i, dim in enumerate(shape))
    return all(isinstance(dim, int) for dim in shape)


def _layernorm_axis(match: PatternMatch) -> int | str:
    """LayerNormalization's `axis`, or why the reductions do not fit it."""
    x = match.x
    found = []
    for node in match.extra["reductions"]:
        if not attr(node, "keepdims", 1):
            return "a mean does not keep the reduced axes"
        axes = reduce_axes(node)
        if isinstance(axes, str):
            return axes
        normalized = _normalized(axes, x.rank)
        if normalized is None:
            return "the reduction axes need the input's rank, which is unknown"
        found.append(normalized)
    mean_axes, var_axes = found
    if mean_axes != var_axes:
        return f"the mean and variance reduce different axes ({list(mean_axes)} and {list(var_axes)})"
    if list(mean_axes) != list(range(-len(mean_axes), 0)):
        return f"the reduction axes {list(mean_axes)} are not the trailing axes"
    k = len(mean_axes)
    for key in ("scale", "bias"):
        value = match.extra[key]
        if value is not None and len(_stripped(value.shape)) > k:
            return f"{'γ' if key == 'scale' else 'β'} varies along an axis that is not normalized"
    return -k if x.rank is None else x.rank - k


def _stripped(shape) -> list:
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return dims


def _normalized_shape(x: Value, axis: int) -> tuple[int, ...] | None:
    if x.shape is None:
        return None
    dims = x.shape[axis:]
    return tuple(dims) if all(isinstance(d, int) for d in dims) else None


# -- Softmax ------------------------------------------------------------------------------------------------


class SoftmaxPattern(Rule):
    """`exp(x − max(x)) / Σ exp(x − max(x)) = Softmax(x, axis)`, max and sum over one axis with keepdims.

    The division may be a multiplication by `Reciprocal(Σ …)`. The max-subtracted form only: without it the
    chain overflows where Softmax does not, so the results would differ.
    """

    name = "softmax"
    op_types = ("Sub",)

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        x, top_value = node.inputs
        top = _producer(top_value, "ReduceMax")
        if top is None or top.inputs[0] is not x:
            return None
        exp = next(iter(_users(node.outputs[0], "Exp")), None)
        if exp is None:
            return None
        e = exp.outputs[0]
        total = next(iter(_users(e, "ReduceSum")), None)
        if total is None:
            return None
        divide = _divided_by(e, total.outputs[0])
        if divide is None:
            return None
        return PatternMatch([top, node, exp, total, *divide], x, extra={"reductions": (top, total)})

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        problem = _float_problem(match.x) or _interior_problem(match)
        axis = _softmax_axis(match)
        return problem or (axis if isinstance(axis, str) else None)

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        axis = _softmax_axis(match)
        _replace_chain(ctx, match, "Softmax", [match.x], {"axis": axis})
        return f"{len(match.nodes)} nodes -> Softmax(axis={axis})"


def _softmax_axis(match: PatternMatch) -> int | str:
    found = []
    for node in match.extra["reductions"]:
        if not attr(node, "keepdims", 1):
            return f"{node.op_type} does not keep the reduced axis"
        axes = reduce_axes(node)
        if isinstance(axes, str):
            return axes
        normalized = _normalized(axes, match.x.rank)
        if normalized is None:
            return "the reduction axes need the input's rank, which is unknown"
        if len(normalized) != 1:
            return f"{node.op_type} reduces {len(normalized)} axes, Softmax normalizes one"
        found.append(normalized[0])
    if found[0] != found[1]:
        return f"the max and the sum reduce different axes ({found[0]} and {found[1]})"
    return found[0]


class RecognizePatterns(RulePass):
    """Recognize decomposed GELU (erf and tanh forms), LayerNorm and softmax. Run it before pointwise
    fusion, which would otherwise fuse the chains' elementwise parts first."""

    name = "recognize-patterns"
    rules = (ErfGelu, TanhGelu, LayerNormPattern, SoftmaxPattern)
