"""Cleanup rules: remove nodes that do nothing, and merge layout chains that compose.

No-op rules remove a node whose output equals one of its inputs (Identity, inference Dropout, a Reshape to
the same shape, an identity Transpose, ...); their users read the input instead. They decline when that
would make a graph output alias a graph input or initializer. The merge rules fold a pair of Transposes
or Reshapes into one; they decline when the intermediate is a graph output or read by another node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..ir import DType, Node, Value
from ..ops.helpers import to_ints
from .base import PassContext, Rule, RulePass
from .utils import add_initializer, attr, bypass, constant, is_graph_output, rewire_problem

# An end at least this large covers a dim of any size (exporters write INT64_MAX for `x[a:]`).
_OPEN_END = 2**62


def dropout_training_reason(node: Node, opset: int) -> str | None:
    """Why a Dropout node may drop elements (training mode), or None when it is the identity."""
    if opset < 7:
        return None if attr(node, "is_test", 0) else "Dropout is in training mode (is_test=0)"
    if opset < 12 or len(node.inputs) < 3 or node.inputs[2] is None:
        return None
    mode = constant(node.inputs[2])
    if mode is None or is_graph_input(node.inputs[2]):
        return "training_mode is not a constant"
    if bool(mode.reshape(-1)[0]):
        return "training_mode is true"
    return None


def is_graph_input(value: Value) -> bool:
    """Whether `value` is a graph input of the graph its users live in (a feed can override it)."""
    return any(value in user.graph.inputs for user, _ in value.uses() if user.graph is not None)


def _onnx(node: Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _input_ints(node: Node, index: int) -> list[int] | None:
    """The ints of constant input `index`, [] when the input is absent, None when it is not a constant."""
    if index >= len(node.inputs) or node.inputs[index] is None:
        return []
    value = node.inputs[index]
    tensor = constant(value)
    if tensor is None or is_graph_input(value):
        return None
    return to_ints(tensor)


def _remove_if_unused(node: Node) -> None:
    if node.graph is not None and not any(v.uses() or is_graph_output(v) for v in node.outputs):
        node.graph.remove(node)


# -- no-op removal ---------------------------------------------------------------------------------------


@dataclass
class _NoOp:
    node: Node
    source: Value


class _NoOpRule(Rule):
    """Base of the rules that remove a node whose first output equals `source`: y = x."""

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        """The input the node's output equals, or None when the node is not a no-op."""
        raise NotImplementedError

    def match(self, node: Node, ctx: PassContext) -> _NoOp | None:
        if not _onnx(node) or not node.inputs or node.inputs[0] is None:
            return None
        source = self.source(node, ctx)
        return None if source is None else _NoOp(node, source)

    def check(self, match: _NoOp, ctx: PassContext) -> str | None:
        return rewire_problem(match.node.outputs[0], match.source)

    def rewrite(self, match: _NoOp, ctx: PassContext) -> str:
        bypass(match.node, match.node.outputs[0], match.source)
        return f"removed {match.node.op_type}"


