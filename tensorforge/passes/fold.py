"""Constant folding, shape folding and dead-code elimination.

`ConstantFolding` evaluates every node whose inputs are all constants with the registry's reference
implementation (the same one the executor runs) and turns its outputs into initializers. It also resolves
`Shape`, `Size` and `Gather(Shape(x), i)` from static shapes, so that shape subgraphs
(Shape → Gather → Unsqueeze → Concat → Reshape) fold away through ordinary folding. A dynamic (symbolic)
dim is never folded. Results that would be huge, or much bigger than their inputs (ConstantOfShape, Expand,
Tile, Range), stay lazy.

`DeadCodeElimination` removes nodes none of whose outputs reach a graph output and drops unused
initializers; nodes with subgraphs are black boxes (kept or removed whole).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import DType, Graph, Node, Value
from ..ir.validate import topological_order
from ..ops import load_all
from ..ops.helpers import to_ints
from ..ops.registry import REGISTRY, OpContext
from .base import Pass, PassContext, Rule, RulePass
from .cleanup import dropout_training_reason
from .utils import add_initializer, attr, constant

# Largest folded result, in elements.
MAX_ELEMENTS = 16 * 1024 * 1024
# A result above this size that is also `GROWTH` times bigger than its inputs stays lazy (a broadcast fill,
# an Expand, a Tile): folding it would only trade a cheap op for a big weight.
LAZY_ELEMENTS = 1024 * 1024
GROWTH = 4

# Ops whose result is random: folding would freeze one draw.
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
)
# Ops kept even on constants: a DequantizeLinear of a weight carries the scale the precision stage builds
# its int8/fp8 layer from (folding it would leave only a float weight).
KEPT_OPS = frozenset({"DequantizeLinear"})
# Ops whose output size is set by the values (not the sizes) of their inputs: estimated before running.
_GENERATORS = frozenset({"ConstantOfShape", "Expand", "Tile", "Range"})


def folded_constant(value: Value | None, graph: Graph) -> torch.Tensor | None:
    """The tensor of `value` when it is a constant folding may use: an initializer that is not also a graph
    input (an input with a default can be overridden by a feed)."""
    tensor = constant(value)
    if tensor is None or value in graph.inputs:
        return None
    return tensor


def replace_with_constant(ctx: PassContext, node: Node, tensors: Sequence[torch.Tensor | Value | None]) -> None:
    """Remove `node`; each of its outputs becomes an initializer holding its tensor, under the same name and
    element type (users and graph outputs read the initializer). An output given as a `Value` (a constant
    it equals) is read from that value instead, unless it is a graph output: no weight is copied."""
    graph = node.graph
    assert graph is not None
    renames = []
    for old, tensor in zip(node.outputs, tensors, strict=True):
        if not old.name or tensor is None:
            continue
        if isinstance(tensor, Value):
            if old not in graph.outputs:
                old.replace_all_uses_with(tensor)
                continue
            tensor = tensor.const.clone()
        new = ctx.new_value(old.name, like=old)
        old.replace_all_uses_with(new)
        graph.outputs = [new if v is old else v for v in graph.outputs]
        renames.append((old, new, tensor))
    graph.remove(node)
    for old, new, tensor in renames:
        old.name, new.name = new.name, old.name
        dtype = old.dtype
        add_initializer(graph, new, tensor)
        if dtype != DType.UNDEFINED and dtype.has_torch and dtype.torch == tensor.dtype:
            new.dtype = dtype  # keeps sub-byte types, whose carrier is a wider torch dtype


@dataclass
class _Fold:
    node: Node
    inputs: list[Any]
    results: list[torch.Tensor | Value | None] = field(default_factory=list)


class FoldConstant(Rule):
    """op(c₁, …, cₙ) = c when every cᵢ is a constant and op is deterministic: c is computed once, here, by the
    registry's reference implementation."""

    name = "fold-constant"

    def __init__(self) -> None:
        self._decisions: dict[tuple[Node, tuple[Value | None, ...]], tuple[str | None, list]] = {}

    def match(self, node: Node, ctx: PassContext) -> _Fold | None:
        graph = ctx.model.graph
        inputs = []
        for value in node.inputs:
            if value is None:
                inputs.append(None)
                continue
            tensor = folded_constant(value, graph)
            if tensor is None:
                return None
            inputs.append(tensor)
        if not any(v.name and (v.uses() or v in graph.outputs) for v in node.outputs):
            return None  # dead: left to dead-code elimination
        return _Fold(node, inputs)

    def check(self, match: _Fold, ctx: PassContext) -> str | None:
        # Evaluating may be costly, and declined nodes are looked at again in every sweep: decide once.
        key = (match.node, match.node.inputs)
        if key not in self._decisions:
            reason, results = self._evaluate(match, ctx)
            self._decisions[key] = (reason, results)
        reason, match.results = self._decisions[key]
        return reason

    def _evaluate(self, match: _Fold, ctx: PassContext) -> tuple[str | None, list]:
        node = match.node
        if node.op_type in RANDOM_OPS:
            return f"{node.op_type} is random", []
        if node.op_type in KEPT_OPS and node.domain in ("", "ai.onnx"):
            return f"{node.op_type} keeps its quantization scale for the precision stage", []
        if node.op_type == "Dropout" and node.domain in ("", "ai.onnx"):
            training = dropout_training_reason(node, ctx.opset(node.domain))
            if training is not None:
                return training, []
        if any(True for _ in node.subgraphs()):
            return "the node has subgraphs", []
        opset = ctx.opset(node.domain)
        load_all()
        op_def = REGISTRY.lookup(node.op_type, node.domain, opset)
        if op_def is None:
            return f"no reference implementation of {node.op_type} at opset {opset}", []
        if op_def.check_attributes(node):
            return f"attributes {op_def.check_attributes(node)} are not supported", []
        input_elements = sum(t.numel() for t in match.inputs if t is not None)
        estimate = _estimate_elements(node, match.inputs)
        if estimate is not None:
            reason = _size_reason(estimate, input_elements, node.op_type)
            if reason is not None:
                return reason, []
        op_ctx = OpContext(
            node=node, opset=opset, device=torch.device("cpu"), output_dtypes=tuple(v.dtype for v in node.outputs)
        )
        try:
            with torch.no_grad():
                result = op_def.impl(op_ctx, *match.inputs, **node.attributes)
        except Exception as err:  # the op fails on these constants: leave it for run time to report
            return f"evaluation failed: {type(err).__name__}: {err}", []
        outputs = list(result) if isinstance(result, tuple) else [result]
        results: list[torch.Tensor | Value | None] = []
        for index, value in enumerate(node.outputs):
            tensor = outputs[index] if index < len(outputs) else None
            if not value.name:
                results.append(None)
                continue
            if not isinstance(tensor, torch.Tensor):
                return f"output {value.name!r} is not a tensor ({type(tensor).__name__})", []
            if value.dtype != DType.UNDEFINED and value.dtype.has_torch and value.dtype.torch != tensor.dtype:
                return f"output {value.name!r} evaluates to {tensor.dtype}, the graph declares {value.dtype}", []
            same = _same_tensor(tensor, match.node.inputs, match.inputs)
            if same is not None:
                results.append(same)  # Identity, an inference Dropout, a no-op Reshape of a weight
                continue
            # Own the memory: a result may be a view of an input constant or a stride-0 broadcast.
            results.append(tensor.detach().cpu().contiguous().clone())
        elements = sum(t.numel() for t in results if isinstance(t, torch.Tensor))
        reason = _size_reason(elements, input_elements, node.op_type)
        return reason, results

    def rewrite(self, match: _Fold, ctx: PassContext) -> str:
        replace_with_constant(ctx, match.node, match.results)
        made = [str(list(t.shape)) for t in match.results if isinstance(t, torch.Tensor)]
        kept = [v.name for v in match.results if isinstance(v, Value)]
        return (
            f"folded {match.node.op_type}"
            + (f" into constants {', '.join(made)}" if made else "")
            + (f" (reads the constants {kept})" if kept else "")
        )


