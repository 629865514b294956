"""Quantized engine layers: each calibrated FusedConv becomes a `tensorforge::QuantizedConv`, each FusedGemm
with a constant matrix weight a `tensorforge::QuantizedGemm`.

The activation scale comes from the calibration table (per tensor, int8: `amax / 127`; fp8 E4M3: `amax / 448`; per
channel for a depthwise convolution's input when the table has its channel ranges: then `x_scale` is 1 and the
layer's `Xs` input holds the channels' scales), the weight is quantized once per output channel (`weights.py`'s
scales, the same ones the Q/DQ simulation uses), so an engine of quantized layers computes what
`simulate_quantized` computes; with `residuals=True` the simulation also rounds the quantized residual streams that
`passes.quant_chain` forms afterwards, knowing the lowered layers from `engine_layers`. Other quantizable layers
(ConvTranspose, a FusedGemm with a computed or batched weight, transA, alpha or beta) stay float.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..ir import Model, Node, Value, qualified_op, validate
from ..kernels.quantize import KINDS, MIN_SCALE
from ..kernels.quantize import quantize_weight as kernels_quantize_weight
from ..ops.chain_rules import QuantizedLayer, layer_of
from ..ops.fused import DOMAIN, FLOAT_LAYERS, QUANT_ATTRIBUTES, QUANTIZED_DTYPES, dequantized_weight
from ..passes.base import PassContext
from ..passes.utils import add_initializer, is_depthwise, remove_unused_initializers, replace_with_fused
from .calibration import CalibrationTable
from .layers import QuantLayer, quantizable_layers

FUSED_CONV = f"{DOMAIN}::FusedConv"
FUSED_GEMM = f"{DOMAIN}::FusedGemm"
LOWERED_OPS = {FUSED_CONV: "QuantizedConv", FUSED_GEMM: "QuantizedGemm"}


@dataclass(frozen=True)
class Lowering:
    """What `quantize_layers` did: the layers it quantized and those it left float, each with the reason."""

    quantized: tuple[str, ...]
    left_float: dict[str, str]


def lowerable(layers: Iterable[QuantLayer]) -> dict[str, str]:
    """The quantizable layers that cannot become quantized engine layers, with the reason."""
    reasons = {}
    for layer in layers:
        reason = _gemm_problem(layer.node) if qualified_op(layer.node) == FUSED_GEMM else None
        if qualified_op(layer.node) not in (FUSED_CONV, FUSED_GEMM):
            reason = f"{qualified_op(layer.node)} has no quantized kernel yet"
        if reason:
            reasons[layer.name] = reason
    return reasons


def _gemm_problem(node: Node) -> str | None:
    a = node.attributes
    weight = node.inputs[1]
    if not weight.is_const or weight.rank != 2:
        return "a FusedGemm whose weight is not a constant matrix stays float"
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        return "a FusedGemm with transA, alpha or beta stays float"
    return None


def quantize_layers(
    model: Model, table: CalibrationTable, *, keep_float: Iterable[str] = (), quant: str = "int8"
) -> Lowering:
    """Rewrite, in place, every FusedConv of `model` that `quantizable_layers` lists and `keep_float` does not
    name into a QuantizedConv of type `quant` ("int8" or "fp8e4m3"), with the scales of `table`."""
    chosen, left = _selection(model, keep_float, quant)
    # Scales by the original value names, before rewriting renames any output.
    scales = {layer.name: layer_input_scale(table, layer, quant) for layer in chosen}
    outputs = {layer.name: output_scale(table, layer, quant) for layer in chosen}
    ctx = PassContext(model)
    for layer in chosen:
        _rewrite(ctx, layer, *scales[layer.name], quant, outputs[layer.name])
    remove_unused_initializers(model.graph)
    model.graph.sort()
    validate(model.graph)
    return Lowering(tuple(layer.name for layer in chosen), left)


def restore_float(model: Model, nodes: Iterable[Node]) -> list[str]:
    """Rewrite, in place, each QuantizedConv / QuantizedGemm of `nodes` that reads and writes float (no quantized
    input, output or residual; not prescribed by the model's own Q/DQ) back into the float FusedConv / FusedGemm it
    was made from, with its dequantized weight `Wq · Ws`: what a build's float fallback runs for it. Returns the
    names of the layers restored."""
    ctx = PassContext(model)
    graph = model.graph
    restored = []
    for node in list(nodes):
        a = node.attributes
        quantized_input = node.inputs[0] is not None and node.inputs[0].dtype in QUANTIZED_DTYPES
        if node.op_type not in FLOAT_LAYERS or quantized_input or a.get("explicit", 0):
            continue
        if a.get("y_scale", 0.0) or a.get("z_scale", 0.0):
            continue
        weight = dequantized_weight(node.op_type, node.inputs[1].const, node.inputs[4].const)
        w = add_initializer(graph, ctx.new_value(f"{node.name}.weight"), weight)
        inputs = [node.inputs[0], w, *(list(node.inputs[2:4]) + [None] * 2)[:2]]
        while inputs[-1] is None:
            inputs.pop()
        attributes = {k: v for k, v in a.items() if k not in QUANT_ATTRIBUTES}
        replace_with_fused(ctx, node, FLOAT_LAYERS[node.op_type], inputs, attributes)
        restored.append(node.name)
    remove_unused_initializers(graph)
    graph.sort()
    validate(graph)
    return restored


def engine_layers(
    model: Model, table: CalibrationTable, *, keep_float: Iterable[str] = (), quant: str = "int8"
) -> dict[Node, QuantizedLayer]:
    """The quantized layer each node of `model` is, or becomes when `quantize_layers` lowers `model` with these
    arguments, as the chaining rules see it (`ops.chain_rules`): the layers it would quantize, and the
    QuantizedConv / QuantizedGemm already there (a model's own Q/DQ). The model is left as it is."""
    chosen, _ = _selection(model, keep_float, quant)
    layers = {node: layer for node in model.graph.nodes if (layer := layer_of(node)) is not None}
    for layer in chosen:
        x_scale, channels = layer_input_scale(table, layer, quant)
        op = LOWERED_OPS[qualified_op(layer.node)]
        y_range = output_scale(table, layer, quant) if op == "QuantizedConv" else 0.0
        layers[layer.node] = QuantizedLayer(op, quant, x_scale, channels is not None, y_range)
    return layers


def _selection(model: Model, keep_float: Iterable[str], quant: str) -> tuple[list[QuantLayer], dict[str, str]]:
    """The layers `quantize_layers` quantizes, and those it leaves float with the reason."""
    if quant not in KINDS:
        raise InputError(f"unknown quantized type {quant!r}: choose from {sorted(KINDS)}")
    layers = quantizable_layers(model)
    keep = frozenset(keep_float)
    unknown = sorted(keep - {layer.name for layer in layers})
    if unknown:
        raise InputError(
            f"keep_float names unknown layers {unknown}; the quantizable layers are {[x.name for x in layers]}"
        )
    left = lowerable(layers)
    left.update({name: "kept in float" for name in keep})
    return [layer for layer in layers if layer.name not in left], left


def activation_scale(table: CalibrationTable, value: Value, quant: str) -> float:
    """The per-tensor scale a quantized layer of type `quant` quantizes `value` with."""
    scale = table.scale(value.name)  # raises, naming the tensor, when the table lacks it
    return scale if quant == "int8" else max(table.ranges[value.name].amax / KINDS[quant][1], MIN_SCALE)


def channel_scales(table: CalibrationTable, layer: QuantLayer, quant: str) -> torch.Tensor | None:
    """The per-channel scales `layer` quantizes its input with: a depthwise FusedConv whose input has channel
    ranges in `table`; else None (per tensor)."""
    if qualified_op(layer.node) != FUSED_CONV or not is_depthwise(layer.node):
        return None
    return table.channel_scales(layer.node.inputs[0].name, KINDS[quant][1])


def output_scale(table: CalibrationTable, layer: QuantLayer, quant: str) -> float:
    """The scale of `layer`'s output in `table` (0 when it was not calibrated), for chaining it as a residual."""
    return activation_scale(table, layer.output, quant) if layer.output.name in table.ranges else 0.0


def layer_input_scale(table: CalibrationTable, layer: QuantLayer, quant: str) -> tuple[float, torch.Tensor | None]:
    """(x_scale, Xs) of the QuantizedConv / QuantizedGemm `layer` becomes: per tensor (Xs None), or 1 and the
    per-channel scales."""
    channels = channel_scales(table, layer, quant)
    if channels is not None:
        return 1.0, channels
    return activation_scale(table, layer.node.inputs[0], quant), None


def quantize_weight(weight: torch.Tensor, quant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight `[Cout, ...]` quantized per output channel: the weight in `quant`'s type and float32 scales
    (`kernels.quantize`, the numbers the quantized kernels are tested with)."""
    return kernels_quantize_weight(weight, quant)


def _rewrite(
    ctx: PassContext, layer: QuantLayer, x_scale: float, channels: torch.Tensor | None, quant: str, y_range: float
) -> Node:
    if qualified_op(layer.node) == FUSED_GEMM:
        return _rewrite_gemm(ctx, layer, x_scale, quant)
    node = layer.node
    graph = ctx.model.graph
    weight = node.inputs[1]
    quantized, scales = quantize_weight(weight.const, quant)
    wq = add_initializer(graph, ctx.new_value(f"{layer.name}.{quant}_weight"), quantized)
    ws = add_initializer(graph, ctx.new_value(f"{layer.name}.weight_scale"), scales)
    inputs = list(node.inputs) + [None] * (4 - len(node.inputs))
    inputs = [inputs[0], wq, inputs[2], inputs[3], ws]
    if channels is not None:
        inputs.append(add_initializer(graph, ctx.new_value(f"{layer.name}.input_scale"), channels))
    attributes = {**node.attributes, "x_scale": float(x_scale), "quant": quant}
    if y_range:
        attributes["y_range_scale"] = float(y_range)
    return replace_with_fused(ctx, node, LOWERED_OPS[FUSED_CONV], inputs, attributes)


def _rewrite_gemm(ctx: PassContext, layer: QuantLayer, x_scale: float, quant: str) -> Node:
    node = layer.node
    graph = ctx.model.graph
    weight = node.inputs[1].const
    kn = weight.t() if node.attributes.get("transB", 0) else weight  # [K, N]
    quantized, scales = quantize_weight(kn.t(), quant)  # per output column: rows of [N, K]
    wq = add_initializer(graph, ctx.new_value(f"{layer.name}.{quant}_weight"), quantized.t().contiguous())
    ws = add_initializer(graph, ctx.new_value(f"{layer.name}.weight_scale"), scales)
    inputs = list(node.inputs) + [None] * (4 - len(node.inputs))
    kept = {k: v for k, v in node.attributes.items() if k in ("pre", "pre_params", "post", "post_params")}
    attributes = {**kept, "x_scale": float(x_scale), "quant": quant}
    return replace_with_fused(ctx, node, LOWERED_OPS[FUSED_GEMM], [inputs[0], wq, inputs[2], inputs[3], ws], attributes)
