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
The builder keeps a chained graph only when its plan times faster end to end (`build.builder`). These conditions
are stated once, in `ops.chain_rules`, which the Q/DQ simulation of the accuracy-target search applies too.

Residual streams (a second pass, after the first has chained what it can): when Y is also read as the residual Z
of QuantizedConv readers C_j, and at least one reader quantizes Y as its X with scale s,

    C_j(..., Z = Y) = C_j'(..., Z = Q_s(Y))    with C_j' adding Q_s(Y) · s (`z_scale` = s)

which rounds the residual onto the grid its X readers quantize it to anyway (the one approximation chaining
adds; `quant.simulate_quantized(residuals=True)` rounds it too, so the accuracy-target search measures it).
When Y is only added (no reader quantizes it as X), s is Y's own calibrated scale (`y_range_scale`, which the
lowering sets from the calibration table), a second approximation of the same kind. An adder may read its own
X quantized or in float (quantizing it on load). A ResNet's block outputs, read by the next block's first
convolution and added by its last, travel in int8, and so does the output of a stage's first block's last
convolution, which its downsample convolution adds.

Through a max pool (with the input chains; exact): when P's one reader is a 2-D MaxPool whose readers all
quantize its output as X with scale s (int8),

    C_i(MaxPool(P(...))) = C_i'(MaxPool(P'(...)))    with P' = P(y_scale = s)

since the rounding is monotone and max commutes with it. ResNet's stem then writes int8, the pool pools int8,
and the first block's two convolutions read it.

From a layer norm (exact): when quantized layers C_i read a LayerNormalization's output as X with scale s,

    C_i(LayerNorm(X)) = C_i'(LayerNorm'(X)[0])    with LayerNorm' = LayerNorm(y_scale = s, quant)

(the `tensorforge` domain's norm; Y in float32, quantized as the readers would). Every other reader (a float
layer, a quantized layer adding Y as its residual, the graph's outputs) reads LayerNorm'(X)[1], Y itself, which
the norm writes beside Q_s(Y) from the same float32 result. A pre-norm transformer (ViT) then reads its QKV and
first feed-forward projections' input as int8 from the norm, which writes a quarter of the bytes float32 takes
and spares the products their quantize; a post-norm transformer's (BERT's) norms hand the next projection Q_s(Y)
and the residual add after it Y, in the type it had. (Rounding that residual onto the readers' grid instead, as
the convolutional streams do, saves the norm a store and cost BERT-base ten times quantization's own accuracy
loss: docs/design.md, "Rounded residual streams must be cheap in accuracy".)
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ..ir import Graph, Model, Node, Value, qualified_op
from ..ops.chain_rules import (
    FROM_LAYER_NORM,
    INPUT_CHAINS,
    LAYER_NORMS,
    QUANTIZED_LAYERS,
    RESIDUAL_STREAMS,
    THROUGH_MAX_POOL,
    Z_INPUT,
    ChainRule,
    ChainView,
    is_quantized_layer,
)
from ..ops.fused import DOMAIN, QUANT_TYPES
from .base import PassContext, Rule, RulePass, _label
from .manager import PassManager
from .utils import is_graph_output, replace_node, replace_with_fused


@dataclass
class _Chain:
    producer: Node
    output: Value
    readers: list[tuple[Node, int]]  # (node, input index)


class _RequantizeOutput(Rule):
    """What both chaining rules share: a quantized layer with a float output, declined where the output must stay
    float; which readers it may serve is each rule's own (`ops.chain_rules`, also the simulation's)."""

    op_types = QUANTIZED_LAYERS
    chain_rule: ChainRule

    def __init__(self, eligible: Collection[Node] | None = None) -> None:
        self.eligible = eligible  # None: every quantized layer may read and write quantized activations
        self.view = ChainView()  # the graph itself says what is quantized: the rewrites set y_scale and dtypes

    def match(self, node: Node, ctx: PassContext) -> _Chain | None:
        readers = self.chain_rule.candidate(node, self.view)
        return None if readers is None else _Chain(node, node.outputs[0], readers)

    def check(self, match: _Chain, ctx: PassContext) -> str | None:
        return self.chain_rule.problem(match.producer, match.readers, self.view, self.eligible)

    def _requantize(self, match: _Chain) -> tuple[str, float]:
        """P writes Q(Y) on its input readers' scale; returns (quantized type, scale)."""
        quant = match.producer.attributes.get("quant", "int8")
        scale = self.chain_rule.scale(match.producer, match.readers, self.view)
        match.producer.attributes["y_scale"] = scale
        match.output.dtype = QUANT_TYPES[quant]
        return quant, scale


class RequantizeForReaders(_RequantizeOutput):
    """`C_i(P(...)) = C_i'(P(...; y_scale = s))` when every reader C_i of P's output quantizes it with scale s."""

    name = "requantize-for-readers"
    chain_rule = INPUT_CHAINS

    def rewrite(self, match: _Chain, ctx: PassContext) -> str:
        quant, scale = self._requantize(match)
        return f"writes {quant} (scale {scale:.6g}) for {len(match.readers)} quantized reader(s)"