class FoldShape(Rule):
    """Shape(x)[start:end] = the dims of x there, when they are all static (Shape with start/end, opset 15)."""

    name = "fold-shape"
    op_types = ("Shape",)

    def match(self, node: Node, ctx: PassContext) -> Node | None:
        return node if node.outputs[0].name else None

    def check(self, node: Node, ctx: PassContext) -> str | None:
        return _dims_reason(_selected_dims(node))

    def rewrite(self, node: Node, ctx: PassContext) -> str:
        dims = _selected_dims(node)
        replace_with_constant(ctx, node, [torch.tensor(dims, dtype=torch.int64)])
        return f"shape {dims}"


class FoldSize(Rule):
    """Size(x) = ∏ dims of x, when they are all static."""

    name = "fold-size"
    op_types = ("Size",)

    def match(self, node: Node, ctx: PassContext) -> Node | None:
        return node if node.outputs[0].name else None

    def check(self, node: Node, ctx: PassContext) -> str | None:
        shape = node.inputs[0].shape
        return _dims_reason(None if shape is None else list(shape))

    def rewrite(self, node: Node, ctx: PassContext) -> str:
        size = math.prod(node.inputs[0].shape)
        replace_with_constant(ctx, node, [torch.tensor(size, dtype=torch.int64)])
        return f"size {size}"


