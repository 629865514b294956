"""Accuracy of an engine against ONNX Runtime (CPU) on the same inputs, output by output and layer by layer.

Every engine output is compared with ONNX Runtime's; with `layerwise`, so is every intermediate value the
engine computes that equals a value of the ONNX model (`Value.origin`, kept by the optimizer): ONNX Runtime
exposes those by running a copy of the model with them added as graph outputs. Per tensor the report gives
the max abs error, the max-norm relative error max|a − b| / max|b| (b: ONNX Runtime) and the cosine
similarity, and it names the first layer, in engine schedule order, whose output exceeds its tolerance.

A value's tolerance is that of the loosest precision among the layers it is computed from (fp32 1e-4,
fp16/tf32 5e-3, bf16 3e-2, as the builder's gate): an fp32 layer behind fp16 ones inherits their error
and must not be blamed for it. A quantized layer (or a layer norm writing its readers' quantized input) counts
as the precision of its type, `QUANTIZATION_TOLERANCE`. Values that are not floating point must match exactly.
`rtol` overrides all of these. A quantized activation (int8 or E4M3 between chained layers, `passes.quant_chain`)
is compared as the real values it stands for, Q(Y) · s: s is the y_scale of the layer that wrote it, or for a
value a max pool passes on quantized, that of the pool's input.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
import torch

from .errors import InputError, ModelLoadError
from .feeds import build_feeds
from .ir import Value, qualified_op
from .onnxruntime_session import open_session, providers_for
from .ops.chain_rules import is_quantized_layer
from .ops.executor import bind_feeds
from .ops.fused import QUANTIZED_DTYPES
from .runtime.engine import Engine
from .tactics.autotune import TOLERANCE
from .tactics.fallback import output_quantization
from .tensors import to_numpy

# What quantizing one layer costs in max-norm relative error against float, with some room: on ResNet-50 and the
# tests' small chains, int8 layers (per-channel weights, per-tensor activations) are 1-3% off, E4M3 ones 6-11%
# (three mantissa bits). A value behind them carries that much and is measured against it; a wrong weight or a
# wrong kernel is still far past it.
QUANTIZATION_TOLERANCE = {"int8": 5e-2, "fp8e4m3": 1.5e-1}


@dataclass
class TensorDiff:
    """How one engine value differs from the ONNX Runtime value it stands for."""

    name: str  # the engine's value
    original: str  # the ONNX model's value
    layer: int  # position of the producing layer in the schedule
    node: str  # the producing node's label
    precision: str  # the producing layer's precision
    tolerance: float
    is_output: bool
    shape: list[int] | None = None
    max_abs: float = math.nan
    rel: float = math.nan
    cosine: float = math.nan
    problem: str = ""  # why the tensors could not be compared (a shape mismatch, ...)

    @property
    def exceeds(self) -> bool:
        return bool(self.problem) or not self.rel <= self.tolerance  # NaN exceeds


@dataclass
class LayerRef:
    """A layer of the engine's schedule, with the original nodes it stands for."""

    position: int
    node: str
    op: str
    origins: list[str]


@dataclass
class Comparison:
    """The outcome of `compare`: every compared tensor in schedule order and the first layer that exceeds."""

    inputs: dict[str, list[int]]
    plan: int
    tensors: list[TensorDiff]
    first_exceeding: LayerRef | None = None
    # Layers feeding the first exceeding one whose outputs have no ONNX counterpart (a merged convolution
    # before its Split): the error may have started there.
    unchecked_upstream: list[LayerRef] = field(default_factory=list)

    @property
    def outputs(self) -> list[TensorDiff]:
        return [t for t in self.tensors if t.is_output]

    @property
    def ok(self) -> bool:
        """Whether every output is within its tolerance."""
        return not any(t.exceeds for t in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "inputs": self.inputs,
            "plan": self.plan,
            "first_exceeding": None if self.first_exceeding is None else asdict(self.first_exceeding),
            "unchecked_upstream": [asdict(layer) for layer in self.unchecked_upstream],
            "tensors": [{**asdict(t), "exceeds": t.exceeds} for t in self.tensors],
        }


