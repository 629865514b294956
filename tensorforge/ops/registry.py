"""The op registry: for every (domain, op type, opset range), a torch reference implementation and
type/shape inference.

An implementation is a function `fn(ctx, *inputs, **attributes)`: inputs come positionally (a missing
optional input is `None`), attributes as keywords with the ONNX names, so the function's defaults are the
ONNX defaults. It returns one tensor or a tuple (an optional output not produced may be `None`).

    @register("Relu", since=6)
    def relu(ctx, x):
        return torch.relu(x)

Several registrations of one op with different `since` cover its opset history; the importer picks the
newest one not newer than the model's opset (like onnxscript's `@register(..., version=(12, None))`).
"""

from __future__ import annotations

import bisect
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import DType, Graph, Node, Shape, Value

Impl = Callable[..., Any]
InferFn = Callable[..., list[tuple[DType, Shape | None]]]


@dataclass(slots=True)
class OpContext:
    """What an implementation may know beyond its inputs and attributes."""

    node: Node
    opset: int
    device: torch.device
    run_subgraph: Callable[[Graph, Sequence[Any]], list[Any]] | None = None
    output_dtypes: tuple[DType, ...] = ()
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def output_present(self, index: int) -> bool:
        """Whether output `index` is requested (ONNX marks an unused optional output by an empty name)."""
        outputs = self.node.outputs
        return index < len(outputs) and bool(outputs[index].name)


# Inputs that implementations read as Python numbers (through `helpers.to_ints`): shape, axis, size and count
# operands. Kept on the host, reading them costs no device synchronization (which would also forbid CUDA
# graph capture). By op type (ONNX domain), input positions.
HOST_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Slice": (1, 2, 3, 4), "Expand": (1,),
    "Tile": (1, 2), "ConstantOfShape": (0,), "TopK": (1,), "Pad": (1, 3), "Trilu": (1,), "CumSum": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "Resize": (1, 2, 3), "CenterCropPad": (1,), "NonMaxSuppression": (2,),
}  # fmt: skip


@dataclass(slots=True)
class OpDef:
    """One registration: an op's semantics from opset `since` until the next registration."""

    op_type: str
    domain: str
    since: int
    impl: Impl
    infer: InferFn | None
    attributes: frozenset[str] | None  # None: the implementation takes any attribute

    def check_attributes(self, node: Node) -> list[str]:
        """Attributes of `node` this implementation does not know."""
        if self.attributes is None:
            return []
        return sorted(set(node.attributes) - self.attributes)


class OpRegistry:
    def __init__(self) -> None:
        self._defs: dict[tuple[str, str], list[OpDef]] = {}

    def add(self, op_def: OpDef) -> None:
        defs = self._defs.setdefault((_canonical(op_def.domain), op_def.op_type), [])
        if any(d.since == op_def.since for d in defs):
            raise ValueError(f"{op_def.op_type} since opset {op_def.since} is registered twice")
        bisect.insort(defs, op_def, key=lambda d: d.since)

    def lookup(self, op_type: str, domain: str, opset: int) -> OpDef | None:
        """The newest registration not newer than `opset`, or None."""
        defs = self._defs.get((_canonical(domain), op_type))
        if not defs:
            return None
        candidates = [d for d in defs if d.since <= opset]
        return candidates[-1] if candidates else None

    def known(self, op_type: str, domain: str) -> bool:
        return (_canonical(domain), op_type) in self._defs

    def op_types(self, domain: str = "") -> list[str]:
        return sorted(op for dom, op in self._defs if dom == _canonical(domain))

    def __iter__(self):
        for defs in self._defs.values():
            yield from defs


REGISTRY = OpRegistry()


def register(op_type: str, since: int = 1, *, domain: str = "", infer: InferFn | None = None) -> Callable[[Impl], Impl]:
    """Register `fn` as the reference implementation of `op_type` from opset `since`."""

    def decorate(fn: Impl) -> Impl:
        REGISTRY.add(OpDef(op_type, domain, since, fn, infer, _keyword_names(fn)))
        return fn

    return decorate


def _keyword_names(fn: Impl) -> frozenset[str] | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _canonical(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def input_dtype(value: Value | None) -> DType:
    return DType.UNDEFINED if value is None else value.dtype
