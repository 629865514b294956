"""ONNX → IR: reads a model file (external data included), checks what it can, and builds a `Model`.

Local functions are inlined, `Constant` nodes holding a tensor become initializers, ONNX shape inference
seeds value types and shapes (symbolic dims stay strings), and subgraphs of `If`/`Loop`/`Scan` capture
outer values by reference.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx.inliner
import onnx.shape_inference
from google.protobuf.message import DecodeError

from ..errors import GraphError, ModelLoadError, UnsupportedError
from ..ir import DType, Graph, Model, Node, Shape, Value, validate
from ..ops.infer import infer_model
from ..tensors import from_numpy, from_proto
from .typecheck import check_types

MIN_OPSET = 1


def load_onnx(source: str | os.PathLike | bytes | onnx.ModelProto, *, base_dir: str | None = None) -> Model:
    """Import an ONNX model from a path, serialized bytes or a `ModelProto`."""
    proto, base_dir = _read(source, base_dir)
    return import_model(proto, base_dir=base_dir)


def import_model(proto: onnx.ModelProto, *, base_dir: str | None = None) -> Model:
    """Convert a parsed `ModelProto` (whose external data lives in `base_dir`) to a `Model`."""
    _check_model_proto(proto)
    opsets = {(entry.domain or ""): entry.version for entry in proto.opset_import}
    newest = onnx.defs.onnx_opset_version()
    default = opsets.get("", opsets.get("ai.onnx"))
    if default is not None and default > newest:
        raise UnsupportedError(
            f"the model needs opset {default} of the default domain; the installed onnx knows up to "
            f"{newest}. Upgrade onnx or export the model at a lower opset."
        )
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    proto = _infer_shapes(proto)
    graph = _GraphBuilder(base_dir).build(proto.graph, parent_scope=None)
    model = Model(
        graph,
        opsets,
        ir_version=proto.ir_version,
        producer=" ".join(p for p in (proto.producer_name, proto.producer_version) if p),
        metadata={p.key: p.value for p in proto.metadata_props},
    )
    model.doc = proto.doc_string
    validate(graph)
    check_types(model)
    infer_model(model, check=False)
    return model


def _read(source: Any, base_dir: str | None) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(source, onnx.ModelProto):
        return source, base_dir
    if isinstance(source, bytes | bytearray):
        return _parse(bytes(source), "<bytes>"), base_dir
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(f"model file {str(path)!r} does not exist")
    if path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is a directory, not an ONNX model file")
    proto = _parse(path.read_bytes(), str(path))
    return proto, base_dir or str(path.parent)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{where} is empty; expected an ONNX model (protobuf)")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise ModelLoadError(
            f"{where} is not a valid ONNX model: the protobuf does not parse ({err}). "
            "The file may be truncated or corrupt, or not an ONNX file at all."
        ) from None
    if proto.ir_version == 0 or not proto.HasField("graph"):
        raise ModelLoadError(
            f"{where} is not an ONNX model: it has no IR version or no graph "
            "(a truncated file or another format parsed as protobuf?)"
        )
    return proto


def _check_model_proto(proto: onnx.ModelProto) -> None:
    if not proto.HasField("graph"):
        raise ModelLoadError("the ONNX model has no graph")
    if not proto.opset_import and proto.ir_version >= 3:
        raise ModelLoadError("the ONNX model declares no opset_import; re-export it with an opset")


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX's own shape inference, as a hint: a model it cannot infer still imports."""
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return proto


class _Scope:
    __slots__ = ("parent", "values")

    def __init__(self, parent: _Scope | None) -> None:
        self.values: dict[str, Value] = {}
        self.parent = parent

    def lookup(self, name: str) -> Value | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            scope = scope.parent
        return None


