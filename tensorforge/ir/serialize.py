"""A `Model` as a JSON-ready dict plus named tensors (for a safetensors blob): lossless, and never pickled.

Each graph lists the values it defines (inputs and initializers under "values", node outputs in their node)
and names the values it reads; a name resolves through the enclosing graphs as in ONNX, so a subgraph that
reads an outer value gets that very `Value` object back. Attributes and constants carry their kind,
``{"kind": "int", "value": 3}`` or ``{"kind": "float", "list": [0.5, "0x7ff0000000000000"]}``, so the round
trip restores the exact Python type. Strict JSON has no inf or nan: a non-finite float is written as its
IEEE-754 bits. A string holding lone surrogates (how the importer keeps bytes that are not UTF-8) is written
as ``{"surrogatepass": <base64 of its bytes>}``. Tensors go into the tensor dict under keys such as
``"init/<name>"``, their dtype and shape repeated in the dict; the dtypes safetensors cannot store
(complex128, float8_e8m0fnu) travel as raw bytes. The optimizer's provenance (`Node.origins`,
`Value.origin`) is optional on reading: files written before it existed load with none.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import reprlib
import struct
from collections import ChainMap
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch
from google.protobuf.message import DecodeError

from ..errors import GraphError
from .dtypes import DType
from .graph import Graph, Model, Node, Value
from .validate import validate

FORMAT_VERSION = 1

_Scope = ChainMap[str, Value]

_TORCH_DTYPES = {str(d.torch).removeprefix("torch."): d.torch for d in DType if d.has_torch}
_DTYPE_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}
_AS_BYTES = frozenset(getattr(torch, name) for name in ("complex128", "float8_e8m0fnu") if hasattr(torch, name))
_SCALARS = {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes"}
_PROTOS = {"type_proto": onnx.TypeProto, "sparse_tensor_proto": onnx.SparseTensorProto}
_KINDS = frozenset({*_SCALARS.values(), "tensor", "array", "graph", *_PROTOS})
_STRING_ITEMS = {"U": (str,), "S": (bytes,), "O": (str, bytes)}  # what a numpy string array may hold
_ARRAY_DTYPE = re.compile(r"\|O|[<>]U\d+|\|S\d+")
_FLOAT_BITS = re.compile(r"0x[0-9a-f]{16}")
_JSON_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    Mapping: "an object",
    type(None): "null",
}


def model_to_dict(model: Model) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """`model` as (a JSON-ready dict, the tensors it refers to by key); `GraphError` for what cannot be stored."""
    writer = _Writer()
    data = {
        "format_version": FORMAT_VERSION,
        "ir_version": model.ir_version,
        "opset_imports": dict(model.opset_imports),
        "producer": model.producer,
        "metadata": dict(model.metadata),
        "doc": model.doc,
        "graph": writer.graph(model.graph, ChainMap()),
    }
    return data, writer.tensors


def model_from_dict(data: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> Model:
    """The `Model` that `model_to_dict` described, validated; a `GraphError` naming what is malformed."""
    where = "the serialized model"
    version = _field(data, "format_version", int, where)
    if version != FORMAT_VERSION:
        raise GraphError(f"{where} has format version {version}; this tensorforge reads version {FORMAT_VERSION}")
    opsets = _field(data, "opset_imports", Mapping, where)
    metadata = _field(data, "metadata", Mapping, where)
    model = Model(
        _Reader(tensors).graph(_field(data, "graph", Mapping, where), ChainMap(), "graph"),
        {domain: _expect(v, int, f"{where}: opset of domain {domain!r}") for domain, v in opsets.items()},
        ir_version=_field(data, "ir_version", int, where),
        producer=_field(data, "producer", str, where),
        metadata={key: _expect(v, str, f"{where}: metadata {key!r}") for key, v in metadata.items()},
    )
    model.doc = _field(data, "doc", str, where)
    validate(model.graph)
    return model


class _Writer:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def graph(self, graph: Graph, outer: _Scope) -> dict[str, Any]:
        scope = outer.new_child()
        where = f"graph {graph.name!r}"
        values = list(dict.fromkeys([*graph.inputs, *graph.initializers.values()]))
        for value in [*values, *(v for node in graph.nodes for v in node.outputs)]:
            if value.name in scope.maps[0]:
                raise GraphError(f"{where} defines the value {value.name!r} twice")
            if value.name:
                scope.maps[0][value.name] = value
        for name, value in graph.initializers.items():
            if name != value.name:
                raise GraphError(f"{where} lists the initializer {value.name!r} under the name {name!r}")
        return {
            "name": graph.name,
            "doc": graph.doc,
            "values": [self.value(v, scope) for v in values],
            "inputs": [_name(v, scope, where) for v in graph.inputs],
            "initializers": list(graph.initializers),
            "nodes": [self.node(node, scope) for node in graph.nodes],
            "outputs": [_name(v, scope, where) for v in graph.outputs],
        }

    def node(self, node: Node, scope: _Scope) -> dict[str, Any]:
        key = f"attr/{node.name or node.op_type}"
        return {
            "op_type": node.op_type,
            "domain": node.domain,
            "name": node.name,
            "doc": node.doc,
            "origins": list(node.origins),
            "inputs": [None if v is None else _name(v, scope, node.label) for v in node.inputs],
            "outputs": [self.value(v, scope) for v in node.outputs],
            "attributes": {
                name: self.encode(attr, scope, f"attribute {name!r} of {node.label}", f"{key}/{name}")
                for name, attr in node.attributes.items()
            },
        }

    def value(self, value: Value, scope: _Scope) -> dict[str, Any]:
        where, key = f"value {value.name!r}", f"init/{value.name}"
        return {
            "name": value.name,
            "dtype": value.dtype.name,
            "shape": None if value.shape is None else list(value.shape),
            "doc": value.doc,
            "origin": value.origin,
            "const": None if value.const is None else self.encode(value.const, scope, where, key),
        }

    def encode(self, item: Any, scope: _Scope, where: str, key: str) -> dict[str, Any]:
        """`item` tagged with its kind; a list holds items of one kind (an empty one is tagged "int")."""
        if type(item) is not list:
            kind = _kind(item, where)
            return {"kind": kind, "value": self.payload(kind, item, scope, where, key)}
        kinds = {_kind(x, where) for x in item}
        if len(kinds) > 1:
            raise GraphError(f"{where} is a list mixing {', '.join(sorted(kinds))}: only lists of one kind are stored")
        kind = kinds.pop() if kinds else "int"
        return {"kind": kind, "list": [self.payload(kind, x, scope, where, key) for x in item]}

    def payload(self, kind: str, item: Any, scope: _Scope, where: str, key: str) -> Any:
        if kind == "float":
            return item if math.isfinite(item) else "0x" + struct.pack(">d", item).hex()
        if kind == "str":
            return item if _is_utf8(item) else {"surrogatepass": _b64(item.encode("utf-8", "surrogatepass"))}
        if kind == "bytes":
            return _b64(item)
        if kind == "tensor":
            return self.tensor(item, where, key)
        if kind == "array":
            items = item.reshape(-1).tolist()
            _check_strings(item.dtype.kind, items, where)
            return {"dtype": item.dtype.str, "shape": list(item.shape), "items": self.encode(items, scope, where, key)}
        if kind == "graph":
            return self.graph(item, scope)
        if kind in _PROTOS:
            return _b64(item.SerializeToString())
        return item  # bool, int

    def tensor(self, tensor: torch.Tensor, where: str, base: str) -> dict[str, Any]:
        dtype = _DTYPE_NAMES.get(tensor.dtype)
        if dtype is None:
            raise GraphError(f"{where}: a tensor of torch dtype {tensor.dtype} cannot be stored")
        key, copy = base, 1
        while key in self.tensors:
            copy += 1
            key = f"{base}#{copy}"
        as_bytes = tensor.dtype in _AS_BYTES
        self.tensors[key] = tensor.contiguous().reshape(-1).view(torch.uint8) if as_bytes else tensor
        return {"key": key, "dtype": dtype, "shape": list(tensor.shape)}


class _Reader:
    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def graph(self, data: Any, outer: _Scope, where: str) -> Graph:
        where = f"{where} {_field(data, 'name', str, where)!r}"
        scope = outer.new_child()
        entries = _field(data, "values", list, where)
        values = [self.value(v, scope, f"{where}, values[{i}]") for i, v in enumerate(entries)]
        own = {value.name: value for value in values if value.name}
        # Every node output is declared before any input is resolved: nodes may come in any order.
        nodes = [self.declare(n, scope, f"{where}, node {i}") for i, n in enumerate(_field(data, "nodes", list, where))]
        graph = Graph(data["name"])
        graph.doc = _field(data, "doc", str, where)
        graph.inputs = [_resolve(n, own, f"{where}, input") for n in _field(data, "inputs", list, where)]
        graph.initializers = {
            n: _resolve(n, own, f"{where}, initializer") for n in _field(data, "initializers", list, where)
        }
        for entry, label, outputs in nodes:
            graph.append(self.node(entry, label, outputs, scope))
        graph.outputs = [_resolve(n, scope, f"{where}, output") for n in _field(data, "outputs", list, where)]
        return graph

    def declare(self, entry: Any, scope: _Scope, where: str) -> tuple[Mapping[str, Any], str, list[Value]]:
        """A node's entry, its label for errors, and its outputs (now defined in `scope`)."""
        label = f"{where} ({_field(entry, 'op_type', str, where)} {_field(entry, 'name', str, where)!r})"
        outputs = _field(entry, "outputs", list, label)
        return entry, label, [self.value(v, scope, f"{label}, output {i}") for i, v in enumerate(outputs)]

    def node(self, entry: Mapping[str, Any], label: str, outputs: list[Value], scope: _Scope) -> Node:
        names = _field(entry, "inputs", list, label)
        inputs = [None if n is None else _resolve(n, scope, f"{label}, input {i}") for i, n in enumerate(names)]
        attributes = {
            key: self.decode(attr, scope, f"{label}, attribute {key!r}")
            for key, attr in _field(entry, "attributes", Mapping, label).items()
        }
        domain = _field(entry, "domain", str, label)
        node = Node(entry["op_type"], inputs, outputs, attributes, domain=domain, name=entry["name"])
        node.doc = _field(entry, "doc", str, label)
        origins = _optional(entry, "origins", list, [], label)
        node.origins = tuple(_expect(name, str, f"{label}: origins[{i}]") for i, name in enumerate(origins))
        return node

    def value(self, data: Any, scope: _Scope, where: str) -> Value:
        name = _field(data, "name", str, where)
        where = f"{where} {name!r}"
        dtype = _field(data, "dtype", str, where)
        if dtype not in DType.__members__:
            raise GraphError(f"{where} has the unknown element type {dtype!r}")
        shape = _field(data, "shape", (list, type(None)), where)
        if shape is not None:
            shape = tuple(_expect(d, (int, str, type(None)), f"{where}: dim {i}") for i, d in enumerate(shape))
        const = _field(data, "const", (Mapping, type(None)), where)
        value = Value(name, DType[dtype], shape, None if const is None else self.decode(const, scope, where))
        value.doc = _field(data, "doc", str, where)
        value.origin = _optional(data, "origin", (str, type(None)), None, where)
        if name in scope.maps[0]:
            raise GraphError(f"{where} is defined twice")
        if name:
            scope.maps[0][name] = value
        return value

    def decode(self, data: Any, scope: _Scope, where: str) -> Any:
        kind = _field(data, "kind", str, where)
        if kind not in _KINDS:
            raise GraphError(f"{where} has the unknown kind {kind!r}")
        if "list" in data:
            items = _field(data, "list", list, where)
            return [self.payload(kind, item, scope, f"{where}[{i}]") for i, item in enumerate(items)]
        return self.payload(kind, _field(data, "value", object, where), scope, where)

    def payload(self, kind: str, payload: Any, scope: _Scope, where: str) -> Any:
        if kind in ("bool", "int"):
            return _expect(payload, bool if kind == "bool" else int, where)
        if kind == "float":
            if isinstance(payload, str) and _FLOAT_BITS.fullmatch(payload):
                return struct.unpack(">d", bytes.fromhex(payload[2:]))[0]
            return _expect(payload, float, f"{where} (a float, or its bits as '0x' and 16 hex digits)")
        if kind == "str":
            if isinstance(payload, Mapping):
                return _unb64(_field(payload, "surrogatepass", str, where), where).decode("utf-8", "surrogatepass")
            return _expect(payload, str, where)
        if kind == "bytes":
            return _unb64(payload, where)
        if kind == "tensor":
            return self.tensor(payload, where)
        if kind == "array":
            return self.array(payload, scope, where)
        if kind == "graph":
            return self.graph(payload, scope, f"{where}: graph")
        proto = _PROTOS[kind]()
        try:
            proto.ParseFromString(_unb64(payload, where))
        except DecodeError as err:
            raise GraphError(f"{where} is not a serialized {type(proto).__name__} ({err})") from None
        return proto

    def tensor(self, payload: Any, where: str) -> torch.Tensor:
        key = _field(payload, "key", str, where)
        dtype = _TORCH_DTYPES.get(_field(payload, "dtype", str, where))
        if dtype is None:
            raise GraphError(f"{where}: the tensor {key!r} has the unknown dtype {payload['dtype']!r}")
        shape = _sizes(payload, where)
        tensor = self.tensors.get(key)
        if not isinstance(tensor, torch.Tensor):
            raise GraphError(f"{where}: the tensor {key!r} is missing from the weights")
        as_bytes = dtype in _AS_BYTES
        stored = (torch.uint8, [math.prod(shape) * dtype.itemsize]) if as_bytes else (dtype, shape)
        if (tensor.dtype, list(tensor.shape)) != stored:
            raise GraphError(
                f"{where}: the tensor {key!r} in the weights is {tensor.dtype} {list(tensor.shape)}, "
                f"expected {stored[0]} {stored[1]}"
            )
        return tensor.contiguous().view(dtype).reshape(shape) if as_bytes else tensor

    def array(self, payload: Any, scope: _Scope, where: str) -> np.ndarray:
        dtype = _field(payload, "dtype", str, where)
        if not _ARRAY_DTYPE.fullmatch(dtype):
            raise GraphError(f"{where}: {dtype!r} is not the dtype of a numpy string or object array")
        shape = _sizes(payload, where)
        items = self.decode(_field(payload, "items", Mapping, where), scope, f"{where}, items")
        if not isinstance(items, list) or len(items) != math.prod(shape):
            raise GraphError(f"{where}: the items do not fill the shape {shape}")
        array = np.empty(len(items), dtype=np.dtype(dtype))
        _check_strings(array.dtype.kind, items, where)
        for index, item in enumerate(items):
            array[index] = item
        return array.reshape(shape)


