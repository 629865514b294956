"""Structural copies of graphs and models: new `Graph`/`Node`/`Value` objects, shared constant tensors."""

from __future__ import annotations

from typing import Any

from .graph import Graph, Model, Node, Value


def clone_model(model: Model) -> Model:
    copy = Model(
        clone_graph(model.graph, {}),
        model.opset_imports,
        ir_version=model.ir_version,
        producer=model.producer,
        metadata=model.metadata,
    )
    copy.doc = model.doc
    return copy


def clone_graph(graph: Graph, mapping: dict[Value, Value]) -> Graph:
    """A copy of `graph`; `mapping` maps values of enclosing scopes to their copies and is extended."""

    def value(old: Value | None) -> Value | None:
        if old is None:
            return None
        new = mapping.get(old)
        if new is None:
            new = Value(old.name, old.dtype, old.shape, old.const)
            new.doc = old.doc
            new.origin = old.origin
            mapping[old] = new
        return new

    copy = Graph(graph.name)
    copy.doc = graph.doc
    copy.inputs = [value(v) for v in graph.inputs]
    copy.initializers = {name: value(v) for name, v in graph.initializers.items()}
    for node in graph.nodes:
        outputs = [value(v) for v in node.outputs]
        inputs = [value(v) for v in node.inputs]
        attributes = {k: _clone_attribute(a, mapping) for k, a in node.attributes.items()}
        new = Node(node.op_type, inputs, outputs, attributes, domain=node.domain, name=node.name)
        new.doc = node.doc
        new.origins = node.origins
        copy.append(new)
    copy.outputs = [value(v) for v in graph.outputs]
    return copy


def _clone_attribute(attr: Any, mapping: dict[Value, Value]) -> Any:
    if isinstance(attr, Graph):
        return clone_graph(attr, mapping)
    if isinstance(attr, list):
        return [_clone_attribute(a, mapping) for a in attr]
    return attr
