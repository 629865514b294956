"""Quantized activations between quantized layers: a producer requantizes its output for the layers that read it.

For a QuantizedConv / QuantizedGemm P with float output Y (`y_scale` 0) whose every reader C_i is a quantized
layer of P's type reading Y as its input X with the same activation scale s:

    C_i(Y) = C_i'(Q_s(Y))    and    Q_s(Y) = P'(...)    with P' = P(y_scale = s)

where C_i' is C_i reading an already quantized input (`ops/fused.py`: no quantize of X) and P' writes `Q_s(Y)`
on the grid of its type. The quantized graph computes exactly what the unchained one does (both quantize the
same float32 Y with the same scale; a plan in float16 used to round Y to float16 first, it no longer does), and
the activation travels as int8 (or float8) bytes: a quarter of float32's, no quantizing in the consumer.

Calibration gives one scale per tensor, so readers of one tensor agree; the check verifies it and declines when
they do not (a model whose own Q/DQ quantize one tensor with different scales). Tensors stay float when
- Y is a graph output (the user gets real values),
- any reader is a float layer, or reads Y in another position than X or, for a QuantizedConv, the residual Z,
- the readers quantize to another type than P's,
- (when the build names the layers that run quantized in its tuned plan, `eligible`) P or a reader runs as
  its float original there: a float kernel would pay a dequantize or a quantize of its own.
The builder keeps a chained graph only when its plan times faster end to end (`build.builder`).

Residual streams (a second pass, after the first has chained what it can): when Y is also read as the residual Z
of QuantizedConv readers C_j, and at least one reader quantizes Y as its X with scale s,

    C_j(..., Z = Y) = C_j'(..., Z = Q_s(Y))    with C_j' adding Q_s(Y) · s (`z_scale` = s)

which rounds the residual onto the grid its X readers quantize it to anyway (the one approximation chaining
adds; the accuracy-target search measures it). Only readers that already read their X quantized take a
quantized Z: their float fallback then reads only quantized activations, which it dequantizes exactly. A
ResNet's block outputs, read by the next block's first convolution and added by its last, travel in int8.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ..ir import DType, Graph, Model, Node, Value, qualified_op
from ..ops.fused import DOMAIN, QUANT_TYPES
from .base import PassContext, Rule, RulePass, _label
from .manager import PassManager
from .utils import is_graph_output

QUANTIZED_LAYERS = (f"{DOMAIN}::QuantizedConv", f"{DOMAIN}::QuantizedGemm")


@dataclass
class _Chain:
    producer: Node
    output: Value
    readers: list[tuple[Node, int]]  # (node, input index)


def is_quantized_layer(node: Node) -> bool:
    return qualified_op(node) in QUANTIZED_LAYERS


class _RequantizeOutput(Rule):
    """What both chaining rules share: a quantized layer with a float output, declined where the output must stay
    float; the readers it may serve are each rule's own (`_serves`, `_reader_problem`)."""

    op_types = QUANTIZED_LAYERS

    def __init__(self, eligible: Collection[Node] | None = None) -> None:
        self.eligible = eligible  # None: every quantized layer may read and write quantized activations

    def _serves(self, readers: list[tuple[Node, int]]) -> bool:
        raise NotImplementedError

    def _reader_problem(self, reader: Node, index: int, output: Value, quant: str, scales: set[float]) -> str | None:
        """Why `reader` (reading `output` as input `index`) keeps it float; adds its input scale to `scales`."""
        raise NotImplementedError

    def match(self, node: Node, ctx: PassContext) -> _Chain | None:
        if node.attributes.get("y_scale", 0.0) or not node.outputs:
            return None
        output = node.outputs[0]
        readers = list(output.uses())
        return _Chain(node, output, readers) if self._serves(readers) else None

    def check(self, match: _Chain, ctx: PassContext) -> str | None:
        quant = match.producer.attributes.get("quant", "int8")
        if is_graph_output(match.output):
            return f"{match.output.name!r} is a graph output: it stays float"
        if match.output.dtype not in (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16, DType.UNDEFINED):
            return f"{match.output.name!r} is {match.output.dtype.name}, not a float activation"
        scales: set[float] = set()
        for reader, index in match.readers:
            problem = self._reader_problem(reader, index, match.output, quant, scales)
            if problem:
                return problem
        if not scales:
            return f"no quantized layer reads {match.output.name!r} as its input: the residual has no scale"
        if len(scales) > 1:
            return f"the readers of {match.output.name!r} quantize it with different scales {sorted(scales)}"
        if self.eligible is not None:
            for node in [match.producer, *(reader for reader, _ in match.readers)]:
                if node not in self.eligible:
                    return f"{node.label} runs as its float original in the tuned plan (it timed faster)"
        return None

    @staticmethod
    def _requantize(match: _Chain) -> tuple[str, float]:
        """P writes Q(Y) on its input readers' scale; returns (quantized type, scale)."""
        quant = match.producer.attributes.get("quant", "int8")
        scale = next(float(reader.attributes["x_scale"]) for reader, index in match.readers if index == 0)
        match.producer.attributes["y_scale"] = scale
        match.output.dtype = QUANT_TYPES[quant]
        return quant, scale


