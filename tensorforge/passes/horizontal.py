"""Horizontal merging: parallel layers that read the same input become one wider layer and a Split.

Sibling convolutions on one input (the 1×1 branches of an Inception block) or sibling projections of one
activation (attention's Q, K and V) each read the input once and launch one small kernel. With the weights
concatenated along the output axis, one layer computes all of them and a `Split` hands each branch its
slice. Every output element is computed from the same operands as before, so the result is the same.
Epilogue fusion runs first, so the fused forms (`tensorforge::FusedConv`, `tensorforge::FusedGemm`) merge
too when their activations agree: activations are elementwise and commute with the split.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..ir import DType, Graph, Node, Value
from .base import PassContext, Rule, RulePass, qualified_op
from .cse import attribute_key
from .utils import add_initializer, bypass

Signature = dict[str, Any]


@dataclass
class Branch:
    """One sibling layer: its node, constant weight, optional constant bias and output width."""

    node: Node
    weight: Value
    bias: Value | None
    width: int
    signature: Signature


@dataclass
class ParallelMatch:
    """Siblings reading `source` at input 0; `group` are those that merge (empty when the rule declines)."""

    source: Value
    siblings: list[Node]
    group: list[Branch] = field(default_factory=list)
    reason: str | None = None


def _freeze(value: Any) -> Hashable:
    """Attribute values as hashable, readable items (lists become tuples; tensors their exact key)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (bool, int, float, str)):
        return value
    return attribute_key(value)


def _constant(graph: Graph, value: Value | None) -> torch.Tensor | None:
    """The tensor of an initializer that is not also a graph input (which the caller may override)."""
    if value is None or not isinstance(value.const, torch.Tensor):
        return None
    if graph.initializers.get(value.name) is not value or value in graph.inputs:
        return None
    return value.const


def _diff(a: Signature, b: Signature) -> str:
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    shown = ", ".join(f"{k} {_show(a.get(k))} vs {_show(b.get(k))}" for k in keys)
    kind = "dtype mismatch" if any("dtype" in k for k in keys) else "different attributes"
    return f"{kind}: {shown}"


def _show(value: Any) -> str:
    if isinstance(value, tuple) and value and all(isinstance(v, (int, float, str)) for v in value):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


