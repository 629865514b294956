"""A model's summary: inputs and outputs, op histogram, parameters, opsets and what is unsupported."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

import torch

from .ir import Model, Value, format_shape
from .ops.executor import find_unsupported


def summarize_model(model: Model) -> dict[str, Any]:
    graph = model.graph
    ops = Counter(node.op_type if not node.domain else f"{node.domain}::{node.op_type}" for node in graph.all_nodes())
    param_bytes = sum(
        v.const.numel() * v.const.element_size()
        for v in graph.initializers.values()
        if isinstance(v.const, torch.Tensor)
    )
    return {
        "graph": graph.name,
        "producer": model.producer,
        "ir_version": model.ir_version,
        "opsets": {(k or "ai.onnx"): v for k, v in sorted(model.opset_imports.items())},
        "inputs": [_describe(v) for v in graph.inputs if v.name not in graph.initializers],
        "outputs": [_describe(v) for v in graph.outputs],
        "nodes": sum(ops.values()),
        "ops": dict(ops.most_common()),
        "parameters": model.parameter_count(),
        "parameter_bytes": param_bytes,
        "initializers": len(graph.initializers),
        "metadata": {k: (v if len(v) <= 80 else v[:77] + "...") for k, v in model.metadata.items()},
        "unsupported": _group_unsupported(model),
    }


def _group_unsupported(model: Model) -> list[dict[str, Any]]:
    """Unsupported nodes grouped by (domain, op, opset, reason), each group with its node names."""
    groups: dict[tuple, dict[str, Any]] = {}
    for item in find_unsupported(model):
        record = asdict(item)
        node = record.pop("node")
        groups.setdefault(tuple(record.values()), {**record, "nodes": []})["nodes"].append(node)
    return list(groups.values())


def _describe(value: Value) -> dict[str, Any]:
    shape = None if value.shape is None else ["?" if d is None else d for d in value.shape]
    return {"name": value.name, "dtype": str(value.dtype), "shape": shape, "text": format_shape(value.shape)}