def compare(
    onnx_path: str | os.PathLike[str],
    engine: Engine,
    *,
    files: Mapping[str, str | os.PathLike[str]] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    layerwise: bool = False,
    rtol: float | None = None,
    seed: int = 0,
) -> Comparison:
    """Run `engine` and ONNX Runtime on the same inputs (from `.npy` `files`, else random of `shapes` or the
    first profile's opt shapes) and compare them; see the module docstring."""
    if rtol is not None and not rtol >= 0:
        raise InputError(f"the relative tolerance must be a non-negative number, got {rtol}")
    graph = engine.model.graph
    given = {name: r.opt for name, r in engine.plans[0].profile.ranges.items()} | dict(shapes or {})
    feeds = build_feeds(engine.model, dict(files or {}), given, seed=seed)
    arrays = {v.name: to_numpy(feeds[v.name], v.dtype) for v in graph.inputs if v.name in feeds}
    index = engine.select_plan({name: tuple(array.shape) for name, array in arrays.items()})
    proto = _load_onnx(onnx_path)
    counterparts = _counterparts(engine, index, proto, onnx_path, layerwise)
    outputs = {v.name for v in graph.outputs}
    reference = _run_onnxruntime(proto, arrays, sorted(set(counterparts.values()) - outputs))

    schedule = engine.schedule(index)
    nodes = graph.nodes
    layer_of = {nodes[layer.node]: (position, layer) for position, layer in enumerate(schedule.layers)}
    tolerance = _tolerances(engine, index)
    diffs: list[TensorDiff] = []
    compared: set[Value] = set()

    def observe(value: Value, tensor: Any) -> None:
        """Measure each value as the engine writes it (nothing is kept but the numbers)."""
        original = counterparts.get(value)
        if original is None or not isinstance(tensor, torch.Tensor):
            return
        node = value.producer()
        position, layer = layer_of[node]
        scale = _real_scale(value)
        allowed = rtol if rtol is not None else tolerance[value] if value.dtype.is_float or scale else 0.0
        diff = TensorDiff(value.name, original, position, node.label, layer.precision, allowed, value.name in outputs)
        tensor = tensor.detach().cpu()
        tensor = tensor.double() * scale if scale else tensor.double() if tensor.is_floating_point() else tensor
        _measure(diff, tensor.numpy(), reference[original])
        diffs.append(diff)
        compared.add(value)

    bound = {v.name: t for v, t in bind_feeds(graph, feeds, engine.device).items()}
    schedule.execute(bound, observe=observe)
    comparison = Comparison({name: list(a.shape) for name, a in arrays.items()}, index, diffs)
    first = next((d for d in diffs if d.exceeds), None)
    if first is not None:
        comparison.first_exceeding = _layer_ref(engine, index, first.layer)
        comparison.unchecked_upstream = _unchecked_upstream(engine, index, first.layer, compared)
    return comparison