class _ParallelLayers(Rule):
    """Shared machinery; subclasses say how their op's weight, bias and output axis look.

    `op(X, Wᵢ) + bᵢ` for i = 1..n  →  `Split(op(X, [W₁ … Wₙ]) + [b₁ … bₙ], axis)`, missing biases as zeros.
    """

    weight_index: ClassVar[int] = 1
    bias_index: ClassVar[int | None] = 2
    residual_index: ClassVar[int | None] = None

    # -- what subclasses define -----------------------------------------------------------------------------

    def layer_problem(self, node: Node, weight: torch.Tensor, ctx: PassContext) -> str | None:
        """Why this node cannot take part at all, beyond constant and unshared weights."""
        return None

    def attributes(self, node: Node, weight: torch.Tensor) -> dict[str, Any]:
        """The node's attributes with defaults filled in, so that equal semantics compare equal."""
        return dict(node.attributes)

    def weight_axis(self, node: Node, weight: torch.Tensor) -> int:
        """The axis of the weight that holds the output channels (non-negative)."""
        raise NotImplementedError

    def output_axis(self, node: Node, ctx: PassContext) -> int:
        raise NotImplementedError

    def bias_problem(self, node: Node, bias: torch.Tensor, width: int) -> str | None:
        return None

    def merged_bias(self, branches: list[Branch]) -> torch.Tensor:
        raise NotImplementedError

    # -- match / check / rewrite ---------------------------------------------------------------------------

    def match(self, node: Node, ctx: PassContext) -> ParallelMatch | None:
        source = node.inputs[0] if node.inputs else None
        if source is None:
            return None
        kind = qualified_op(node)
        readers = [user for user, index in source.uses() if index == 0 and user.graph is node.graph]
        siblings = list(dict.fromkeys(user for user in readers if qualified_op(user) == kind))
        if siblings[0] is not node:
            return None  # the first sibling speaks for the group
        found = ParallelMatch(source, siblings)
        problems: list[tuple[Node, str]] = []
        branches: list[Branch] = []
        for sibling in siblings:
            branch = self._branch(sibling, ctx)
            if isinstance(branch, str):
                problems.append((sibling, branch))
            else:
                branches.append(branch)
        if len(siblings) == 1:
            if problems:
                return None  # not a candidate at all (e.g. a MatMul of two activations)
            found.reason = f"only one sibling: no other {kind} reads its input"
            return found
        groups: dict[Hashable, list[Branch]] = {}
        for branch in branches:
            groups.setdefault(tuple(branch.signature.items()), []).append(branch)
        best = max(groups.values(), key=len, default=[])
        if len(best) >= 2:
            found.group = best
        elif len(branches) >= 2:
            found.reason = _diff(branches[0].signature, branches[1].signature)
        else:
            node_, problem = problems[0]
            found.reason = f"only one sibling can merge; {node_.label}: {problem}"
        return found

    def check(self, match: ParallelMatch, ctx: PassContext) -> str | None:
        return match.reason

    def _branch(self, node: Node, ctx: PassContext) -> Branch | str:
        graph = node.graph
        assert graph is not None
        inputs = node.inputs
        weight_value = inputs[self.weight_index] if len(inputs) > self.weight_index else None
        weight = _constant(graph, weight_value)
        if weight is None:
            name = weight_value.name if weight_value is not None else ""
            return f"weight {name!r} is not constant"
        assert weight_value is not None
        if weight_value in graph.outputs:
            return f"weight {weight_value.name!r} is a graph output"
        if len(weight_value.uses()) > 1:
            return f"weight {weight_value.name!r} is shared with another node"
        if self.residual_index is not None and len(inputs) > self.residual_index and inputs[self.residual_index]:
            return "it adds a residual input Z"
        problem = self.layer_problem(node, weight, ctx)
        if problem is not None:
            return problem
        axis = self.weight_axis(node, weight)
        width = int(weight.shape[axis])
        bias_value = inputs[self.bias_index] if self.bias_index is not None and len(inputs) > self.bias_index else None
        if bias_value is not None:
            bias = _constant(graph, bias_value)
            if bias is None:
                return f"bias {bias_value.name!r} is not constant"
            if bias.dtype != weight.dtype:
                return f"dtype mismatch: bias {bias.dtype} vs weight {weight.dtype}"
            problem = self.bias_problem(node, bias, width)
            if problem is not None:
                return problem
        rest = tuple(d for i, d in enumerate(weight.shape) if i != axis)
        signature = {name: _freeze(v) for name, v in sorted(self.attributes(node, weight).items())}
        signature["weight shape"] = rest
        signature["weight dtype"] = str(weight.dtype).removeprefix("torch.")
        signature["output dtype"] = str(node.outputs[0].dtype)
        return Branch(node, weight_value, bias_value, width, signature)

    def rewrite(self, match: ParallelMatch, ctx: PassContext) -> str:
        group = match.group
        leader = group[0].node
        graph = leader.graph
        assert graph is not None
        weight_axis = self.weight_axis(leader, group[0].weight.const)
        weight = torch.cat([b.weight.const for b in group], dim=weight_axis)
        inputs: list[Value | None] = [match.source, self._initializer(graph, ctx, group[0].weight, weight)]
        if any(b.bias is not None for b in group):
            assert self.bias_index is not None
            while len(inputs) < self.bias_index:
                inputs.append(None)
            template = next(b.bias for b in group if b.bias is not None)
            inputs.append(self._initializer(graph, ctx, template, self.merged_bias(group)))

        out_axis = self.output_axis(leader, ctx)
        widths = [b.width for b in group]
        like = leader.outputs[0]
        hint = like.name or "parallel"
        merged_out = ctx.new_value(f"{hint}_merged", like=like)
        if like.shape is not None and -len(like.shape) <= out_axis < len(like.shape):
            shape = list(like.shape)
            shape[out_axis] = sum(widths)
            merged_out.shape = tuple(shape)
        merged = Node(
            leader.op_type,
            inputs,
            [merged_out],
            dict(leader.attributes),
            domain=leader.domain,
            name=ctx.fresh_name(leader.name or f"{leader.op_type}_merged"),
        )
        pieces = [ctx.new_value(b.node.outputs[0].name or "branch", like=b.node.outputs[0]) for b in group]
        split = self._split(graph, ctx, hint, merged_out, pieces, out_axis, widths)
        graph.append(merged)
        graph.append(split)
        for branch, piece in zip(group, pieces, strict=True):
            bypass(branch.node, branch.node.outputs[0], piece)
        for branch in group:
            for value in (branch.weight, branch.bias):
                if value is not None and not value.uses() and value not in graph.outputs and value not in graph.inputs:
                    graph.initializers.pop(value.name, None)
        names = ", ".join(b.node.name or b.node.outputs[0].name for b in group)
        return f"{len(group)} {qualified_op(leader)} ({names}) -> one of width {sum(widths)} + Split {widths}"

    def _initializer(self, graph: Graph, ctx: PassContext, like: Value, tensor: torch.Tensor) -> Value:
        value = ctx.new_value(f"{like.name}_merged")
        add_initializer(graph, value, tensor.contiguous())
        value.dtype = like.dtype if like.dtype != DType.UNDEFINED else value.dtype
        return value

    def _split(
        self,
        graph: Graph,
        ctx: PassContext,
        hint: str,
        source: Value,
        pieces: list[Value],
        axis: int,
        widths: list[int],
    ) -> Node:
        name = ctx.fresh_name(f"{hint}_split")
        if ctx.opset() >= 13:  # the sizes became an input in opset 13
            sizes = ctx.new_value(f"{hint}_split_sizes")
            add_initializer(graph, sizes, torch.tensor(widths, dtype=torch.int64))
            return Node("Split", [source, sizes], pieces, {"axis": axis}, name=name)
        return Node("Split", [source], pieces, {"axis": axis, "split": list(widths)}, name=name)