class RequantizeThroughMaxPool(_RequantizeOutput):
    """`C_i(MaxPool(P(...))) = C_i'(MaxPool(P(...; y_scale = s)))` when P's one reader is a max pool whose readers
    all quantize its output with scale s (int8): the pool pools the integers, exactly."""

    name = "requantize-through-max-pool"
    chain_rule = THROUGH_MAX_POOL

    def rewrite(self, match: _Chain, ctx: PassContext) -> str:
        quant, scale = self._requantize(match)
        pool = match.readers[0][0]
        pool.outputs[0].dtype = QUANT_TYPES[quant]
        readers = len(list(pool.outputs[0].uses()))
        return f"writes {quant} (scale {scale:.6g}) through {pool.label} for {readers} quantized reader(s)"


class RequantizeResidualStream(_RequantizeOutput):
    """`C_j(..., Z = P(...)) = C_j'(..., Z = P(...; y_scale = s))` with C_j' taking `z_scale` = s, when P's readers
    quantize its output as X with scale s or add it as the residual of a QuantizedConv that reads X quantized."""

    name = "requantize-residual-stream"
    chain_rule = RESIDUAL_STREAMS

    def rewrite(self, match: _Chain, ctx: PassContext) -> str:
        quant, scale = self._requantize(match)
        residual_readers = [reader for reader, index in match.readers if index == Z_INPUT]
        for reader in residual_readers:
            reader.attributes["z_scale"] = scale
        return f"writes {quant} (scale {scale:.6g}), the residual of {len(residual_readers)} layer(s)"


class QuantizeLayerNormOutput(_RequantizeOutput):
    """`C_i(LayerNorm(X)) = C_i'(LayerNorm(X; y_scale = s)[0])` for the readers C_i that quantize the norm's output
    as their input with scale s (`ops.chain_rules.FROM_LAYER_NORM`): the norm becomes the domain's, which takes
    `y_scale` and the readers' `quant` and, when anything else reads Y, writes Y as its second output for them."""

    name = "quantize-layer-norm-output"
    op_types = LAYER_NORMS
    chain_rule = FROM_LAYER_NORM

    def rewrite(self, match: _Chain, ctx: PassContext) -> str:
        quantized_readers = self.chain_rule.quantized_readers(match.readers, self.view, self.eligible)
        quant = self.view.layer(quantized_readers[0][0]).quant
        scale = self.chain_rule.scale(match.producer, quantized_readers, self.view)
        norm, y = match.producer, match.output
        attributes = {**norm.attributes, "y_scale": scale, "quant": quant}
        output = is_graph_output(y)
        others = len(match.readers) - len(quantized_readers) + output
        if not others:
            quantized = replace_with_fused(ctx, norm, "LayerNormalization", list(norm.inputs), attributes).outputs[0]
        else:
            quantized, copy = ctx.new_value(f"{y.name}_{quant}", like=y), ctx.new_value(y.name, like=y)
            both = Node("LayerNormalization", list(norm.inputs), [quantized, copy], attributes, domain=DOMAIN,
                        name=norm.name)  # fmt: skip
            replace_node(norm, both, {y: copy})
            if not output:  # (a graph output's name passes to `copy` in the rewiring)
                copy.name, y.name = y.name, copy.name
            for reader, index in quantized_readers:
                reader.set_input(index, quantized)
        quantized.dtype = QUANT_TYPES[quant]
        beside = f", and Y for {others} other reader(s)" if others else ""
        return f"writes {quant} (scale {scale:.6g}) for {len(quantized_readers)} quantized reader(s){beside}"


class ChainQuantizedLayers(RulePass):
    """Quantized layers hand quantized activations to quantized readers (see the module docstring); run after
    the quantization lowering and the Q/DQ fold, before tactics are chosen."""

    name = "chain-quantized-layers"
    rules = (RequantizeForReaders, RequantizeThroughMaxPool, QuantizeLayerNormOutput)

    def __init__(self, eligible: Collection[Node] | None = None) -> None:
        self.rules = tuple(functools.partial(rule, eligible) for rule in type(self).rules)


class ChainResidualStreams(RulePass):
    """Quantized residuals for the quantized layers that already read their input quantized (see the module
    docstring); after `ChainQuantizedLayers`."""

    name = "chain-residual-streams"
    rules = (RequantizeResidualStream,)

    def __init__(self, eligible: Collection[Node] | None = None) -> None:
        self.rules = tuple(functools.partial(rule, eligible) for rule in type(self).rules)


def chained_values(graph: Graph) -> list[str]:
    """The names of the values quantized layers (or layer norms) pass to quantized layers quantized."""
    return [
        node.outputs[0].name
        for node in graph.nodes
        if (is_quantized_layer(node) or qualified_op(node) in LAYER_NORMS) and node.attributes.get("y_scale")
    ]


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