def tensor_error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float, float]:
    """(max |a − b|, max |a − b| / max |b|, cosine similarity) in float64; equal infinities count as equal,
    a NaN on either side makes the errors NaN."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(expected, dtype=np.float64).ravel()
    if a.size == 0:
        return 0.0, 0.0, 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(a == b, 0.0, np.abs(a - b))
        max_abs = float(diff.max())
        finite = np.abs(b[np.isfinite(b)])
        scale = float(finite.max()) if finite.size else 0.0
        rel = max_abs / scale if scale else max_abs
        norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
        if norms == 0:
            cosine = 1.0 if not a.any() and not b.any() else 0.0
        else:
            cosine = float(np.dot(a, b) / norms)
    return max_abs, rel, cosine


def _measure(diff: TensorDiff, actual: np.ndarray, expected: np.ndarray) -> None:
    diff.shape = list(actual.shape)
    if actual.shape != expected.shape:
        diff.problem = f"shape {list(actual.shape)}, ONNX Runtime's is {list(expected.shape)}"
        return
    if expected.dtype.kind not in "fiub":
        diff.problem = f"values of dtype {expected.dtype} are not compared"
        return
    diff.max_abs, diff.rel, diff.cosine = tensor_error(actual, expected)


def _counterparts(
    engine: Engine, index: int, proto: onnx.ModelProto, onnx_path: str | os.PathLike[str], layerwise: bool
) -> dict[Value, str]:
    """The engine values to compare, each with the name of its ONNX counterpart: the graph outputs by their
    names and, with `layerwise`, every layer output whose origin a node of the ONNX model computes."""
    graph = engine.model.graph
    outputs = {v.name for v in graph.outputs}
    missing = sorted(outputs - {o.name for o in proto.graph.output})
    if missing:
        raise InputError(
            f"the engine has outputs {missing} that {str(onnx_path)!r} does not: is it the model the engine was built "
            "from?"
        )
    computed = {name for node in proto.graph.node for name in node.output if name} if layerwise else set()
    nodes = graph.nodes
    found = {}
    for layer in engine.plans[index].layers:
        for value in nodes[layer.node].outputs:
            if value.name in outputs:
                found[value] = value.name
            elif value.origin in computed:
                found[value] = value.origin
    return found


def _real_scale(value: Value) -> float:
    """The scale s by which quantized `value` stands for real values, Q(Y) · s: the y_scale its producer wrote it
    with, or, for a value a max pool passes on quantized (`ops.chain_rules.THROUGH_MAX_POOL`), its input's; 0 for
    a value of real numbers."""
    node = value.producer()
    scale = output_quantization(node).get(node.outputs.index(value), (0.0, ""))[0]
    if scale or value.dtype not in QUANTIZED_DTYPES or qualified_op(node) != "MaxPool":
        return scale
    source = node.inputs[0]
    return _real_scale(source) if source.producer() is not None else 0.0


def _tolerances(engine: Engine, index: int) -> dict[Value, float]:
    """Each value's tolerance: that of the loosest precision among the layers it is computed from, a quantized
    layer's being its type's (`QUANTIZATION_TOLERANCE`)."""
    nodes = engine.model.graph.nodes
    loosest: dict[Value, float] = {}
    for layer in engine.plans[index].layers:
        node = nodes[layer.node]
        upstream = [loosest.get(v, 0.0) for v in node.inputs if v is not None]
        own = TOLERANCE.get(layer.precision, TOLERANCE["fp32"])
        if is_quantized_layer(node) or output_quantization(node):
            own = max(own, QUANTIZATION_TOLERANCE[node.attributes.get("quant", "int8")])
        tolerance = max([own, *upstream])
        for value in node.outputs:
            loosest[value] = tolerance
    return loosest


def _layer_ref(engine: Engine, index: int, position: int) -> LayerRef:
    node = engine.model.graph.nodes[engine.plans[index].layers[position].node]
    return LayerRef(position, node.name or node.label, qualified_op(node), list(node.origins))


def _unchecked_upstream(engine: Engine, index: int, position: int, compared: set[Value]) -> list[LayerRef]:
    """The layers whose outputs reach layer `position` only through values that were not compared."""
    layers = engine.plans[index].layers
    nodes = engine.model.graph.nodes
    at = {nodes[layer.node]: p for p, layer in enumerate(layers)}
    found: set[int] = set()
    stack = [v for v in nodes[layers[position].node].inputs if v is not None]
    while stack:
        value = stack.pop()
        producer = value.producer()
        if value in compared or producer not in at or at[producer] in found:
            continue
        found.add(at[producer])
        stack.extend(v for v in producer.inputs if v is not None)
    return [_layer_ref(engine, index, p) for p in sorted(found)]


def _load_onnx(path: str | os.PathLike[str]) -> onnx.ModelProto:
    try:
        return onnx.load(os.fspath(path))
    except FileNotFoundError:
        raise ModelLoadError(f"ONNX model {str(path)!r} does not exist") from None
    except Exception as err:  # protobuf's DecodeError and friends
        raise ModelLoadError(f"{str(path)!r} is not an ONNX model ({type(err).__name__}: {err})") from None


def _run_onnxruntime(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], extra: list[str]) -> dict[str, np.ndarray]:
    """ONNX Runtime's graph outputs and the intermediate values `extra`, by name, on the CPU."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
    inputs = {i.name for i in model.graph.input} - {init.name for init in model.graph.initializer}
    session = open_session(model, providers_for("cpu"))
    try:
        results = session.run(None, {name: array for name, array in feeds.items() if name in inputs})
    except Exception as err:  # ORT raises its own exception types
        raise InputError(
            f"ONNX Runtime could not run the model on the engine's inputs ({err}); is it the model the engine was "
            "built from?"
        ) from None
    return {o.name: np.asarray(r) for o, r in zip(session.get_outputs(), results, strict=True)}