class RequantizeForReaders(_RequantizeOutput):
    """`C_i(P(...)) = C_i'(P(...; y_scale = s))` when every reader C_i of P's output quantizes it with scale s."""

    name = "requantize-for-readers"

    def _serves(self, readers: list[tuple[Node, int]]) -> bool:
        return any(is_quantized_layer(reader) and index == 0 for reader, index in readers)

    def _reader_problem(self, reader: Node, index: int, output: Value, quant: str, scales: set[float]) -> str | None:
        if not is_quantized_layer(reader):
            return f"{reader.label} ({reader.op_type}) reads {output.name!r} in float"
        if index != 0:
            return f"{reader.label} reads {output.name!r} as input {index} (a residual stays float)"
        kind = reader.attributes.get("quant", "int8")
        if kind != quant:
            return f"{reader.label} quantizes to {kind}, this layer's type is {quant}"
        scales.add(float(reader.attributes["x_scale"]))
        return None

    def rewrite(self, match: _Chain, ctx: PassContext) -> str:
        quant, scale = self._requantize(match)
        return f"writes {quant} (scale {scale:.6g}) for {len(match.readers)} quantized reader(s)"


class RequantizeResidualStream(_RequantizeOutput):
    """`C_j(..., Z = P(...)) = C_j'(..., Z = P(...; y_scale = s))` with C_j' taking `z_scale` = s, when P's readers
    quantize its output as X with scale s or add it as the residual of a QuantizedConv that reads X quantized."""

    name = "requantize-residual-stream"

    def _serves(self, readers: list[tuple[Node, int]]) -> bool:
        return any(reader.op_type == "QuantizedConv" and index == 3 for reader, index in readers)

    def _reader_problem(self, reader: Node, index: int, output: Value, quant: str, scales: set[float]) -> str | None:
        if not is_quantized_layer(reader):
            return f"{reader.label} ({reader.op_type}) reads {output.name!r} in float"
        if reader.attributes.get("quant", "int8") != quant:
            return f"{reader.label} quantizes to {reader.attributes.get('quant', 'int8')}, this layer's is {quant}"
        if index == 0:
            scales.add(float(reader.attributes["x_scale"]))
        elif index != 3 or reader.op_type != "QuantizedConv":
            return f"{reader.label} reads {output.name!r} as input {index}"
        elif reader.inputs[0].dtype != QUANT_TYPES[quant]:
            return f"{reader.label} adds {output.name!r} but reads its own input in float"
        return None

    def rewrite(self, match: _Chain, ctx: PassContext) -> str:
        quant, scale = self._requantize(match)
        residual_readers = [reader for reader, index in match.readers if index == 3]
        for reader in residual_readers:
            reader.attributes["z_scale"] = scale
        return f"writes {quant} (scale {scale:.6g}), the residual of {len(residual_readers)} layer(s)"


class ChainQuantizedLayers(RulePass):
    """Quantized layers hand quantized activations to quantized readers (see the module docstring); run after
    the quantization lowering and the Q/DQ fold, before tactics are chosen."""

    name = "chain-quantized-layers"
    rules = (RequantizeForReaders,)

    def __init__(self, eligible: Collection[Node] | None = None) -> None:
        self.rules = (functools.partial(RequantizeForReaders, eligible),)


class ChainResidualStreams(RulePass):
    """Quantized residuals for the quantized layers that already read their input quantized (see the module
    docstring); after `ChainQuantizedLayers`."""

    name = "chain-residual-streams"
    rules = (RequantizeResidualStream,)

    def __init__(self, eligible: Collection[Node] | None = None) -> None:
        self.rules = (functools.partial(RequantizeResidualStream, eligible),)


def chained_values(graph: Graph) -> list[str]:
    """The names of the values quantized layers pass to each other quantized."""
    return [node.outputs[0].name for node in graph.nodes if is_quantized_layer(node) and node.attributes.get("y_scale")]


def chain_quantized(
    model: Model, enabled: bool = True, eligible: Collection[Node] | None = None, residuals: bool = True
) -> tuple[Model, dict[str, Any] | None]:
    """`model` (or its restored copy, should the pass fail) with its quantized layers chained when `enabled`
    (only among the `eligible` nodes when given; quantized residual streams too unless `residuals` is False),
    and the build report's section: the values that travel quantized and, by producer, why the others between
    quantized layers stay float. None when the model has no quantized layer."""
    if not any(is_quantized_layer(node) for node in model.graph.nodes):
        return model, None
    if not enabled:
        return model, {"enabled": False, "chained": [], "float": {}}
    passes = [ChainQuantizedLayers(eligible), *([ChainResidualStreams(eligible)] if residuals else [])]
    model, report = PassManager(passes, max_iterations=1).run(model)
    chained = {_label(node) for node in model.graph.nodes if node.attributes.get("y_scale")}
    section = {
        "enabled": True,
        "chained": chained_values(model.graph),
        "quantized_residuals": [_label(node) for node in model.graph.nodes if node.attributes.get("z_scale")],
        "float": {event.node: event.detail for event in report.declined() if event.node not in chained},
    }
    failed = [event.detail for event in report.events if event.status == "failed"]
    if failed:
        section["failed"] = failed
    return model, section
