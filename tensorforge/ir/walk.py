"""The values' tensors while a graph's nodes run in order: each kept until the last node reading it has run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .graph import Node, Value


class Walk:
    """`env` (value → tensor) along `nodes`: `after(index, outputs)` stores node `index`'s named outputs and drops
    every value no later node reads, except the graph outputs in `kept`."""

    __slots__ = ("env", "kept", "last_reader", "nodes")

    def __init__(self, nodes: Sequence[Node], env: dict[Value, Any], kept: set[Value]) -> None:
        self.nodes, self.env, self.kept = nodes, env, kept
        self.last_reader = {v: i for i, node in enumerate(nodes) for v in node.inputs if v is not None}

    def after(self, index: int, outputs: Sequence[Any]) -> None:
        node = self.nodes[index]
        for value, output in zip(node.outputs, outputs, strict=False):
            if value.name:
                self.env[value] = output
        for value in [v for v in node.inputs if v is not None] + list(node.outputs):
            if self.last_reader.get(value, index) <= index and value not in self.kept:
                self.env.pop(value, None)