def _activations(attrs: dict[str, Any]) -> dict[str, Any]:
    """The fused epilogue's activation attributes with their defaults."""
    return {
        "pre": attrs.get("pre", ""),
        "pre_params": [float(p) for p in attrs.get("pre_params", ())],
        "post": attrs.get("post", ""),
        "post_params": [float(p) for p in attrs.get("post_params", ())],
    }


class MergeParallelConv(_ParallelLayers):
    """`Conv(X, Wᵢ, bᵢ)`, i = 1..n, same attributes, group = 1  →  `Split(Conv(X, cat₀ Wᵢ, cat bᵢ), axis=1)`.

    Output channel m of a convolution reads only filter m and bias m, so stacking the filters along the
    output-channel axis and splitting the result along the channel axis gives back every branch. The fused
    form `post(pre(Conv + b))` merges when `pre`/`post` agree (elementwise, so they commute with the split)
    and it adds no residual Z (the residuals would have to be concatenated at run time).
    """

    name = "merge-parallel-conv"
    op_types = ("Conv", "tensorforge::FusedConv")
    residual_index = 3

    def layer_problem(self, node: Node, weight: torch.Tensor, ctx: PassContext) -> str | None:
        if weight.dim() < 3:
            return f"weight rank {weight.dim()} is not a convolution filter"
        group = node.attributes.get("group", 1)
        if group != 1:
            return f"grouped convolution (group={group})"
        return None

    def attributes(self, node: Node, weight: torch.Tensor) -> dict[str, Any]:
        attrs = dict(node.attributes)
        spatial = weight.dim() - 2
        attrs["auto_pad"] = attrs.get("auto_pad", "NOTSET")
        attrs["dilations"] = list(attrs.get("dilations") or [1] * spatial)
        attrs["strides"] = list(attrs.get("strides") or [1] * spatial)
        attrs["pads"] = list(attrs.get("pads") or [0] * (2 * spatial))
        attrs["kernel_shape"] = list(weight.shape[2:])
        attrs["group"] = attrs.get("group", 1)
        if node.domain == "tensorforge":
            attrs.update(_activations(attrs))
        return attrs

    def weight_axis(self, node: Node, weight: torch.Tensor) -> int:
        return 0

    def output_axis(self, node: Node, ctx: PassContext) -> int:
        return 1

    def bias_problem(self, node: Node, bias: torch.Tensor, width: int) -> str | None:
        if tuple(bias.shape) != (width,):
            return f"bias shape {list(bias.shape)} is not [{width}]"
        return None

    def merged_bias(self, branches: list[Branch]) -> torch.Tensor:
        dtype = next(b.bias.const.dtype for b in branches if b.bias is not None)
        parts = [b.bias.const if b.bias is not None else torch.zeros(b.width, dtype=dtype) for b in branches]
        return torch.cat(parts)