class FoldShapeElement(Rule):
    """Gather(Shape(x), i) = dim i of x when that dim is static, even if other dims of x are dynamic
    (`x.view(-1, x.size(1))` with a dynamic batch)."""

    name = "fold-shape-element"
    op_types = ("Gather",)

    def match(self, node: Node, ctx: PassContext) -> tuple[Node, list[Any], torch.Tensor] | None:
        data, indices = node.inputs[0], node.inputs[1]
        shape_node = data.producer()
        if shape_node is None or shape_node.op_type != "Shape" or shape_node.domain not in ("", "ai.onnx"):
            return None
        index = folded_constant(indices, ctx.model.graph)
        dims = _selected_dims(shape_node)
        if index is None or dims is None or attr(node, "axis", 0) not in (0, -1) or not node.outputs[0].name:
            return None
        return node, dims, index

    def check(self, match: tuple[Node, list[Any], torch.Tensor], ctx: PassContext) -> str | None:
        _, dims, index = match
        picked = _pick(dims, index)
        if picked is None:
            return f"indices {to_ints(index)} are out of range for a shape of rank {len(dims)}"
        return _dims_reason(picked)

    def rewrite(self, match: tuple[Node, list[Any], torch.Tensor], ctx: PassContext) -> str:
        node, dims, index = match
        picked = _pick(dims, index)
        replace_with_constant(ctx, node, [torch.tensor(picked, dtype=torch.int64).reshape(index.shape)])
        return f"dims {picked}"


class ConstantFolding(RulePass):
    """Folds static shapes, then every node whose inputs are all constants."""

    name = "constant-folding"
    rules = (FoldShape, FoldSize, FoldShapeElement, FoldConstant)


class DeadCodeElimination(Pass):
    """Removes nodes none of whose outputs reach a graph output, then the initializers nothing reads."""

    name = "dead-code-elimination"

    def run(self, ctx: PassContext) -> bool:
        graph = ctx.model.graph
        order = topological_order(graph)
        live: set[Value] = set(graph.outputs)
        dead = []
        for node in reversed(order):
            if any(v in live for v in node.outputs):
                live.update(_reads(node))
            else:
                dead.append(node)
        for node in dead:  # users before producers
            for sub in node.subgraphs():
                for inner in sub.all_nodes():
                    inner.detach()  # a subgraph may read values of this graph
            ctx.fired(self.name, node, f"removed dead {node.op_type}")
            graph.remove(node)
        dropped = _remove_unused_initializers(graph)
        if dropped:
            ctx.fired(self.name, graph.name, f"removed {len(dropped)} unused initializers")
        return bool(dead or dropped)


# -- helpers -------------------------------------------------------------------------------------------