def _kind(item: Any, where: str) -> str:
    kind = _SCALARS.get(type(item))
    if kind is not None:
        return kind
    if isinstance(item, torch.Tensor):
        return "tensor"
    if isinstance(item, np.ndarray) and item.dtype.kind in _STRING_ITEMS:
        return "array"
    if isinstance(item, Graph):
        return "graph"
    for kind, proto in _PROTOS.items():
        if type(item) is proto:
            return kind
    raise GraphError(
        f"{where} is a {type(item).__name__}, which cannot be stored: only bool, int, float, str, bytes, "
        "torch tensors, numpy string arrays, graphs, TypeProto, SparseTensorProto and lists of one of those"
    )


def _name(value: Value, scope: _Scope, where: str) -> str:
    """The name under which `value` is found in `scope`, or a `GraphError` when another value (or none) is."""
    if scope.get(value.name) is not value:
        raise GraphError(f"{where} reads the value {value.name!r}, which is not the one its scope defines by that name")
    return value.name


def _resolve(name: Any, scope: Mapping[str, Value], where: str) -> Value:
    value = scope.get(_expect(name, str, where))
    if value is None:
        raise GraphError(f"{where} names the value {name!r}, which is not defined in its scope")
    return value


def _check_strings(kind: str, items: list[Any], where: str) -> None:
    allowed = _STRING_ITEMS[kind]
    if not all(type(item) in allowed for item in items):
        names = " or ".join(t.__name__ for t in allowed)
        raise GraphError(f"{where}: a numpy array of dtype kind {kind!r} is stored only when it holds {names}")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any, where: str) -> bytes:
    try:
        return base64.b64decode(_expect(text, str, where), validate=True)
    except binascii.Error as err:
        raise GraphError(f"{where} is not base64 ({err})") from None


def _sizes(data: Any, where: str) -> list[int]:
    sizes = _field(data, "shape", list, where)
    if not all(_expect(size, int, f"{where}: shape") >= 0 for size in sizes):
        raise GraphError(f"{where} has a negative size in its shape {sizes}")
    return sizes


def _field(data: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """`data[key]`, which must be of `kind`; a `GraphError` naming `where` otherwise."""
    if not isinstance(data, Mapping):
        raise GraphError(f"{where} must be an object, got {reprlib.repr(data)}")
    if key not in data:
        raise GraphError(f"{where} has no {key!r}")
    return _expect(data[key], kind, f"{where}: {key!r}")


def _optional(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str) -> Any:
    """`data[key]` when present (it must be of `kind`), else `default`: fields that older files lack."""
    return _expect(data[key], kind, f"{where}: {key!r}") if key in data else default


def _expect(item: Any, kind: type | tuple[type, ...], where: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if any(isinstance(item, k) and not (k is int and isinstance(item, bool)) for k in kinds):
        return item
    expected = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
    raise GraphError(f"{where} must be {expected}, got {reprlib.repr(item)}")
