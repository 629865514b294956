"""A readable text form of a graph, one node a line, subgraphs indented."""

from __future__ import annotations

from typing import Any

import torch

from .graph import Graph, Value, format_type


def format_graph(graph: Graph, indent: str = "") -> str:
    lines = [f"{indent}graph {graph.name}("]
    for value in graph.inputs:
        lines.append(f"{indent}    %{value.name}: {format_type(value.dtype, value.shape)}")
    lines.append(f"{indent}) {{")
    for value in graph.initializers.values():
        lines.append(f"{indent}  %{value.name}: {format_type(value.dtype, value.shape)} = initializer")
    for node in graph.nodes:
        outs = ", ".join(f"%{v.name}: {format_type(v.dtype, v.shape)}" for v in node.outputs)
        ins = ", ".join("_" if v is None else f"%{v.name}" for v in node.inputs)
        op = node.op_type if not node.domain else f"{node.domain}::{node.op_type}"
        attrs = {k: a for k, a in node.attributes.items() if not isinstance(a, Graph)}
        attr_text = "<" + ", ".join(f"{k}={_format_attr(a)}" for k, a in attrs.items()) + ">" if attrs else ""
        lines.append(f"{indent}  {outs} = {op}{attr_text}({ins})")
        for key, attr in node.attributes.items():
            if isinstance(attr, Graph):
                lines.append(f"{indent}    {key}:")
                lines.append(format_graph(attr, indent + "      "))
    lines.append(f"{indent}  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def _format_attr(attr: Any) -> str:
    if isinstance(attr, torch.Tensor):
        if attr.numel() <= 8:
            return f"tensor({attr.tolist()})"
        return f"tensor<{attr.dtype}, {list(attr.shape)}>"
    if isinstance(attr, Value):
        return f"%{attr.name}"
    if isinstance(attr, float):
        return f"{attr:g}"
    return repr(attr)