class _GraphBuilder:
    def __init__(self, base_dir: str | None) -> None:
        self.base_dir = base_dir

    def build(self, gproto: onnx.GraphProto, parent_scope: _Scope | None) -> Graph:
        scope = _Scope(parent_scope)
        types = {vi.name: vi for vi in list(gproto.value_info) + list(gproto.input) + list(gproto.output)}
        graph = Graph(name=gproto.name or "graph")
        graph.doc = gproto.doc_string

        for init in gproto.initializer:
            value = self._value(init.name, types)
            value.const, value.dtype = self._tensor(init, f"initializer {init.name!r}")
            value.shape = tuple(init.dims)
            graph.initializers[init.name] = value
            scope.values[init.name] = value
        for sparse in gproto.sparse_initializer:
            name = sparse.values.name
            value = self._value(name, types)
            value.const, value.dtype = _sparse_to_dense(sparse, self.base_dir)
            value.shape = tuple(sparse.dims)
            graph.initializers[name] = value
            scope.values[name] = value
        for vi in gproto.input:
            value = scope.values.get(vi.name) or self._value(vi.name, types)
            if value.const is None or value.shape is None:
                value.shape = _shape(vi.type)
            scope.values[vi.name] = value
            graph.inputs.append(value)

        # Declare every node output first, so that inputs may refer to nodes listed later.
        pending = []
        for nproto in gproto.node:
            outputs = [self._value(name, types) if name else Value("") for name in nproto.output]
            for name, value in zip(nproto.output, outputs, strict=True):
                if name:
                    if name in scope.values:
                        raise GraphError(
                            f"value {name!r} is defined twice in graph {graph.name!r} "
                            f"(again by {nproto.op_type} node {nproto.name!r})"
                        )
                    scope.values[name] = value
            pending.append((nproto, outputs))

        for nproto, outputs in pending:
            if _is_constant_tensor(nproto) and outputs[0].name:
                self._constant_to_initializer(nproto, outputs[0], graph)
                continue
            inputs = [self._resolve(name, scope) if name else None for name in nproto.input]
            attributes = {a.name: self._attribute(a, scope, nproto) for a in nproto.attribute}
            node = Node(nproto.op_type, inputs, outputs, attributes, domain=nproto.domain, name=nproto.name)
            node.doc = nproto.doc_string
            graph.append(node)

        for vi in gproto.output:
            value = self._resolve(vi.name, scope)
            if value.shape is None:
                value.shape = _shape(vi.type)
            if value.dtype == DType.UNDEFINED:
                value.dtype = _elem_type(vi.type)
            graph.outputs.append(value)
        return graph

    def _resolve(self, name: str, scope: _Scope) -> Value:
        value = scope.lookup(name)
        # An undefined name becomes a value without producer; validation reports it with its user.
        return value if value is not None else Value(name)

    def _value(self, name: str, types: dict[str, onnx.ValueInfoProto]) -> Value:
        vi = types.get(name)
        if vi is None:
            return Value(name)
        return Value(name, _elem_type(vi.type), _shape(vi.type))

    def _tensor(self, proto: onnx.TensorProto, what: str) -> tuple[Any, DType]:
        try:
            return from_proto(proto, self.base_dir)
        except FileNotFoundError as err:
            raise ModelLoadError(
                f"{what}: external data file not found ({err.filename or err}); keep the data files "
                "beside the model or pass base_dir"
            ) from None
        except Exception as err:
            raise ModelLoadError(f"{what} cannot be read: {err}") from None

    def _constant_to_initializer(self, nproto: onnx.NodeProto, value: Value, graph: Graph) -> None:
        attr = nproto.attribute[0]
        tensor, dtype = self._tensor(attr.t, f"Constant node {nproto.name!r}")
        value.const, value.dtype, value.shape = tensor, dtype, tuple(attr.t.dims)
        graph.initializers[value.name] = value

    def _attribute(self, attr: onnx.AttributeProto, scope: _Scope, nproto: onnx.NodeProto) -> Any:
        kind = onnx.AttributeProto
        where = f"attribute {attr.name!r} of {nproto.op_type} node {nproto.name!r}"
        if attr.type == kind.GRAPH:
            return self.build(attr.g, scope)
        if attr.type == kind.GRAPHS:
            return [self.build(g, scope) for g in attr.graphs]
        if attr.type == kind.TENSOR:
            return self._tensor(attr.t, where)[0]
        if attr.type == kind.TENSORS:
            return [self._tensor(t, where)[0] for t in attr.tensors]
        if attr.type == kind.SPARSE_TENSOR:
            return _sparse_to_dense(attr.sparse_tensor, self.base_dir)[0]
        if attr.type == kind.STRING:
            return attr.s.decode("utf-8", errors="surrogateescape")
        if attr.type == kind.STRINGS:
            return [s.decode("utf-8", errors="surrogateescape") for s in attr.strings]
        if attr.type == kind.FLOATS:
            return [float(f) for f in attr.floats]
        if attr.type == kind.INTS:
            return [int(i) for i in attr.ints]
        if attr.type == kind.UNDEFINED:
            raise GraphError(f"{where} has no type")
        return onnx.helper.get_attribute_value(attr)


def _is_constant_tensor(nproto: onnx.NodeProto) -> bool:
    return (
        nproto.op_type == "Constant"
        and nproto.domain in ("", "ai.onnx")
        and len(nproto.attribute) == 1
        and nproto.attribute[0].name == "value"
        and len(nproto.output) == 1
    )


def _sparse_to_dense(sparse: onnx.SparseTensorProto, base_dir: str | None) -> tuple[Any, DType]:
    values = onnx.numpy_helper.to_array(sparse.values, base_dir or "")
    indices = onnx.numpy_helper.to_array(sparse.indices, base_dir or "").astype(np.int64)
    dense = np.zeros(int(np.prod(sparse.dims)), dtype=values.dtype)
    dims = tuple(sparse.dims)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), dims)
    dense[flat] = values
    return from_numpy(dense.reshape(dims)), DType(sparse.values.data_type)


def _elem_type(tproto: onnx.TypeProto) -> DType:
    if tproto.HasField("tensor_type"):
        return _dtype(tproto.tensor_type.elem_type)
    if tproto.HasField("sparse_tensor_type"):
        return _dtype(tproto.sparse_tensor_type.elem_type)
    return DType.UNDEFINED


def _dtype(number: int) -> DType:
    try:
        return DType(number)
    except ValueError:
        return DType.UNDEFINED


def _shape(tproto: onnx.TypeProto) -> Shape | None:
    if not tproto.HasField("tensor_type") or not tproto.tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in tproto.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return tuple(dims)