class MergeParallelGemm(_ParallelLayers):
    """`alpha·op(A)·op(Bᵢ) + beta·Cᵢ`, i = 1..n, same alpha/beta/trans  →  one Gemm with the Bᵢ concatenated
    along N (axis 1 of B, or axis 0 when transB) and the Cᵢ, broadcast to `[rows, Nᵢ]` (missing: zeros),
    concatenated along N; then `Split(axis=-1)`.

    Column n of the product reads only column n of `op(B)` and of the broadcast `C`. The fused form
    `post(pre(alpha·op(A) @ op(B) + beta·C))` (batched) merges the same way when `pre`/`post` agree and it has
    no residual Z.
    """

    name = "merge-parallel-gemm"
    op_types = ("Gemm", "tensorforge::FusedGemm")
    residual_index = 3

    def layer_problem(self, node: Node, weight: torch.Tensor, ctx: PassContext) -> str | None:
        if weight.dim() < 2:
            return f"weight rank {weight.dim()} is not a matrix"
        if not math.isfinite(float(node.attributes.get("beta", 1.0))):
            return "beta is not finite (a missing bias cannot be filled with zeros)"
        if node.domain == "tensorforge" and _output_rank(node) is None and ctx.opset() < 11:
            return "output rank unknown and Split takes no negative axis before opset 11"
        return None

    def attributes(self, node: Node, weight: torch.Tensor) -> dict[str, Any]:
        attrs = dict(node.attributes)
        attrs["alpha"] = float(attrs.get("alpha", 1.0))
        attrs["beta"] = float(attrs.get("beta", 1.0))
        attrs["transA"] = int(attrs.get("transA", 0))
        attrs["transB"] = int(attrs.get("transB", 0))
        if node.domain == "tensorforge":
            attrs.update(_activations(attrs))
        return attrs

    def weight_axis(self, node: Node, weight: torch.Tensor) -> int:
        return weight.dim() - (2 if node.attributes.get("transB", 0) else 1)

    def output_axis(self, node: Node, ctx: PassContext) -> int:
        rank = 2 if node.domain != "tensorforge" else _output_rank(node)
        return rank - 1 if rank is not None else -1

    def bias_problem(self, node: Node, bias: torch.Tensor, width: int) -> str | None:
        rank = 2 if node.domain != "tensorforge" else _output_rank(node)
        if bias.dim() > (rank if rank is not None else 1):
            return f"bias rank {bias.dim()} exceeds the output's"
        if bias.dim() >= 1 and bias.shape[-1] not in (1, width):
            return f"bias shape {list(bias.shape)} does not broadcast to width {width}"
        return None

    def merged_bias(self, branches: list[Branch]) -> torch.Tensor:
        present = [b.bias.const for b in branches if b.bias is not None]
        dtype = present[0].dtype
        lead = torch.broadcast_shapes(*[tuple(c.shape[:-1]) for c in present])
        parts = []
        for branch in branches:
            shape = (*lead, branch.width)
            if branch.bias is None:
                parts.append(torch.zeros(shape, dtype=dtype))
            else:
                parts.append(torch.broadcast_to(branch.bias.const, shape))
        return torch.cat(parts, dim=-1)


class MergeParallelMatMul(_ParallelLayers):
    """`A @ Bᵢ`, i = 1..n, constant `Bᵢ` of rank ≥ 2 with equal batch and K dims  →
    `Split(A @ cat₋₁ Bᵢ, axis=-1)`: column n of the product reads only column n of B (Q/K/V projections).
    """

    name = "merge-parallel-matmul"
    op_types = ("MatMul",)
    bias_index = None

    def layer_problem(self, node: Node, weight: torch.Tensor, ctx: PassContext) -> str | None:
        if weight.dim() < 2:
            return "weight is a vector (MatMul drops its axis)"
        if _output_rank(node) is None and ctx.opset() < 11:
            return "output rank unknown and Split takes no negative axis before opset 11"
        return None

    def weight_axis(self, node: Node, weight: torch.Tensor) -> int:
        return weight.dim() - 1

    def output_axis(self, node: Node, ctx: PassContext) -> int:
        rank = _output_rank(node)
        return rank - 1 if rank is not None else -1


def _output_rank(node: Node) -> int | None:
    return node.outputs[0].rank


class MergeParallel(RulePass):
    """Merge sibling Conv / Gemm / MatMul layers (and their fused forms) that read the same input."""

    name = "merge-parallel"
    rules = (MergeParallelConv, MergeParallelGemm, MergeParallelMatMul)
