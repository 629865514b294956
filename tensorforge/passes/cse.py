"""Common subexpression elimination: identical constants and identical nodes become one.

Two initializers with the same element type, shape and bytes hold the same tensor, so every reader of the
second may read the first. Two nodes applying the same deterministic op, with the same attributes, to the
same inputs compute the same outputs, so the users of the second may read the first. Merging constants first
is what lets two copies of a layer (two Convs on one input with byte-identical weights) merge as nodes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from ..ir import Graph, Node, Value, topological_order
from .base import Pass, PassContext, Rule, _label
from .utils import is_graph_output, rewire_problem

# Ops whose outputs differ from one evaluation to the next: two of them are never "the same".
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
)
# Binary ops where op(a, b) == op(b, a) bit for bit (IEEE addition and multiplication commute; so do
# max/min, which propagate NaN from either side, and the logical and bitwise ops).
COMMUTATIVE = frozenset(
    {"Add", "Mul", "Max", "Min", "And", "Or", "Xor", "Equal", "BitwiseAnd", "BitwiseOr", "BitwiseXor"}
)


class _Unhashable(Exception):
    """An attribute the key cannot describe exactly (the node is then left alone)."""


def tensor_key(tensor: torch.Tensor | np.ndarray) -> tuple[Hashable, ...]:
    """Element type, shape and a digest of the bytes: equal keys mean bit-identical tensors."""
    if isinstance(tensor, np.ndarray):
        if tensor.dtype == object:  # strings
            payload = repr(tensor.tolist()).encode("utf-8", errors="surrogateescape")
        else:
            payload = np.ascontiguousarray(tensor).tobytes()
        return ("ndarray", tensor.dtype.str, tensor.shape, hashlib.blake2b(payload, digest_size=20).digest())
    # A fresh dense copy: broadcast results (stride 0) and size-1 views cannot be viewed as bytes directly.
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype).copy_(tensor.detach().cpu().reshape(-1))
    raw = flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)
    digest = hashlib.blake2b(raw.numpy().tobytes(), digest_size=20).digest()
    return ("tensor", str(tensor.dtype), tuple(tensor.shape), digest)


def attribute_key(value: Any) -> Hashable:
    """A hashable description of an attribute value, exact: floats by their bits, tensors by their bytes.

    Raises `_Unhashable` for what it cannot describe (subgraphs, unknown objects).
    """
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return ("i", value)
    if isinstance(value, float):
        return ("f", struct.pack("<d", value))  # -0.0 != 0.0, NaN == NaN of the same bits
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, bytes):
        return ("y", value)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tensor_key(value)
    if isinstance(value, (list, tuple)):
        return ("l", tuple(attribute_key(v) for v in value))
    raise _Unhashable(type(value).__name__)


def attributes_key(attributes: dict[str, Any]) -> Hashable:
    return tuple(sorted((name, attribute_key(v)) for name, v in attributes.items()))


def _domain(node: Node) -> str:
    return "" if node.domain == "ai.onnx" else node.domain


def _is_deterministic(node: Node) -> bool:
    if node.op_type in NONDETERMINISTIC:
        return False
    if node.op_type == "Dropout" and _domain(node) == "":
        # In training mode Dropout draws a mask; it is deterministic only when training_mode is absent or a
        # constant false.
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            flag = node.inputs[2].const
            return isinstance(flag, torch.Tensor) and flag.numel() == 1 and not bool(flag.reshape(-1)[0])
    return True


class IdenticalConstants(Rule):
    """`c₁ ≡ c₂` when dtype, shape and bytes agree: readers of `c₂` read `c₁`.

    Initializers that are also graph inputs may be overridden at run time and are left alone.
    """

    name = "identical-constants"

    def groups(self, graph: Graph) -> list[list[Value]]:
        """Initializers that hold the same tensor, in groups of two or more, in initializer order."""
        inputs = set(graph.inputs)
        by_type: dict[tuple[Hashable, ...], list[Value]] = {}
        for value in graph.initializers.values():
            if value in inputs or not isinstance(value.const, torch.Tensor):
                continue
            key = (int(value.dtype), str(value.const.dtype), tuple(value.const.shape))
            by_type.setdefault(key, []).append(value)
        groups = []
        for candidates in by_type.values():
            if len(candidates) < 2:
                continue  # nothing to compare with: no need to hash the bytes
            by_bytes: dict[Hashable, list[Value]] = {}
            for value in candidates:
                by_bytes.setdefault(tensor_key(value.const), []).append(value)
            groups.extend(group for group in by_bytes.values() if len(group) > 1)
        return groups

    def check(self, match: tuple[Value, Value], ctx: PassContext) -> str | None:
        duplicate = match[1]
        if duplicate in ctx.model.graph.outputs:
            return f"constant {duplicate.name!r} is a graph output (it keeps its own name)"
        return None

    def rewrite(self, match: tuple[Value, Value], ctx: PassContext) -> str:
        keep, duplicate = match
        users = len(duplicate.uses())
        duplicate.replace_all_uses_with(keep)
        del ctx.model.graph.initializers[duplicate.name]
        return f"{duplicate.name!r} is a copy of {keep.name!r} ({users} users moved)"


class IdenticalNodes(Rule):
    """`op(x…; attrs) ≡ op(x…; attrs)` for a deterministic op without subgraphs: users of the second read the
    first. For commutative binary ops `op(a, b) ≡ op(b, a)`.

    `match` remembers every node it has seen under its key, so nodes must be visited producers first.
    """

    name = "cse"

    def __init__(self) -> None:
        self.seen: dict[Hashable, Node] = {}

    def key(self, node: Node) -> Hashable | None:
        if not _is_deterministic(node) or any(True for _ in node.subgraphs()) or not node.outputs:
            return None
        try:
            attrs = attributes_key(node.attributes)
        except _Unhashable:
            return None
        inputs = [None if v is None else id(v) for v in node.inputs]
        if node.op_type in COMMUTATIVE and _domain(node) == "" and len(inputs) == 2 and None not in inputs:
            inputs.sort()
        # Which optional outputs are requested changes what a node computes (an unnamed one is not produced).
        produced = tuple(bool(v.name) for v in node.outputs)
        return (_domain(node), node.op_type, attrs, tuple(inputs), produced)

    def match(self, node: Node, ctx: PassContext) -> tuple[Node, Node] | None:
        key = self.key(node)
        if key is None:
            return None
        first = self.seen.setdefault(key, node)
        return None if first is node else (first, node)

    def check(self, match: tuple[Node, Node], ctx: PassContext) -> str | None:
        first, duplicate = match
        for kept, dropped in zip(first.outputs, duplicate.outputs, strict=True):
            if is_graph_output(dropped) and is_graph_output(kept):
                return f"both {kept.name!r} and {dropped.name!r} are graph outputs"
            problem = rewire_problem(dropped, kept)
            if problem is not None:
                return problem
        return None

    def rewrite(self, match: tuple[Node, Node], ctx: PassContext) -> str:
        first, duplicate = match
        graph = duplicate.graph
        assert graph is not None
        for kept, dropped in zip(first.outputs, duplicate.outputs, strict=True):
            dropped.replace_all_uses_with(kept)
            if dropped in graph.outputs:
                # The graph output keeps its name: the surviving value takes it over.
                graph.outputs = [kept if v is dropped else v for v in graph.outputs]
                kept.name, dropped.name = dropped.name, kept.name
        graph.remove(duplicate)
        return f"same as {first.label}"


class CommonSubexpressions(Pass):
    """Merge identical constants, then identical nodes (producers first), until nothing changes."""

    name = "cse"
    max_rounds = 20

    def run(self, ctx: PassContext) -> bool:
        changed = False
        declined: set[tuple[str, int]] = set()
        for _ in range(self.max_rounds):
            fired = self._constants(ctx, declined) | self._nodes(ctx, declined)
            changed |= fired
            if not fired:
                break
        return changed

    def _constants(self, ctx: PassContext, declined: set[tuple[str, int]]) -> bool:
        rule = IdenticalConstants()
        fired = False
        for group in rule.groups(ctx.model.graph):
            # Keep an initializer that is a graph output if there is one: it cannot be renamed away.
            keep = next((v for v in group if v in ctx.model.graph.outputs), group[0])
            for duplicate in group:
                if duplicate is keep:
                    continue
                fired |= _apply(rule, (keep, duplicate), duplicate.name, ctx, declined)
        return fired

    def _nodes(self, ctx: PassContext, declined: set[tuple[str, int]]) -> bool:
        rule = IdenticalNodes()
        graph = ctx.model.graph
        fired = False
        for node in topological_order(graph):
            if node.graph is not graph:
                continue
            match = rule.match(node, ctx)
            if match is not None:
                fired |= _apply(rule, match, node, ctx, declined, survivor=match[0])
        return fired


def _apply(
    rule: Rule,
    match: Any,
    where: Node | str,
    ctx: PassContext,
    declined: set[tuple[str, int]],
    survivor: Node | None = None,
) -> bool:
    reason = rule.check(match, ctx)
    if reason is not None:
        key = (rule.name, id(where) if isinstance(where, Node) else hash(where))
        if key not in declined:
            declined.add(key)
            ctx.declined(rule.name, where, reason)
        return False
    label = where if isinstance(where, str) else _label(where)  # before the rewrite renames anything
    with ctx.rewriting(survivor):  # the kept node stands for the duplicate too
        detail = rule.rewrite(match, ctx)
    ctx.fired(rule.name, label, detail)
    return True