class RemoveIdentity(_NoOpRule):
    """Identity(x) = x."""

    name = "remove-identity"
    op_types = ("Identity",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        return node.inputs[0]


class RemoveDropout(_NoOpRule):
    """Dropout(x) = x in inference (opset ≥ 7, or is_test=1 before; no training_mode=true input)."""

    name = "remove-dropout"
    op_types = ("Dropout",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        return node.inputs[0]

    def check(self, match: _NoOp, ctx: PassContext) -> str | None:
        node = match.node
        reason = dropout_training_reason(node, ctx.opset(node.domain))
        if reason is not None:
            return reason
        if len(node.outputs) > 1 and (node.outputs[1].uses() or is_graph_output(node.outputs[1])):
            return "its mask output is used"
        return super().check(match, ctx)


class RemoveNoOpReshape(_NoOpRule):
    """Reshape(x, s) = x when s resolves to the shape of x (0 copies a dim, one -1 takes the rest)."""

    name = "remove-noop-reshape"
    op_types = ("Reshape",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        if ctx.opset(node.domain) < 5:
            target = attr(node, "shape")
        else:
            target = _input_ints(node, 1)
        if target is None:
            return None
        allowzero = bool(attr(node, "allowzero", 0))
        return node.inputs[0] if reshape_is_noop(node.inputs[0].shape, target, allowzero) else None


def reshape_is_noop(shape: Sequence[Any] | None, target: Sequence[int], allowzero: bool) -> bool:
    """Whether reshaping a tensor of `shape` (dims may be symbolic) to `target` leaves its shape unchanged."""
    if shape is None or len(target) != len(shape) or list(target).count(-1) > 1:
        return False
    for dim, want in zip(shape, target, strict=True):
        if want == -1 or (want == 0 and not allowzero):
            continue
        if not (isinstance(dim, int) and dim == want):
            return False
    # The -1 takes the elements the other dims leave: dim i of x, unless another dim is 0 (then it is ambiguous).
    return -1 not in target or all(d != 0 for d in shape)


class RemoveNoOpTranspose(_NoOpRule):
    """Transpose(x, perm) = x when perm = (0, 1, …, r−1)."""

    name = "remove-noop-transpose"
    op_types = ("Transpose",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        perm = transpose_perm(node)
        return node.inputs[0] if perm is not None and perm == list(range(len(perm))) else None


def transpose_perm(node: Node) -> list[int] | None:
    """The permutation of a Transpose node (the reversal when it has none); None when the rank is unknown."""
    perm = attr(node, "perm")
    if perm is not None:
        return list(perm)
    rank = node.inputs[0].rank
    return None if rank is None else list(range(rank - 1, -1, -1))


class RemoveNoOpCast(_NoOpRule):
    """Cast(x, to=T) = x and CastLike(x, y) = x when x already has the element type T (of y)."""

    name = "remove-noop-cast"
    op_types = ("Cast", "CastLike")

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        if node.op_type == "CastLike":
            target = node.inputs[1].dtype if len(node.inputs) > 1 and node.inputs[1] is not None else None
        else:
            to = attr(node, "to")
            target = DType[to.upper()] if isinstance(to, str) else DType(to)
        dtype = node.inputs[0].dtype
        same = target is not None and dtype != DType.UNDEFINED and dtype == target
        return node.inputs[0] if same else None


class RemoveNoOpPad(_NoOpRule):
    """Pad(x, pads = 0) = x, in every mode."""

    name = "remove-noop-pad"
    op_types = ("Pad",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        if ctx.opset(node.domain) < 11:
            pads = attr(node, "pads", attr(node, "paddings"))
        else:
            pads = _input_ints(node, 1)
        return node.inputs[0] if pads is not None and not any(pads) else None


class RemoveNoOpSlice(_NoOpRule):
    """Slice(x, starts, ends, axes, steps) = x when each sliced axis is covered whole with step 1."""

    name = "remove-noop-slice"
    op_types = ("Slice",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        if ctx.opset(node.domain) < 10:
            starts, ends, axes, steps = attr(node, "starts"), attr(node, "ends"), attr(node, "axes"), None
        else:
            starts, ends, axes, steps = (_input_ints(node, i) for i in (1, 2, 3, 4))
        shape = node.inputs[0].shape
        if shape is None or starts is None or ends is None or axes is None or steps is None:
            return None
        axes = axes or list(range(len(starts)))
        steps = steps or [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            return None
        rank = len(shape)
        if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
            return None
        for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
            if step != 1 or not _covers(shape[axis % rank], start, end):
                return None
        return node.inputs[0]


def _covers(dim: Any, start: int, end: int) -> bool:
    """Whether [start, end) with step 1, clamped as Slice does, covers an axis of size `dim`."""
    if isinstance(dim, int):
        start += dim if start < 0 else 0
        end += dim if end < 0 else 0
        return max(start, 0) == 0 and min(end, dim) >= dim
    return (start == 0 or start <= -_OPEN_END) and end >= _OPEN_END


class RemoveNoOpSqueeze(_NoOpRule):
    """Squeeze(x) = x when no axes are given and x has no dim of size 1 (every dim static)."""

    name = "remove-noop-squeeze"
    op_types = ("Squeeze",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        if ctx.opset(node.domain) < 13:
            has_axes = attr(node, "axes") is not None
        else:
            has_axes = len(node.inputs) > 1 and node.inputs[1] is not None
        shape = node.inputs[0].shape
        if has_axes or shape is None or not all(isinstance(d, int) and d != 1 for d in shape):
            return None
        return node.inputs[0]


class RemoveNoOpUnsqueeze(_NoOpRule):
    """Unsqueeze(x, axes = []) = x."""

    name = "remove-noop-unsqueeze"
    op_types = ("Unsqueeze",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        axes = attr(node, "axes") if ctx.opset(node.domain) < 13 else _input_ints(node, 1)
        if axes is None or len(axes) or (ctx.opset(node.domain) >= 13 and len(node.inputs) < 2):
            return None
        return node.inputs[0]


class RemoveNoOpExpand(_NoOpRule):
    """Expand(x, s) = x when broadcasting shape(x) with s gives shape(x): s is not longer than the rank and
    each of its entries is 1 or the (static) dim it lines up with."""

    name = "remove-noop-expand"
    op_types = ("Expand",)

    def source(self, node: Node, ctx: PassContext) -> Value | None:
        target = _input_ints(node, 1)
        shape = node.inputs[0].shape
        if target is None or shape is None or len(target) > len(shape):
            return None
        aligned = list(shape)[len(shape) - len(target) :]
        if all(want == 1 or (isinstance(dim, int) and dim == want) for dim, want in zip(aligned, target, strict=True)):
            return node.inputs[0]
        return None


# -- pairs -----------------------------------------------------------------------------------------------


@dataclass
class _Pair:
    outer: Node
    inner: Node
    data: Any = None  # what the rewrite needs (composed perm, new shape)


def _inner(node: Node, op_type: str) -> Node | None:
    value = node.inputs[0] if node.inputs else None
    inner = value.producer() if value is not None else None
    if inner is None or inner.op_type != op_type or not _onnx(inner) or inner.graph is not node.graph:
        return None
    return inner


def _intermediate_reason(inner: Node) -> str | None:
    value = inner.outputs[0]
    if is_graph_output(value):
        return f"the intermediate {value.name!r} is a graph output"
    if len(value.uses()) > 1:
        return f"the intermediate {value.name!r} is used by another node"
    return None


def _compose(first: list[int], second: list[int]) -> list[int] | None:
    """The perm of Transpose(Transpose(x, first), second): q[i] = first[second[i]]."""
    if len(first) != len(second):
        return None
    return [first[i] for i in second]


def _transpose_pair(node: Node) -> _Pair | None:
    """Transpose(Transpose(x)) with the composed permutation, when both permutations are known."""
    inner = _inner(node, "Transpose") if _onnx(node) else None
    if inner is None:
        return None
    first, second = transpose_perm(inner), transpose_perm(node)
    composed = None if first is None or second is None else _compose(first, second)
    return None if composed is None else _Pair(node, inner, composed)


class CancelTransposes(Rule):
    """Transpose(Transpose(x, p), q) = x when p∘q is the identity (q[i] indexes p: p[q[i]] = i).

    The inner Transpose stays for its other users, if any: this never duplicates work."""

    name = "cancel-transposes"
    op_types = ("Transpose",)

    def match(self, node: Node, ctx: PassContext) -> _Pair | None:
        pair = _transpose_pair(node)
        return pair if pair is not None and pair.data == list(range(len(pair.data))) else None

    def check(self, match: _Pair, ctx: PassContext) -> str | None:
        return rewire_problem(match.outer.outputs[0], match.inner.inputs[0])

    def rewrite(self, match: _Pair, ctx: PassContext) -> str:
        bypass(match.outer, match.outer.outputs[0], match.inner.inputs[0])
        _remove_if_unused(match.inner)
        return "removed a cancelling Transpose pair"


class MergeTransposes(Rule):
    """Transpose(Transpose(x, p), q) = Transpose(x, r) with r[i] = p[q[i]]."""

    name = "merge-transposes"
    op_types = ("Transpose",)

    def match(self, node: Node, ctx: PassContext) -> _Pair | None:
        pair = _transpose_pair(node)
        if pair is None or pair.data == list(range(len(pair.data))):
            return None  # an identity is for cancel-transposes
        return pair

    def check(self, match: _Pair, ctx: PassContext) -> str | None:
        return _intermediate_reason(match.inner)

    def rewrite(self, match: _Pair, ctx: PassContext) -> str:
        match.outer.set_input(0, match.inner.inputs[0])
        match.outer.attributes["perm"] = match.data
        _remove_if_unused(match.inner)
        return f"merged two Transposes into perm {match.data}"


class MergeReshapes(Rule):
    """Reshape(Reshape(x, s₁), s₂) = Reshape(x, s₂′), where s₂′ is s₂ with each 0 ("copy dim i") replaced by
    the static dim i of the intermediate (x has the same elements; a -1 is inferred the same way)."""

    name = "merge-reshapes"
    op_types = ("Reshape",)

    def match(self, node: Node, ctx: PassContext) -> _Pair | None:
        if not _onnx(node) or ctx.opset(node.domain) < 5 or len(node.inputs) < 2:
            return None
        inner = _inner(node, "Reshape")
        return None if inner is None else _Pair(node, inner)

    def check(self, match: _Pair, ctx: PassContext) -> str | None:
        reason = _intermediate_reason(match.inner)
        if reason is not None:
            return reason
        target = _input_ints(match.outer, 1)
        if target is None:
            return "the outer target shape is not a constant"
        if attr(match.outer, "allowzero", 0):
            match.data = None
            return None
        middle = match.inner.outputs[0].shape
        resolved = []
        for index, want in enumerate(target):
            if want != 0:
                resolved.append(want)
                continue
            dim = middle[index] if middle is not None and index < len(middle) else None
            if not isinstance(dim, int):
                return f"target entry {index} is 0 (copy the intermediate dim), which is not static"
            resolved.append(dim)
        match.data = None if resolved == target else resolved
        return None

    def rewrite(self, match: _Pair, ctx: PassContext) -> str:
        outer, inner = match.outer, match.inner
        outer.set_input(0, inner.inputs[0])
        if match.data is not None:
            shape = ctx.new_value(outer.inputs[1].name, like=outer.inputs[1])
            add_initializer(ctx.model.graph, shape, torch.tensor(match.data, dtype=torch.int64))
            outer.set_input(1, shape)
        _remove_if_unused(inner)
        return "merged two Reshapes" + (f" (target {match.data})" if match.data is not None else "")


class Cleanup(RulePass):
    """Removes no-op nodes and merges composing Transpose and Reshape pairs."""

    name = "cleanup"
    rules: ClassVar = (
        RemoveIdentity,
        RemoveDropout,
        RemoveNoOpReshape,
        RemoveNoOpTranspose,
        RemoveNoOpCast,
        RemoveNoOpPad,
        RemoveNoOpSlice,
        RemoveNoOpSqueeze,
        RemoveNoOpUnsqueeze,
        RemoveNoOpExpand,
        CancelTransposes,
        MergeTransposes,
        MergeReshapes,
    )
