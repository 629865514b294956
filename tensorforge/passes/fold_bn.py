"""BatchNormalization folding: a per-channel affine map after a linear layer goes into its weights.

An inference BatchNormalization is `y = s·x + t` per channel with `s = γ/√(σ²+ε)` and `t = β − μ·s`; a
`Mul` by a per-channel constant is the same map with `t = 0`, an `Add` of one with `s = 1`. Following a
layer `x = W ⊛ a + b` that is linear in its weight along the output channels (Conv, ConvTranspose, Gemm,
MatMul), the map folds into new weights:

    W' = W·s  (per output channel)        b' = b·s + t

For BatchNormalization this is `W' = W·γ/√(σ²+ε)` and `b' = (b − μ)·γ/√(σ²+ε) + β`. The folded tensors are
computed in float64 and stored as new initializers (a weight is never changed in place); MatMul has no bias
input, so a folded shift becomes an `Add` after it, which the epilogue fusion then absorbs.

A scalar scale before such a layer folds the same way, from the input side: `W ⊛ (x·c)` = `(W·c) ⊛ x`
(`FoldInputScale`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..ir import Graph, Node, Value
from .base import PassContext, Rule, RulePass
from .utils import add_initializer, attr, is_graph_output, is_shared, replace_node

LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class Layer:
    """The linear layer being folded into: its node, constant weight and bias (None when absent)."""

    node: Node
    weight: Value
    bias: Value | None

    @classmethod
    def of(cls, node: Node) -> Layer:
        return cls(node, node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None)

    @property
    def op(self) -> str:
        return self.node.op_type

    @property
    def output(self) -> Value:
        return self.node.outputs[0]

    def channels(self) -> int:
        """The number of output channels (features) of the layer."""
        w = self.weight.const
        if self.op == "Conv":
            return w.shape[0]
        if self.op == "ConvTranspose":
            return w.shape[1] * attr(self.node, "group", 1)
        if self.op == "Gemm":
            return w.shape[0] if attr(self.node, "transB", 0) else w.shape[1]
        return w.shape[-1]  # MatMul

    def output_rank(self) -> int | None:
        if self.op in ("Conv", "ConvTranspose"):
            return self.weight.const.dim()
        if self.op == "Gemm":
            return 2
        return self.output.rank

    def channel_axis(self) -> int:
        """The axis of the layer's output that holds the output channels (negative: from the end)."""
        rank = self.output_rank()
        assert rank is not None
        return 1 - rank if self.op in ("Conv", "ConvTranspose") else -1

    def scaled_weight(self, scale: torch.Tensor) -> torch.Tensor:
        """`W·s` along the output channels, in float64."""
        w = self.weight.const.double()
        if self.op == "Conv":
            return w * scale.reshape(-1, *[1] * (w.dim() - 1))
        if self.op == "ConvTranspose":
            group = attr(self.node, "group", 1)
            grouped = w.reshape(group, w.shape[0] // group, *w.shape[1:])
            factor = scale.reshape(group, 1, w.shape[1], *[1] * (w.dim() - 2))
            return (grouped * factor).reshape(w.shape)
        if self.op == "Gemm" and attr(self.node, "transB", 0):
            return w * scale.reshape(-1, 1)
        return w * scale  # output features on the last axis


@dataclass
class Affine:
    """`y = s·x + t` per channel after `layer`; `scale` / `shift` are float64 vectors or None (1 / 0)."""

    follower: Node
    layer: Layer | None
    scale: torch.Tensor | None
    shift: torch.Tensor | None
    reason: str | None = None  # set by match when the parameters themselves rule folding out


def _initializer(graph: Graph, value: Value | None) -> torch.Tensor | None:
    """The tensor of an initializer that is not also a graph input (a feed may override those)."""
    if value is None or not isinstance(value.const, torch.Tensor) or value in graph.inputs:
        return None
    return value.const


def _layer(value: Value) -> Node | None:
    producer = value.producer()
    if producer is None or producer.domain not in ("", "ai.onnx") or producer.op_type not in LAYER_OPS:
        return None
    return producer


def layer_problem(node: Node, graph: Graph) -> str | None:
    """Why the layer `node` cannot take a folded affine map into its weights, or None."""
    weight = node.inputs[1]
    tensor = _initializer(graph, weight)
    if tensor is None:
        return "weight is not constant"
    if not tensor.is_floating_point():
        return "weight is not floating point"
    if is_shared(weight):
        return "weight is shared with another node"
    if node.op_type == "MatMul" and tensor.dim() != 2:
        return "MatMul weight is not a 2-D matrix"
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None:
        if _initializer(graph, bias) is None:
            return "bias is not constant"
        if is_shared(bias):
            return "bias is shared with another node"
    output = node.outputs[0]
    if is_graph_output(output):
        return f"the {node.op_type} output is a graph output"
    if len(output.uses()) > 1:
        return f"the {node.op_type} output is used by another node"
    return None


def _per_channel(tensor: torch.Tensor, rank: int, axis: int, channels: int) -> torch.Tensor | str:
    """`tensor` as a float64 vector of `channels` values when it broadcasts against an output of `rank`
    only along `axis` (negative), else the reason it does not."""
    shape = tuple(tensor.shape)
    if len(shape) > rank:
        return f"constant of shape {list(shape)} broadcasts to a higher rank than the output's {rank}"
    for position, dim in enumerate(reversed(shape)):
        if dim != 1 and -1 - position != axis:
            return f"constant of shape {list(shape)} does not broadcast per channel"
    depth = -axis
    along = shape[-depth] if len(shape) >= depth else 1
    if along not in (1, channels):
        return f"constant of shape {list(shape)} does not match the {channels} output channels"
    return tensor.double().reshape(-1).expand(channels).clone() if along == 1 else tensor.double().reshape(-1)


class _FoldAffine(Rule):
    """Shared machinery: subclasses find `(s, t)` of their follower; the layer side is common."""

    commutative: ClassVar[bool] = False  # whether the layer may be either operand of the follower

    def candidate(self, node: Node, layer: Layer, graph: Graph) -> bool:
        """Whether `node` is this rule's follower at all (a Mul of two activations is not)."""
        return True

    def affine(self, node: Node, layer: Layer, ctx: PassContext) -> Affine:
        raise NotImplementedError

    def match(self, node: Node, ctx: PassContext) -> Affine | None:
        graph = ctx.model.graph
        sources = node.inputs[:2] if self.commutative else node.inputs[:1]
        producer = next((p for p in map(_layer, filter(None, sources)) if p is not None), None)
        if producer is None:
            return None
        layer = Layer.of(producer)
        if not self.candidate(node, layer, graph):
            return None
        weight = _initializer(graph, layer.weight)
        if weight is None or not weight.is_floating_point() or weight.dim() < 1:
            return Affine(node, layer, None, None, "weight is not constant")
        return self.affine(node, layer, ctx)

    def check(self, match: Affine, ctx: PassContext) -> str | None:
        return layer_problem(match.layer.node, ctx.model.graph) or match.reason

    def rewrite(self, match: Affine, ctx: PassContext) -> str:
        graph = ctx.model.graph
        layer, follower = match.layer, match.follower
        node, out = layer.node, follower.outputs[0]
        follower_inputs = list(follower.inputs)
        inputs = list(node.inputs)
        attributes = dict(node.attributes)
        weight = layer.weight.const
        if match.scale is not None:
            inputs[1] = _new_constant(ctx, layer.weight.name, layer.scaled_weight(match.scale).to(weight.dtype))
        bias = self._bias(layer, match, attributes)
        matmul_bias = None
        if bias is not None:
            dtype = layer.bias.const.dtype if layer.bias is not None else weight.dtype
            bias_value = _new_constant(ctx, f"{layer.output.name}_bias", bias.to(dtype))
            if layer.op == "MatMul":
                matmul_bias = bias_value
            else:
                inputs[2:] = [bias_value]
        if matmul_bias is None:
            folded = Node(node.op_type, inputs, [ctx.new_value(out.name, like=out)], attributes, name=node.name)
            replace_node(follower, folded)
        else:
            product = ctx.new_value(layer.output.name, like=layer.output)
            folded = graph.append(Node("MatMul", inputs, [product], attributes, name=node.name))
            add = Node("Add", [product, matmul_bias], [ctx.new_value(out.name, like=out)])
            replace_node(follower, add)
        graph.remove(node)
        for value in (layer.weight, layer.bias, *follower_inputs):
            _drop_unused(graph, value)
        target = node.name or layer.output.name
        extra = " and a bias Add" if matmul_bias is not None else ""
        return f"folded {follower.op_type} into {node.op_type} {target!r}{extra}"

    @staticmethod
    def _bias(layer: Layer, match: Affine, attributes: dict) -> torch.Tensor | None:
        """The new bias `b·s + t` (float64), or None when the layer keeps having none.

        Gemm: `s·(α·AB + β·C) + t = α·A(B·s) + 1·(β·C·s + t)`, so `beta` becomes 1.
        """
        bias = None if layer.bias is None else layer.bias.const.double()
        if bias is None and match.shift is None:
            return None
        if layer.op == "Gemm":
            if bias is not None:
                bias = bias * float(attributes.get("beta", 1.0))
            attributes["beta"] = 1.0
        if bias is None:
            return match.shift
        if match.scale is not None:
            bias = bias * match.scale
        return bias if match.shift is None else bias + match.shift


def _new_constant(ctx: PassContext, hint: str, tensor: torch.Tensor) -> Value:
    return add_initializer(ctx.model.graph, ctx.new_value(hint), tensor.contiguous())


def _drop_unused(graph: Graph, value: Value | None) -> None:
    """Delete the initializer `value` once nothing reads it (the weights a fold replaced)."""
    if value is None or value.uses() or value in graph.inputs or value in graph.outputs:
        return
    if graph.initializers.get(value.name) is value:
        del graph.initializers[value.name]


class FoldBatchNormalization(_FoldAffine):
    """`BN(W ⊛ x + b)` = `W' ⊛ x + b'` with `W' = W·γ/√(σ²+ε)` per output channel and
    `b' = (b − μ)·γ/√(σ²+ε) + β` (inference mode: only output 0, running statistics)."""

    name = "fold-batchnorm"
    op_types = ("BatchNormalization",)

    def affine(self, node: Node, layer: Layer, ctx: PassContext) -> Affine:
        graph = ctx.model.graph
        found = Affine(node, layer, None, None, _training_problem(node, ctx))
        params = [_initializer(graph, v) for v in node.inputs[1:5]]
        if found.reason is not None:
            return found
        if len(params) != 4 or any(p is None for p in params):
            found.reason = "BatchNormalization parameters are not constant"
            return found
        if layer.op == "MatMul" and layer.output.rank != 2:
            found.reason = "BatchNormalization normalizes axis 1, not MatMul's output features (last axis)"
            return found
        gamma, beta, mean, var = (p.double().reshape(-1) for p in params)
        channels = layer.channels()
        if any(p.numel() != channels for p in (gamma, beta, mean, var)):
            found.reason = f"BatchNormalization parameters do not have the layer's {channels} channels"
            return found
        epsilon = float(attr(node, "epsilon", 1e-5))
        found.scale = gamma / torch.sqrt(var + epsilon)
        found.shift = beta - mean * found.scale
        return found


def _training_problem(node: Node, ctx: PassContext) -> str | None:
    if attr(node, "training_mode", 0):
        return "BatchNormalization is in training mode (training_mode=1)"
    if any(out.name for out in node.outputs[1:]):
        return "BatchNormalization has training outputs"
    if ctx.opset() < 7 and not attr(node, "is_test", 0):
        return "BatchNormalization is in training mode (is_test=0)"
    if not attr(node, "spatial", 1):
        return "BatchNormalization has spatial=0 (per-element statistics)"
    return None


class FoldChannelMul(_FoldAffine):
    """`(W ⊛ x + b)·c` = `(W·c) ⊛ x + b·c` for a constant `c` that broadcasts only along the output
    channels ([C,1,1] or [1,C,1,1] after a convolution, [N] after Gemm / MatMul; a scalar too)."""

    name = "fold-channel-mul"
    op_types = ("Mul",)
    commutative = True

    def candidate(self, node: Node, layer: Layer, graph: Graph) -> bool:
        return _other_constant(node, layer.output, graph) is not None

    def affine(self, node: Node, layer: Layer, ctx: PassContext) -> Affine:
        vector = _vector(_other_constant(node, layer.output, ctx.model.graph), layer)
        if isinstance(vector, str):
            return Affine(node, layer, None, None, vector)
        return Affine(node, layer, vector, None)


class FoldChannelAdd(_FoldAffine):
    """`(W ⊛ x + b) + c` = `W ⊛ x + (b + c)` for a constant `c` that broadcasts only along the output
    channels. Not after MatMul, which has no bias input: MatMul + Add is the epilogue fusion's pattern."""

    name = "fold-channel-add"
    op_types = ("Add",)
    commutative = True

    def candidate(self, node: Node, layer: Layer, graph: Graph) -> bool:
        return layer.op != "MatMul" and _other_constant(node, layer.output, graph) is not None

    def affine(self, node: Node, layer: Layer, ctx: PassContext) -> Affine:
        vector = _vector(_other_constant(node, layer.output, ctx.model.graph), layer)
        if isinstance(vector, str):
            return Affine(node, layer, None, None, vector)
        return Affine(node, layer, None, vector)


def _other_constant(node: Node, value: Value, graph: Graph) -> torch.Tensor | None:
    """The constant operand of the binary `node` whose other operand is `value` (None if there is none)."""
    a, b = node.inputs[0], node.inputs[1]
    if a is value and b is value:
        return None
    return _initializer(graph, b if a is value else a)


def _vector(tensor: torch.Tensor, layer: Layer) -> torch.Tensor | str:
    """The constant as a per-channel float64 vector, or why it is not one."""
    if not tensor.is_floating_point():
        return "constant is not floating point"
    rank = layer.output_rank()
    if rank is None:
        return f"the {layer.op} output rank is unknown"
    return _per_channel(tensor, rank, layer.channel_axis(), layer.channels())


@dataclass
class _Distribute:
    mul: Node
    add: Node
    layer: Layer
    scale: torch.Tensor  # the Mul's constant, as given
    shift: torch.Tensor  # the Add's constant, as given


class DistributeChannelMul(Rule):
    """`((W ⊛ x) + b)·c` = `(W ⊛ x)·c + b·c` for per-channel constants b and c, so that `fold-channel-mul` can
    fold c into W: a MatMul has no bias input, so its bias is an Add that stands between it and a scale (a
    layer scale after a Linear, once `transposes.HoistThroughTranspose` has brought it next to the layer)."""

    name = "distribute-channel-mul"
    op_types = ("Mul",)

    def match(self, node: Node, ctx: PassContext) -> _Distribute | None:
        graph = ctx.model.graph
        for side in (0, 1):
            add = node.inputs[side].producer() if node.inputs[side] is not None else None
            scale = _initializer(graph, node.inputs[1 - side])
            if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or scale is None:
                continue
            for add_side in (0, 1):
                producer = _layer(add.inputs[add_side])
                shift = _initializer(graph, add.inputs[1 - add_side])
                if producer is not None and shift is not None:
                    return _Distribute(node, add, Layer.of(producer), scale, shift)
        return None

    def check(self, match: _Distribute, ctx: PassContext) -> str | None:
        between = match.add.outputs[0]
        if is_graph_output(between) or len(between.uses()) != 1:
            return "the bias Add's output is read elsewhere"
        for name, tensor in (("scale", match.scale), ("bias", match.shift)):
            if not tensor.is_floating_point():
                return f"the {name} is not floating point"
            vector = _vector(tensor, match.layer)
            if isinstance(vector, str):
                return f"the {name}: {vector}"
        return layer_problem(match.layer.node, ctx.model.graph)

    def rewrite(self, match: _Distribute, ctx: PassContext) -> str:
        graph = ctx.model.graph
        product, out = match.layer.output, match.mul.outputs[0]
        scaled = ctx.new_value(product.name, like=product)
        graph.append(Node("Mul", [product, _new_constant(ctx, "scale", match.scale)], [scaled]))
        shift = (match.shift.double() * match.scale.double()).to(match.shift.dtype)
        add = Node("Add", [scaled, _new_constant(ctx, "shift", shift)], [ctx.new_value(out.name, like=out)])
        bias_add = match.add
        replace_node(match.mul, add)
        graph.remove(bias_add)
        return f"distributed a channel Mul over the bias Add of {match.layer.op} {match.layer.node.name!r}"


_SHAPE_ONLY = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


@dataclass
class _InputScale:
    mul: Node
    source: Value  # the Mul's other operand, which the first reader after it reads instead
    scale_value: Value  # the constant operand
    scale: torch.Tensor  # its one element
    reader: Node  # the node that read the Mul's output: a shape-only node or the layer
    layer: Node


class FoldInputScale(Rule):
    """`W ⊛ (x·c) + b` = `(W·c) ⊛ x + b` for a scalar constant `c` (a dropout's downscaling kept at inference, as
    paddle2onnx writes it); the Mul may stand behind shape-only nodes (Reshape, Flatten, Squeeze, Unsqueeze), which
    commute with a scalar. The layer reads the scaled tensor as its data input (A of Gemm and MatMul, X of Conv
    and ConvTranspose: zero padding scales to zero), so the whole weight scales and the bias stays."""

    name = "fold-input-scale"
    op_types = LAYER_OPS

    def match(self, node: Node, ctx: PassContext) -> _InputScale | None:
        graph, reader, value = ctx.model.graph, node, node.inputs[0]
        producer = value.producer() if value is not None else None
        while producer is not None and producer.domain in ("", "ai.onnx") and producer.op_type in _SHAPE_ONLY:
            reader, value = producer, producer.inputs[0]
            producer = value.producer()
        if producer is None or producer.domain not in ("", "ai.onnx") or producer.op_type != "Mul":
            return None
        for side in (0, 1):
            scale = _initializer(graph, producer.inputs[1 - side])
            if scale is not None and scale.numel() == 1 and producer.inputs[side] is not producer.inputs[1 - side]:
                return _InputScale(producer, producer.inputs[side], producer.inputs[1 - side], scale, reader, node)
        return None

    def check(self, match: _InputScale, ctx: PassContext) -> str | None:
        if not match.scale.is_floating_point():
            return "the scale is not floating point"
        node = match.mul
        while node is not match.layer:  # the Mul's output and each shape-only node's are read by the next only
            value = node.outputs[0]
            if is_graph_output(value) or len(value.uses()) != 1:
                return f"{value.name!r} is read elsewhere"
            node = value.uses()[0][0]
        weight = _initializer(ctx.model.graph, match.layer.inputs[1])
        if weight is None or not weight.is_floating_point():
            return "weight is not a floating-point constant"
        if is_shared(match.layer.inputs[1]):
            return "weight is shared with another node"
        return None

    def rewrite(self, match: _InputScale, ctx: PassContext) -> str:
        graph, layer = ctx.model.graph, match.layer
        old_weight = layer.inputs[1]
        weight = old_weight.const
        scaled = (weight.double() * float(match.scale.reshape(()))).to(weight.dtype)
        layer.set_input(1, _new_constant(ctx, old_weight.name, scaled))
        match.reader.set_input(0, match.source)
        graph.remove(match.mul)
        for value in (old_weight, match.scale_value):
            _drop_unused(graph, value)
        return f"folded a scale of {float(match.scale.reshape(())):g} into {layer.op_type} {layer.name!r}"


class FoldBatchNorm(RulePass):
    """Folds BatchNormalization, per-channel Mul/Add constants after and scalar scales before Conv/ConvTranspose/
    Gemm/MatMul into them."""

    name = "fold-batchnorm"
    rules = (FoldBatchNormalization, FoldChannelMul, FoldChannelAdd, DistributeChannelMul, FoldInputScale)
