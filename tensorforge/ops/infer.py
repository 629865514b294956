"""Type and shape inference through the registry.

An op may register its own `infer(node, *input_values, **attributes) -> [(dtype, shape), ...]`. Every other
op is inferred by running its reference implementation on torch's `meta` device: inputs become meta tensors
of their declared dtype and shape, except small integer constants (shape-like operands such as Reshape's
target) and small constants at the positions the op reads as numbers (`HOST_INPUTS`: Resize's float scales),
which stay real so the implementation can read them. An op whose output shape depends on data it
cannot see (NonZero, a Reshape target computed at run time) or whose input shapes are not static is left
as ONNX shape inference annotated it at import.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import GraphError
from ..ir import DType, Graph, Model, Node, Shape, Value
from . import load_all
from .registry import HOST_INPUTS, REGISTRY, OpContext

_SMALL_CONST = 64
_META = torch.device("meta")


def infer_model(model: Model, *, check: bool = True) -> int:
    """Fill in dtype and shape of every value the registry can infer; return how many were filled.

    With `check`, a declared dtype that contradicts the inferred one raises `GraphError` naming the node.
    """
    load_all()
    return _infer_graph(model.graph, model, check)


def _infer_graph(graph: Graph, model: Model, check: bool) -> int:
    filled = 0
    for node in graph.nodes:
        results = infer_node(node, model.opset(node.domain))
        if results is None:
            continue
        for value, (dtype, shape) in zip(node.outputs, results, strict=False):
            if not value.name:
                continue
            filled += _merge(value, dtype, shape, node, check)
    return filled


def infer_node(node: Node, opset: int) -> list[tuple[DType, Shape | None]] | None:
    """The dtypes and shapes of `node`'s outputs, or None when they cannot be inferred statically."""
    op_def = REGISTRY.lookup(node.op_type, node.domain, opset)
    if op_def is None or any(True for _ in node.subgraphs()):
        return None
    if op_def.infer is not None:
        return op_def.infer(node, *node.inputs, **node.attributes)
    args = []
    host = HOST_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
    for index, value in enumerate(node.inputs):
        if value is None:
            args.append(None)
            continue
        arg = _meta_arg(value, index in host)
        if arg is None:
            return None
        args.append(arg)
    ctx = OpContext(node=node, opset=opset, device=_META, output_dtypes=tuple(v.dtype for v in node.outputs))
    try:
        with torch.inference_mode():
            result = op_def.impl(ctx, *args, **node.attributes)
    except Exception:  # data-dependent ops cannot run on meta tensors
        return None
    outputs = result if isinstance(result, tuple) else (result,)
    inferred = []
    for output in outputs:
        if not isinstance(output, torch.Tensor):
            inferred.append((DType.UNDEFINED, None))
        else:
            inferred.append((_dtype_of(output), tuple(int(d) for d in output.shape)))
    return inferred


def _meta_arg(value: Value, read_as_numbers: bool) -> Any:
    const = value.const
    if isinstance(const, torch.Tensor):
        small = const.numel() <= _SMALL_CONST and (read_as_numbers or not const.dtype.is_floating_point)
        return const if small else torch.empty(const.shape, dtype=const.dtype, device=_META)
    if const is not None or not value.is_static or not value.dtype.has_torch:
        return None
    return torch.empty(value.shape, dtype=value.dtype.torch, device=_META)


def _dtype_of(tensor: torch.Tensor) -> DType:
    try:
        return DType.from_torch(tensor.dtype)
    except TypeError:
        return DType.UNDEFINED


def _merge(value: Value, dtype: DType, shape: Shape | None, node: Node, check: bool) -> int:
    changed = 0
    if dtype != DType.UNDEFINED:
        declared = value.dtype
        if declared == DType.UNDEFINED:
            value.dtype, changed = dtype, 1
        elif check and declared.has_torch and declared.torch != dtype.torch:
            raise GraphError(f"{node.label}: output {value.name!r} is declared {declared} but the op produces {dtype}")
    if shape is not None and (value.shape is None or not value.is_static):
        if value.shape is None or len(value.shape) == len(shape):
            value.shape, changed = shape, 1
    return changed
