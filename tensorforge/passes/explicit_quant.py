"""Explicit quantization: the Q/DQ pairs of a quantized model (e.g. from ONNX Runtime's QDQ quantizer) fold
into the convolution that reads them.

    FusedConv(DQ(Q(X, s, 0), s, 0), DQ(Wq, Ws, 0), B, Z)  =  QuantizedConv(X, Wq, B, Z, Ws; x_scale = s)

for int8 (or float8e4m3fn) Q/DQ with zero points 0, a per-tensor activation scale and per-output-channel (axis 0) or
per-tensor weight scales: the fake-quantized convolution computed on its quantized values, which is what
QuantizedConv means (`ops/fused.py`). A depthwise convolution's input may be quantized per channel (axis 1, as
`quant.simulate` does it): it becomes the QuantizedConv's `Xs`, with x_scale 1. A bias behind its own
DequantizeLinear (an int32 bias) folds to a float constant. The model's other Q/DQ pairs (on outputs, around adds)
stay and run as the model says.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir import DType, Node, Value
from ..ops.fused import DOMAIN
from ..ops.quantize import dequantize
from .base import PassContext, Rule, RulePass
from .utils import add_initializer, constant, is_depthwise, replace_with_fused

_TYPES = {DType.INT8: "int8", DType.FLOAT8E4M3FN: "fp8e4m3"}


@dataclass
class _QuantizedConv:
    node: Node
    source: Value  # X, the float tensor the activation Q reads
    x_scale: torch.Tensor  # one scale, or one per input channel
    weight: torch.Tensor  # Wq
    weight_scale: torch.Tensor
    quant: str
    bias: Value | torch.Tensor | None


def _producer(value: Value | None, op_type: str) -> Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _zero(node: Node) -> bool:
    """Whether the node's zero point is absent or all zeros (constant)."""
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return True
    zero = constant(node.inputs[2])
    return zero is not None and not bool(zero.ne(0).any())


def _per_input_channel(node: Node, q: Node, dq: Node, scale: torch.Tensor) -> bool:
    """Whether `scale` quantizes the input of depthwise `node` per channel: one scale per channel, axis 1 on
    both the Q and the DQ."""
    rank = node.inputs[0].rank
    axes = {n.attributes.get("axis", 1) % rank for n in (q, dq)} if rank else set()
    return is_depthwise(node) and axes == {1} and scale.numel() == node.inputs[0].shape[1]


class FoldQDQIntoConv(Rule):
    """`FusedConv(DQ(Q(X, s, 0), s, 0), DQ(Wq, Ws, 0), B, Z)` = `QuantizedConv(X, Wq, B, Z, Ws; x_scale = s)`."""

    name = "fold-qdq-into-conv"
    op_types = (f"{DOMAIN}::FusedConv",)

    def match(self, node: Node, ctx: PassContext) -> _QuantizedConv | str | None:
        x_dq = _producer(node.inputs[0], "DequantizeLinear")
        w_dq = _producer(node.inputs[1], "DequantizeLinear")
        if x_dq is None or w_dq is None:
            return None
        x_q = _producer(x_dq.inputs[0], "QuantizeLinear")
        if x_q is None:
            return "the activation's DequantizeLinear does not read a QuantizeLinear"
        x_scale, q_scale = constant(x_dq.inputs[1]), constant(x_q.inputs[1])
        weight, weight_scale = constant(w_dq.inputs[0]), constant(w_dq.inputs[1])
        if x_scale is None or q_scale is None or weight is None or weight_scale is None:
            return "a scale or the quantized weight is not a constant"
        quant = _TYPES.get(x_dq.inputs[0].dtype)
        if quant is None or _TYPES.get(w_dq.inputs[0].dtype) != quant:
            return f"activation {x_dq.inputs[0].dtype} and weight {w_dq.inputs[0].dtype}: int8 or fp8e4m3 both"
        if not (_zero(x_q) and _zero(x_dq) and _zero(w_dq)):
            return "a zero point is not 0 (asymmetric quantization)"
        if not torch.equal(x_scale.reshape(-1), q_scale.reshape(-1)):
            return "the activation's Q and DQ scales differ"
        if x_scale.numel() != 1 and not _per_input_channel(node, x_q, x_dq, x_scale):
            return "the activation scale is neither per tensor nor per channel of a depthwise convolution's input"
        if x_q.attributes.get("saturate", 1) != 1 or x_q.attributes.get("block_size", 0):
            return "the activation quantization is blocked or does not saturate"
        channels = weight.shape[0]
        if weight_scale.numel() not in (1, channels) or (weight_scale.numel() > 1 and w_dq.attributes.get("axis", 1)):
            return "the weight scales are neither per tensor nor per output channel (axis 0)"
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        b_dq = _producer(bias, "DequantizeLinear")
        if b_dq is not None and all(constant(v) is not None for v in b_dq.inputs if v is not None):
            zero = constant(b_dq.inputs[2]) if len(b_dq.inputs) > 2 and b_dq.inputs[2] is not None else None
            axis = b_dq.attributes.get("axis", 1)
            bias = dequantize(constant(b_dq.inputs[0]), constant(b_dq.inputs[1]), zero, bias.dtype, axis=axis)
        scale = weight_scale.float().reshape(-1).expand(channels).contiguous()
        return _QuantizedConv(node, x_q.inputs[0], x_scale, weight, scale, quant, bias)

    def check(self, match: _QuantizedConv | str, ctx: PassContext) -> str | None:
        return match if isinstance(match, str) else None

    def rewrite(self, match: _QuantizedConv, ctx: PassContext) -> str:
        node, graph = match.node, ctx.model.graph
        hint = node.name or node.outputs[0].name
        weight = add_initializer(graph, ctx.new_value(f"{hint}.quantized_weight"), match.weight)
        scale = add_initializer(graph, ctx.new_value(f"{hint}.weight_scale"), match.weight_scale)
        bias = match.bias
        if isinstance(bias, torch.Tensor):
            bias = add_initializer(graph, ctx.new_value(f"{hint}.bias"), bias)
        inputs = list(node.inputs) + [None] * (4 - len(node.inputs))
        inputs = [match.source, weight, bias, inputs[3], scale]
        if match.x_scale.numel() == 1:
            x_scale = float(match.x_scale.reshape(()).item())
        else:
            x_scale = 1.0
            channels = match.x_scale.float().reshape(-1).contiguous()
            inputs.append(add_initializer(graph, ctx.new_value(f"{hint}.input_scale"), channels))
        attributes = {**node.attributes, "x_scale": x_scale, "quant": match.quant, "explicit": 1}
        replace_with_fused(ctx, node, "QuantizedConv", inputs, attributes)
        return f"{match.quant} Q/DQ folded into the convolution"


class FoldExplicitQuantization(RulePass):
    """The Q/DQ pairs of an explicitly quantized model fold into QuantizedConv (see the module docstring)."""

    name = "fold-explicit-quantization"
    rules = (FoldQDQIntoConv,)
