"""A `Model` as a JSON-ready dict plus named tensors (for a safetensors blob): lossless, and never pickled.

Values are referred to by name within a graph scope; a subgraph's reference to an outer value resolves
through the enclosing scopes on load, to the same `Value` object. Every attribute is stored with its kind
(int, float, bool, str, list of those, tensor, string array, graph, list of graphs, ONNX TypeProto), so
the round trip restores the exact Python types. Floats that JSON cannot hold (inf, nan) are spelled out.
Tensors go to the tensor dict under generated keys ("t0", "t1", ...), listed in the dict where they are used.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch

from ..errors import GraphError
from .dtypes import DType
from .graph import Graph, Model, Node, Value

FORMAT_VERSION = 1
_SPECIAL_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def model_to_dict(model: Model) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """`model` as (a JSON-ready dict, the tensors it refers to by key)."""
    writer = _Writer()
    data = {
        "format_version": FORMAT_VERSION,
        "opset_imports": dict(model.opset_imports),
        "ir_version": model.ir_version,
        "producer": model.producer,
        "metadata": dict(model.metadata),
        "doc": model.doc,
        "graph": writer.graph(model.graph),
    }
    return data, writer.tensors


def model_from_dict(data: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> Model:
    """The `Model` that `model_to_dict` described; a `GraphError` naming what is malformed otherwise."""
    try:
        if data.get("format_version") != FORMAT_VERSION:
            raise GraphError(f"graph format version {data.get('format_version')!r}, expected {FORMAT_VERSION}")
        reader = _Reader(tensors)
        model = Model(
            reader.graph(data["graph"], {}),
            {str(k): int(v) for k, v in data["opset_imports"].items()},
            ir_version=int(data["ir_version"]),
            producer=str(data["producer"]),
            metadata={str(k): str(v) for k, v in data["metadata"].items()},
        )
        model.doc = str(data.get("doc", ""))
        return model
    except GraphError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise GraphError(f"the serialized graph is malformed: {type(err).__name__}: {err}") from None


def _float(value: float) -> float | str:
    return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def _unfloat(value: float | str) -> float:
    if isinstance(value, str):
        if value not in _SPECIAL_FLOATS:
            raise GraphError(f"the serialized graph holds the float {value!r}, which is not inf, -inf or nan")
        return _SPECIAL_FLOATS[value]
    return float(value)


class _Writer:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def tensor(self, tensor: torch.Tensor) -> str:
        key = f"t{len(self.tensors)}"
        self.tensors[key] = tensor
        return key

    def const(self, const: Any) -> dict[str, Any]:
        if isinstance(const, torch.Tensor):
            return {"kind": "tensor", "key": self.tensor(const)}
        if isinstance(const, np.ndarray) and const.dtype.kind in "OUS":
            return {"kind": "strings", "shape": list(const.shape), "data": [str(s) for s in const.reshape(-1)]}
        raise GraphError(f"cannot serialize a constant of type {type(const).__name__}")

    def value(self, value: Value) -> dict[str, Any]:
        shape = None if value.shape is None else list(value.shape)
        entry: dict[str, Any] = {"name": value.name, "dtype": value.dtype.name, "shape": shape}
        if value.doc:
            entry["doc"] = value.doc
        if value.const is not None:
            entry["const"] = self.const(value.const)
        return entry

    def graph(self, graph: Graph) -> dict[str, Any]:
        described: dict[str, dict[str, Any]] = {}
        for value in [*graph.inputs, *graph.initializers.values(), *(v for n in graph.nodes for v in n.outputs)]:
            if value.name and value.name not in described:
                described[value.name] = self.value(value)
        nodes = []
        for node in graph.nodes:
            entry: dict[str, Any] = {
                "op_type": node.op_type,
                "domain": node.domain,
                "name": node.name,
                "inputs": [None if v is None else v.name for v in node.inputs],
                "outputs": [v.name for v in node.outputs],
                "attributes": {name: self.attribute(a) for name, a in node.attributes.items()},
            }
            unnamed = [self.value(v) for v in node.outputs if not v.name]
            if unnamed:
                entry["unnamed_outputs"] = unnamed
            if node.doc:
                entry["doc"] = node.doc
            nodes.append(entry)
        return {
            "name": graph.name,
            "doc": graph.doc,
            "values": list(described.values()),
            "inputs": [v.name for v in graph.inputs],
            "initializers": list(graph.initializers),
            "outputs": [v.name for v in graph.outputs],
            "nodes": nodes,
        }

    def attribute(self, attr: Any) -> dict[str, Any]:
        if isinstance(attr, bool):
            return {"kind": "bool", "value": attr}
        if isinstance(attr, int):
            return {"kind": "int", "value": attr}
        if isinstance(attr, float):
            return {"kind": "float", "value": _float(attr)}
        if isinstance(attr, str):
            return {"kind": "str", "value": attr}
        if isinstance(attr, bytes):
            return {"kind": "bytes", "value": base64.b64encode(attr).decode("ascii")}
        if isinstance(attr, Graph):
            return {"kind": "graph", "value": self.graph(attr)}
        if isinstance(attr, torch.Tensor | np.ndarray):
            return {"kind": "const", "value": self.const(attr)}
        if isinstance(attr, onnx.TypeProto):
            return {"kind": "type_proto", "value": base64.b64encode(attr.SerializeToString()).decode("ascii")}
        if isinstance(attr, list | tuple):
            return {"kind": "list", "value": [self.attribute(a) for a in attr]}
        if attr is None:
            return {"kind": "none"}
        raise GraphError(f"cannot serialize an attribute of type {type(attr).__name__}")


class _Reader:
    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def const(self, entry: Mapping[str, Any]) -> Any:
        if entry["kind"] == "tensor":
            key = entry["key"]
            if key not in self.tensors:
                raise GraphError(f"the serialized graph refers to tensor {key!r}, which the weights do not hold")
            return self.tensors[key]
        if entry["kind"] == "strings":
            return np.array([str(s) for s in entry["data"]], dtype=object).reshape(entry["shape"])
        raise GraphError(f"unknown constant kind {entry['kind']!r} in the serialized graph")

    def value(self, entry: Mapping[str, Any]) -> Value:
        dtype_name = entry["dtype"]
        if dtype_name not in DType.__members__:
            raise GraphError(f"value {entry['name']!r} has unknown element type {dtype_name!r}")
        shape = entry["shape"]
        if shape is not None and not all(d is None or isinstance(d, int | str) for d in shape):
            raise GraphError(f"value {entry['name']!r} has a malformed shape {shape!r}")
        value = Value(str(entry["name"]), DType[dtype_name], None if shape is None else tuple(shape))
        value.doc = str(entry.get("doc", ""))
        if "const" in entry:
            value.const = self.const(entry["const"])
        return value

    def graph(self, data: Mapping[str, Any], outer: Mapping[str, Value]) -> Graph:
        scope: dict[str, Value] = dict(outer)
        local = {}
        for entry in data["values"]:
            local[entry["name"]] = self.value(entry)
        scope.update(local)

        def lookup(name: str, where: str) -> Value:
            if name not in scope:
                raise GraphError(f"{where} names value {name!r}, which is not defined in graph {data['name']!r}")
            return scope[name]

        graph = Graph(str(data["name"]))
        graph.doc = str(data.get("doc", ""))
        graph.inputs = [lookup(n, "a graph input") for n in data["inputs"]]
        graph.initializers = {n: lookup(n, "an initializer") for n in data["initializers"]}
        for entry in data["nodes"]:
            where = f"{entry['op_type']} node {entry['name']!r}"
            unnamed = iter(self.value(v) for v in entry.get("unnamed_outputs", ()))
            inputs = [None if n is None else lookup(n, where) for n in entry["inputs"]]
            outputs = [local[n] if n else next(unnamed) for n in entry["outputs"]]
            attributes = {name: self.attribute(a, scope) for name, a in entry["attributes"].items()}
            node = Node(entry["op_type"], inputs, outputs, attributes, domain=entry["domain"], name=entry["name"])
            node.doc = str(entry.get("doc", ""))
            graph.append(node)
        graph.outputs = [lookup(n, "a graph output") for n in data["outputs"]]
        return graph

    def attribute(self, entry: Mapping[str, Any], scope: Mapping[str, Value]) -> Any:
        kind = entry["kind"]
        if kind in ("bool", "int", "str"):
            expected = {"bool": bool, "int": int, "str": str}[kind]
            if type(entry["value"]) is not expected:
                raise GraphError(f"attribute of kind {kind} holds {entry['value']!r}")
            return entry["value"]
        if kind == "float":
            return _unfloat(entry["value"])
        if kind == "bytes":
            return base64.b64decode(entry["value"])
        if kind == "graph":
            return self.graph(entry["value"], scope)
        if kind == "const":
            return self.const(entry["value"])
        if kind == "type_proto":
            proto = onnx.TypeProto()
            proto.ParseFromString(base64.b64decode(entry["value"]))
            return proto
        if kind == "list":
            return [self.attribute(a, scope) for a in entry["value"]]
        if kind == "none":
            return None
        raise GraphError(f"unknown attribute kind {kind!r} in the serialized graph")
