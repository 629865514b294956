"""The layers INT8 quantizes and the operands each one reads.

A quantizable layer is a Conv, ConvTranspose, Gemm or MatMul (or the fused FusedConv / FusedGemm) of the
top-level graph whose two multiplied operands are floats. A constant operand is a weight (quantized per
output channel); any other operand is an activation (quantized per tensor, with a calibrated scale; the input of
a depthwise convolution may be quantized per channel, `passes.utils.is_depthwise`). Bias
and residual inputs stay float: an INT8 kernel adds them after the int32 accumulation. A layer already fed by
DequantizeLinear (a model with Q/DQ of its own) is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GraphError
from ..ir import DType, Model, Node, Value, qualified_op
from .weights import output_channel_axis

QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "tensorforge::FusedConv", "tensorforge::FusedGemm")
FLOAT_TYPES = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)


@dataclass(frozen=True, slots=True)
class Operand:
    """Input `index` of a layer: a weight (constant, per-channel along `axis`) or an activation."""

    index: int
    value: Value
    is_weight: bool
    axis: int | None


@dataclass(frozen=True, slots=True)
class QuantLayer:
    node: Node
    name: str
    operands: tuple[Operand, ...]

    @property
    def activations(self) -> tuple[Value, ...]:
        return tuple(o.value for o in self.operands if not o.is_weight)

    @property
    def output(self) -> Value:
        return self.node.outputs[0]


def layer_name(node: Node) -> str:
    """How quantization names a layer: the node's name, or its first output's."""
    return node.name or next((v.name for v in node.outputs if v.name), node.op_type)


def quantizable_layers(model: Model) -> list[QuantLayer]:
    """The quantizable layers of `model`'s top-level graph, in graph order."""
    layers = []
    for node in model.graph.nodes:
        if qualified_op(node) not in QUANTIZABLE_OPS:
            continue
        operands = tuple(_operand(node, index) for index in (0, 1))
        if any(o is None for o in operands):
            continue
        layers.append(QuantLayer(node, layer_name(node), operands))
    names = [layer.name for layer in layers]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise GraphError(f"layers {duplicates} share a name: quantization needs unique node names")
    return layers


def _operand(node: Node, index: int) -> Operand | None:
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None or value.dtype not in FLOAT_TYPES:
        return None
    producer = value.producer()
    if producer is not None and producer.op_type == "DequantizeLinear":
        return None
    if value.is_const:
        return Operand(index, value, True, output_channel_axis(node, index, value.const.dim()))
    return Operand(index, value, False, None)