def _selected_dims(node: Node) -> list[Any] | None:
    """The dims a Shape node returns (its start/end applied), possibly symbolic; None when the rank is unknown."""
    shape = node.inputs[0].shape
    if shape is None:
        return None
    return list(shape)[attr(node, "start", 0) : attr(node, "end", None)]


def _dims_reason(dims: list[Any] | None) -> str | None:
    if dims is None:
        return "the input's rank is unknown"
    dynamic = [d for d in dims if not isinstance(d, int)]
    if dynamic:
        shown = ", ".join("?" if d is None else repr(d) for d in dynamic)
        return f"dims {shown} are dynamic"
    return None


def _same_tensor(result: torch.Tensor, values: Sequence[Value | None], tensors: list[Any]) -> Value | None:
    """The input value whose constant `result` is (the same tensor, or a view of all of it), or None."""
    for value, tensor in zip(values, tensors, strict=True):
        if tensor is None:
            continue
        if result is tensor or (
            result.dtype == tensor.dtype
            and result.shape == tensor.shape
            and result.stride() == tensor.stride()
            and result.data_ptr() == tensor.data_ptr()
        ):
            return value
    return None


def _pick(dims: list[Any], index: torch.Tensor) -> list[Any] | None:
    picked = []
    for i in to_ints(index):
        if not -len(dims) <= i < len(dims):
            return None
        picked.append(dims[i])
    return picked


def _size_reason(elements: int, input_elements: int, op_type: str) -> str | None:
    if elements > MAX_ELEMENTS:
        return f"the result would have {elements} elements (more than {MAX_ELEMENTS})"
    if elements > LAZY_ELEMENTS and elements > GROWTH * input_elements:
        return f"the result would have {elements} elements from {input_elements} input elements: {op_type} stays lazy"
    return None


def _estimate_elements(node: Node, inputs: list[Any]) -> int | None:
    """Elements of the outputs, before running the node (None when unknown)."""
    try:
        if node.op_type == "ConstantOfShape":
            return math.prod(to_ints(inputs[0]))
        if node.op_type == "Expand":
            return math.prod(torch.broadcast_shapes(tuple(inputs[0].shape), tuple(to_ints(inputs[1]))))
        if node.op_type == "Tile" and len(inputs) == 2:
            return math.prod(d * r for d, r in zip(inputs[0].shape, to_ints(inputs[1]), strict=True))
        if node.op_type == "Range":
            start, limit, delta = (float(t.item()) for t in inputs)
            return max(math.ceil((limit - start) / delta), 0)
    except Exception:
        return None  # invalid inputs: evaluation will say why
    if node.op_type in _GENERATORS:
        return None
    total = 0
    for value in node.outputs:
        if not value.name:
            continue
        if not value.is_static:
            return None
        total += math.prod(value.shape)
    return total


def _reads(node: Node) -> list[Value]:
    """Values a node reads, including those its subgraphs capture from enclosing scopes."""
    values = [v for v in node.inputs if v is not None]
    for sub in node.subgraphs():
        inner: set[Value] = set(sub.inputs) | set(sub.initializers.values())
        for inner_node in sub.all_nodes():
            inner.update(inner_node.outputs)
            for nested in inner_node.subgraphs():
                inner.update(nested.inputs)
                inner.update(nested.initializers.values())
        for inner_node in sub.all_nodes():
            values.extend(v for v in inner_node.inputs if v is not None and v not in inner)
        values.extend(v for v in sub.outputs if v not in inner)
    return values


def _remove_unused_initializers(graph: Graph) -> list[str]:
    """Drop initializers nothing reads; unlike a plain use count this keeps those that a subgraph returns
    directly as one of its outputs, and those that are graph inputs (defaults a feed may override)."""
    kept: set[Value] = set(graph.outputs) | set(graph.inputs)
    for node in graph.all_nodes():
        for sub in node.subgraphs():
            kept.update(sub.outputs)
    unused = [name for name, v in graph.initializers.items() if not v.uses() and v not in kept]
    for name in unused:
        del graph.initializers[name]
    return unused


__all__ = [
    "ConstantFolding",
    "DeadCodeElimination",
    "FoldConstant",
    "FoldShape",
    "FoldShapeElement",
    "FoldSize",
]
