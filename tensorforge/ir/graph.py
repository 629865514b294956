"""The graph IR: values with use-def links, nodes, graphs and models.

A `Value` knows the node that produces it and every (node, input index) that uses it; a `Node` holds its
inputs and outputs in order; a `Graph` keeps its nodes in an order that survives removal while iterating.
Constructors store what they are given; the helpers below keep the links consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from .dtypes import DType

Dim = int | str | None
Shape = tuple[Dim, ...]


class Value:
    """A tensor flowing through the graph: a graph input, an initializer or a node output.

    `origin` names the value of the original (imported) model that this one equals, when there is one: the
    optimizer keeps it as rewrites replace values, so tools can compare an optimized value with its original.
    """

    __slots__ = ("_producer", "_uses", "const", "doc", "dtype", "name", "origin", "shape")

    def __init__(
        self,
        name: str,
        dtype: DType = DType.UNDEFINED,
        shape: Shape | None = None,
        const: Any = None,
    ) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.const = const
        self._producer: Node | None = None
        self._uses: list[tuple[Node, int]] = []
        self.doc = ""
        self.origin: str | None = None

    def producer(self) -> Node | None:
        return self._producer

    def uses(self) -> list[tuple[Node, int]]:
        return list(self._uses)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def replace_all_uses_with(self, other: Value) -> None:
        """Make every user of this value read `other` instead."""
        for node, index in self.uses():
            node.set_input(index, other)

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {format_type(self.dtype, self.shape)})"


class Node:
    """One operator application. `attributes` maps names to Python values, tensors or `Graph`s.

    `origins` names the nodes of the original (imported) model that this node stands for, producers first
    (a FusedConv: its Conv, BatchNormalization and Relu); the optimizer keeps it through its rewrites.
    """

    __slots__ = ("_inputs", "_outputs", "attributes", "doc", "domain", "graph", "name", "op_type", "origins")

    def __init__(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        outputs: Sequence[Value],
        attributes: dict[str, Any] | None = None,
        *,
        domain: str = "",
        name: str = "",
    ) -> None:
        self.op_type = op_type
        self.domain = domain
        self.name = name
        self.attributes = dict(attributes or {})
        self.graph: Graph | None = None
        self.doc = ""
        self.origins: tuple[str, ...] = ()
        self._inputs: list[Value | None] = []
        self._outputs: list[Value] = []
        for value in inputs:
            self._append_input(value)
        for value in outputs:
            if value._producer is not None:
                raise ValueError(f"value {value.name!r} already has a producer")
            value._producer = self
            self._outputs.append(value)

    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    @property
    def outputs(self) -> tuple[Value, ...]:
        return tuple(self._outputs)

    @property
    def label(self) -> str:
        """How errors name this node: its name, or its op type and first output."""
        if self.name:
            return f"{self.op_type} node {self.name!r}"
        first = self._outputs[0].name if self._outputs else "?"
        return f"{self.op_type} node producing {first!r}"

    def _append_input(self, value: Value | None) -> None:
        index = len(self._inputs)
        self._inputs.append(value)
        if value is not None:
            value._uses.append((self, index))

    def set_input(self, index: int, value: Value | None) -> None:
        old = self._inputs[index]
        if old is not None:
            old._uses.remove((self, index))
        self._inputs[index] = value
        if value is not None:
            value._uses.append((self, index))

    def detach(self) -> None:
        """Drop this node's links to its inputs (its outputs keep it as producer until replaced)."""
        for index, value in enumerate(self._inputs):
            if value is not None:
                value._uses.remove((self, index))
        self._inputs = [None] * len(self._inputs)

    def subgraphs(self) -> Iterator[Graph]:
        for attr in self.attributes.values():
            if isinstance(attr, Graph):
                yield attr
            elif isinstance(attr, list):
                yield from (a for a in attr if isinstance(a, Graph))

    def __repr__(self) -> str:
        return f"Node({self.op_type}, name={self.name!r})"


class Graph:
    """An ordered set of nodes with named inputs, outputs and initializers."""

    __slots__ = ("_nodes", "doc", "initializers", "inputs", "name", "outputs", "parent")

    def __init__(
        self,
        name: str = "graph",
        inputs: Sequence[Value] = (),
        outputs: Sequence[Value] = (),
        nodes: Iterable[Node] = (),
        initializers: Iterable[Value] = (),
        parent: Graph | None = None,
    ) -> None:
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.initializers: dict[str, Value] = {v.name: v for v in initializers}
        self._nodes: dict[Node, None] = {}
        self.parent = parent
        self.doc = ""
        for node in nodes:
            self.append(node)

    @property
    def nodes(self) -> list[Node]:
        """A snapshot of the nodes in order: safe to iterate while removing."""
        return list(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def append(self, node: Node) -> Node:
        node.graph = self
        self._nodes[node] = None
        for sub in node.subgraphs():
            sub.parent = self
        return node

    def remove(self, node: Node) -> None:
        """Remove `node`; its outputs must no longer be used."""
        for value in node.outputs:
            if value._uses:
                users = ", ".join(user.label for user, _ in value._uses)
                raise ValueError(f"cannot remove {node.label}: output {value.name!r} is used by {users}")
        node.detach()
        del self._nodes[node]
        node.graph = None

    def sort(self) -> None:
        """Reorder nodes topologically (stable); raise on a cycle."""
        from .validate import topological_order

        order = topological_order(self)
        self._nodes = dict.fromkeys(order)

    def all_nodes(self) -> Iterator[Node]:
        """Every node of this graph and of its subgraphs, depth first."""
        for node in self._nodes:
            yield node
            for sub in node.subgraphs():
                yield from sub.all_nodes()

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self._nodes)} nodes)"


class Model:
    """A top-level graph with the opsets it was written against and its metadata."""

    __slots__ = ("doc", "graph", "ir_version", "metadata", "opset_imports", "producer")

    def __init__(
        self,
        graph: Graph,
        opset_imports: dict[str, int],
        *,
        ir_version: int = 0,
        producer: str = "",
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.graph = graph
        self.opset_imports = dict(opset_imports)
        self.ir_version = ir_version
        self.producer = producer
        self.metadata = dict(metadata or {})
        self.doc = ""

    def opset(self, domain: str = "") -> int:
        if domain in ("", "ai.onnx"):
            return self.opset_imports.get("", self.opset_imports.get("ai.onnx", 1))
        return self.opset_imports.get(domain, 1)

    def parameter_count(self) -> int:
        total = 0
        for value in self.graph.initializers.values():
            if isinstance(value.const, torch.Tensor):
                total += value.const.numel()
        for node in self.graph.all_nodes():
            if node.op_type == "Constant" and node.domain == "":
                tensor = node.attributes.get("value")
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel()
        return total


def qualified_op(node: Node) -> str:
    """ "Conv" for an ONNX-domain node, "domain::Op" otherwise."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def format_shape(shape: Shape | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def format_type(dtype: DType, shape: Shape | None) -> str:
    kind = "?" if dtype == DType.UNDEFINED else str(dtype)
    return f"{kind}{format_shape(shape)}"
