"""Queries and edits that rewrite rules share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..ir import Graph, Node, Value, qualified_op

if TYPE_CHECKING:
    from .base import PassContext


_CONVOLUTIONS = ("Conv", "tensorforge::FusedConv", "tensorforge::QuantizedConv")


def is_depthwise(node: Node) -> bool:
    """Whether `node` is a convolution with one group per input channel (more than one): each output channel
    reads one input channel, so a per-channel scale of that input folds into the output channel's."""
    if qualified_op(node) not in _CONVOLUTIONS:
        return False
    x = node.inputs[0]
    channels = x.shape[1] if x is not None and x.shape is not None and len(x.shape) > 2 else None
    return isinstance(channels, int) and channels > 1 and node.attributes.get("group", 1) == channels


def is_graph_output(value: Value) -> bool:
    producer = value.producer()
    graph = producer.graph if producer is not None else None
    return graph is not None and value in graph.outputs


def constant(value: Value | None) -> torch.Tensor | None:
    """The tensor of a constant (initializer) value, or None."""
    if value is None or not isinstance(value.const, torch.Tensor):
        return None
    return value.const


def is_shared(value: Value) -> bool:
    """Whether more than one node reads `value` (a weight shared between layers, say)."""
    return len(value.uses()) > 1


def add_initializer(graph: Graph, value: Value, tensor: torch.Tensor) -> Value:
    from ..ir import DType

    value.const = tensor
    value.dtype = DType.from_torch(tensor.dtype)
    value.shape = tuple(tensor.shape)
    graph.initializers[value.name] = value
    return value


def remove_unused_initializers(graph: Graph) -> int:
    unused = [name for name, v in graph.initializers.items() if not v.uses() and v not in graph.outputs]
    inputs = set(graph.inputs)
    for name in unused:
        if graph.initializers[name] not in inputs:
            del graph.initializers[name]
    return len(unused)


def replace_node(node: Node, replacement: Node, outputs: dict[Value, Value] | None = None) -> None:
    """Put `replacement` where `node` was: users of each old output read its new counterpart."""
    graph = node.graph
    assert graph is not None
    graph.append(replacement)
    mapping = outputs or dict(zip(node.outputs, replacement.outputs, strict=True))
    for old, new in mapping.items():
        _rewire(graph, old, new)
    graph.remove(node)


def replace_with_fused(ctx: PassContext, node: Node, op_type: str, inputs: list, attributes: dict) -> Node:
    """Put a `tensorforge::op_type` node with `inputs` and `attributes` where `node` was, under its name and
    standing for the original nodes it did; its one output takes over `node`'s first."""
    from ..ops.fused import DOMAIN

    out = node.outputs[0]
    fused = Node(op_type, inputs, [ctx.new_value(out.name, like=out)], attributes, domain=DOMAIN, name=node.name)
    fused.origins = node.origins
    replace_node(node, fused)
    return fused


def bypass(node: Node, output: Value, source: Value) -> None:
    """Remove `node`, whose `output` equals `source`: its users (and graph outputs) read `source`."""
    graph = node.graph
    assert graph is not None
    _rewire(graph, output, source)
    graph.remove(node)


def rewire_problem(old: Value, new: Value) -> str | None:
    """Why users of `old` cannot be pointed at `new`, or None.

    A graph output keeps its name, so `new` must take the name over: that is impossible when `new` is a graph
    input, an initializer or another graph output.
    """
    if not is_graph_output(old):
        return None
    graph = old.producer().graph
    if new.producer() is None or new in graph.outputs:
        return f"{old.name!r} is a graph output and {new.name!r} is an input, initializer or other output"
    return None


def _rewire(graph: Graph, old: Value, new: Value) -> None:
    """Users of `old` read `new`, which equals it: `new` takes over its `origin` unless it has its own."""
    problem = rewire_problem(old, new)
    if problem is not None:
        raise ValueError(problem)
    if new.origin is None:
        new.origin = old.origin
    old.replace_all_uses_with(new)
    if old in graph.outputs:
        # A graph output keeps its name: the replacement value takes it over.
        graph.outputs = [new if v is old else v for v in graph.outputs]
        old.name, new.name = new.name, old.name


def attr(node: Node, name: str, default: Any = None) -> Any:
    return node.attributes.get(name, default)
