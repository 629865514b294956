"""Epilogue fusion: bias, activation and residual add after a convolution or matrix product, in one node.

Conv becomes `tensorforge::FusedConv(X, W, B?, Z?)` and Gemm / MatMul `tensorforge::FusedGemm(A, B, C?, Z?)`
(their semantics are in `tensorforge.ops.fused`):

    FusedConv:  Y = post(pre(Conv(X, W) + B) + Z)
    FusedGemm:  Y = post(pre(α·op(A) @ op(B) + β·C) + Z)

Fusion goes one follower at a time: the plain op becomes its fused form, then each rule absorbs the one
node (or the two-node pattern x·σ(x)) that reads the fused output, filling an empty slot — a bias `Add`
(before any activation), an activation into `pre`, a residual `Add` of the exact output shape into `Z`,
an activation after it into `post`. An intermediate read by anything else stays, so nothing is computed
twice and no result changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..ir import Graph, Node, Value
from ..ops.fused import DOMAIN
from .base import PassContext, Rule, RulePass
from .utils import add_initializer, attr, is_graph_output, replace_node, replace_with_fused

FUSED_CONV = f"{DOMAIN}::FusedConv"
FUSED_GEMM = f"{DOMAIN}::FusedGemm"
FUSED_OPS = (FUSED_CONV, FUSED_GEMM)

_FLT_MAX = 3.4028234663852886e38  # Clip's default bounds in opsets 6-10

# Activations of one node: op type → (fused name, parameter names with defaults).
_SIMPLE: dict[str, tuple[str, tuple[tuple[str, float], ...]]] = {
    "Relu": ("Relu", ()),
    "Sigmoid": ("Sigmoid", ()),
    "Tanh": ("Tanh", ()),
    "HardSwish": ("HardSwish", ()),
    "Mish": ("Mish", ()),
    "LeakyRelu": ("LeakyRelu", (("alpha", 0.01),)),
    "HardSigmoid": ("HardSigmoid", (("alpha", 0.2), ("beta", 0.5))),
    "Elu": ("Elu", (("alpha", 1.0),)),
}


@dataclass
class Activation:
    """An activation reading `source`: the nodes it consists of (the last one produces the result)."""

    nodes: list[Node]
    kind: str
    params: list[float]

    @property
    def output(self) -> Value:
        return self.nodes[-1].outputs[0]


@dataclass
class Absorb:
    """A follower of the fused node `fused`: the nodes it replaces and what the fused node becomes."""

    fused: Node
    followers: list[Node]
    inputs: list[Value | None]
    attributes: dict[str, Any]
    what: str
    reason: str | None = None


def _initializer(graph: Graph, value: Value | None) -> torch.Tensor | None:
    """The tensor of an initializer that is not also a graph input (a feed may override those)."""
    if value is None or not isinstance(value.const, torch.Tensor) or value in graph.inputs:
        return None
    return value.const


def _is_onnx(node: Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _slot(node: Node, index: int) -> Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _users(value: Value) -> list[Node]:
    return list(dict.fromkeys(user for user, _ in value.uses()))


# -- activations ------------------------------------------------------------------------------------------


def activation_of(node: Node, source: Value, ctx: PassContext) -> Activation | str | None:
    """The one-node activation `node` applied to `source`, the reason it cannot be fused, or None."""
    if node.inputs[:1] != (source,):
        return None
    if node.domain in ("", "ai.onnx") and node.op_type in _SIMPLE:
        kind, params = _SIMPLE[node.op_type]
        return Activation([node], kind, [float(attr(node, name, default)) for name, default in params])
    if node.op_type == "Gelu" and node.domain in ("", "ai.onnx", DOMAIN):
        approximate = attr(node, "approximate", "none")
        if approximate not in ("none", "tanh"):
            return f"Gelu approximate={approximate!r} is not a fused activation"
        return Activation([node], "Gelu" if approximate == "none" else "GeluTanh", [])
    if _is_onnx(node, "Clip"):
        bounds = _clip_bounds(node, ctx)
        return bounds if isinstance(bounds, str) else Activation([node], "Clip", bounds)
    return None


def _clip_bounds(node: Node, ctx: PassContext) -> list[float] | str:
    if ctx.opset() < 11:
        default = _FLT_MAX if ctx.opset() >= 6 else math.inf
        return [float(attr(node, "min", -default)), float(attr(node, "max", default))]
    bounds = []
    for index, default in ((1, -math.inf), (2, math.inf)):
        value = _slot(node, index)
        if value is None:
            bounds.append(default)
            continue
        tensor = _initializer(ctx.model.graph, value)
        if tensor is None or tensor.numel() != 1:
            return "activation parameter is not constant (Clip bound)"
        bounds.append(float(tensor.reshape(())))
    return bounds


def gated_activation(users: list[Node], source: Value, ctx: PassContext) -> Activation | None:
    """`x·g(x)` spelled out, the gate read only by the Mul: `x·Sigmoid(x)` = SiLU, `x·HardSigmoid(x)` with
    α = 1/6, β = 0.5 = HardSwish, `x·Tanh(Softplus(x))` = Mish. `users` must be exactly the gate's first
    node and the Mul."""
    if len(users) != 2:
        return None
    for gate, mul in (users, users[::-1]):
        if not _is_onnx(mul, "Mul") or gate.inputs[:1] != (source,) or len(gate.outputs) != 1:
            continue
        chain = [gate]
        if _is_onnx(gate, "Softplus"):
            follow = _users(gate.outputs[0])
            if len(follow) != 1 or not _is_onnx(follow[0], "Tanh") or is_graph_output(gate.outputs[0]):
                continue
            chain.append(follow[0])
        gated = chain[-1].outputs[0]
        if set(mul.inputs) != {source, gated} or _users(gated) != [mul] or is_graph_output(gated):
            continue
        if len(chain) == 2:
            return Activation([*chain, mul], "Mish", [])
        if _is_onnx(gate, "Sigmoid"):
            return Activation([gate, mul], "SiLU", [])
        if _is_onnx(gate, "HardSigmoid"):
            alpha, beta = float(attr(gate, "alpha", 0.2)), float(attr(gate, "beta", 0.5))
            if math.isclose(alpha, 1 / 6, rel_tol=1e-6) and math.isclose(beta, 0.5, rel_tol=1e-6):
                return Activation([gate, mul], "HardSwish", [])
    return None


# -- rules --------------------------------------------------------------------------------------------------


class ConvToFusedConv(Rule):
    """`Conv(X, W, B)` = `FusedConv(X, W, B)` with no activation and no residual."""

    name = "conv-to-fused-conv"
    op_types = ("Conv",)

    def match(self, node: Node, ctx: PassContext) -> Node | None:
        return node

    def rewrite(self, node: Node, ctx: PassContext) -> str:
        replace_with_fused(ctx, node, "FusedConv", list(node.inputs), dict(node.attributes))
        return "Conv as FusedConv"


class GemmToFusedGemm(Rule):
    """`Gemm(A, B, C)` = `FusedGemm(A, B, C)` with the same α, β, transA, transB."""

    name = "gemm-to-fused-gemm"
    op_types = ("Gemm",)

    def match(self, node: Node, ctx: PassContext) -> Node | None:
        return node

    def rewrite(self, node: Node, ctx: PassContext) -> str:
        attributes = {k: v for k, v in node.attributes.items() if k in ("alpha", "beta", "transA", "transB")}
        replace_with_fused(ctx, node, "FusedGemm", list(node.inputs), attributes)
        return "Gemm as FusedGemm"


class MatMulToFusedGemm(Rule):
    """`MatMul(A, B)` = `FusedGemm(A, B)` (α = β = 1, no transposes): for a layer, i.e. when B is a constant
    weight or the product's only reader adds a constant bias along its last axis."""

    name = "matmul-to-fused-gemm"
    op_types = ("MatMul",)

    def match(self, node: Node, ctx: PassContext) -> Node | None:
        graph = ctx.model.graph
        if _initializer(graph, node.inputs[1]) is not None:
            return node
        users = _users(node.outputs[0])
        if len(users) == 1 and not is_graph_output(node.outputs[0]):
            if _bias_of(users[0], node.outputs[0], -1, graph) is not None:
                return node
        return None

    def rewrite(self, node: Node, ctx: PassContext) -> str:
        replace_with_fused(ctx, node, "FusedGemm", list(node.inputs), {})
        return "MatMul as FusedGemm"


class _Absorb(Rule):
    """Shared machinery: a subclass recognizes its follower among the readers of the fused output and says
    what the fused node becomes; this class checks that the follower is the only reader and rewrites."""

    op_types = FUSED_OPS

    def follower(self, fused: Node, users: list[Node], ctx: PassContext) -> Absorb | None:
        """The absorption of a follower among `users` (all readers of the output), or None."""
        raise NotImplementedError

    def match(self, node: Node, ctx: PassContext) -> Absorb | None:
        out = node.outputs[0]
        users = _users(out)
        found = self.follower(node, users, ctx)
        if found is None or found.reason is not None:
            return found
        if is_graph_output(out):
            found.reason = "the intermediate is a graph output"
        elif not set(users) <= set(found.followers):
            found.reason = "the intermediate is used by another node"
        return found

    def check(self, match: Absorb, ctx: PassContext) -> str | None:
        return match.reason

    def rewrite(self, match: Absorb, ctx: PassContext) -> str:
        graph = ctx.model.graph
        fused, last = match.fused, match.followers[-1]
        out = last.outputs[0]
        inputs = list(match.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        new = Node(
            fused.op_type, inputs, [ctx.new_value(out.name, like=out)], match.attributes, domain=DOMAIN, name=fused.name
        )
        replace_node(last, new)
        for node in reversed(match.followers[:-1]):
            graph.remove(node)
        graph.remove(fused)
        return match.what


def _channel_axis(fused: Node) -> int:
    return 1 if fused.op_type == "FusedConv" else -1


def _bias_of(node: Node, source: Value, axis: int, graph: Graph) -> tuple[Value, torch.Tensor] | None:
    """When `node` is `Add(source, c)` (either order) with a constant `c` that broadcasts against `source`
    only along `axis`, the value `c` and its tensor."""
    if not _is_onnx(node, "Add") or source not in node.inputs[:2]:
        return None
    a, b = node.inputs[0], node.inputs[1]
    other = b if a is source else a
    tensor = _initializer(graph, other)
    if tensor is None or other is source or source.rank is None or tensor.dim() > source.rank:
        return None
    position = axis if axis < 0 else axis - source.rank  # counted from the end
    for index, dim in enumerate(reversed(tensor.shape)):
        if dim != 1 and -1 - index != position:
            return None
    along = tensor.shape[position] if tensor.dim() >= -position else 1
    channels = source.shape[position]
    if along != 1 and isinstance(channels, int) and along != channels:
        return None
    return other, tensor


class AbsorbBias(_Absorb):
    """`Fused(…) + c` = `Fused(…, B = c)` for a constant `c` along the output channels (FusedConv: axis 1,
    stored as a [C] vector; FusedGemm: the last axis, with β = 1), before any activation or residual."""

    name = "absorb-bias"

    def follower(self, fused: Node, users: list[Node], ctx: PassContext) -> Absorb | None:
        source = fused.outputs[0]
        graph = ctx.model.graph
        for user in users:
            bias = _bias_of(user, source, _channel_axis(fused), graph)
            if bias is None:
                continue
            value, tensor = bias
            found = Absorb(fused, [user], list(fused.inputs), dict(fused.attributes), "absorbed a bias Add")
            if _slot(fused, 2) is not None:
                found.reason = "the fused node already has the bias slot filled"
            elif attr(fused, "pre", "") or attr(fused, "post", "") or _slot(fused, 3) is not None:
                found.reason = "an activation or residual is already fused (the bias comes before them)"
            else:
                found.inputs[2:] = [self._bias_value(ctx, fused, value, tensor), None]
                if fused.op_type == "FusedGemm":
                    found.attributes["beta"] = 1.0
            return found
        return None

    @staticmethod
    def _bias_value(ctx: PassContext, fused: Node, value: Value, tensor: torch.Tensor) -> Value:
        """`value` itself when it is already a vector of the channels, else a new initializer holding one."""
        vector = tensor.reshape(-1)
        channels = fused.outputs[0].shape[_channel_axis(fused)]
        if vector.numel() == 1 and isinstance(channels, int):
            vector = vector.expand(channels)
        if tensor.dim() == 1 and vector.numel() == tensor.numel():
            return value
        return add_initializer(ctx.model.graph, ctx.new_value(value.name), vector.contiguous().clone())


class AbsorbActivation(_Absorb):
    """`act(Fused(…))` = `Fused(…, pre = act)` without a residual, `Fused(…, post = act)` after one.

    Recognized: Relu, Clip with constant bounds (Relu6), LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Elu,
    Tanh, Mish, Gelu (none / tanh), and spelled out: `x·Sigmoid(x)` = SiLU, `x·HardSigmoid(x)` with
    α = 1/6, β = 0.5 = HardSwish, `x·Tanh(Softplus(x))` = Mish.
    """

    name = "absorb-activation"

    def follower(self, fused: Node, users: list[Node], ctx: PassContext) -> Absorb | None:
        source = fused.outputs[0]
        activation: Activation | str | None = gated_activation(users, source, ctx)
        if activation is None:
            activation = next(filter(None, (activation_of(user, source, ctx) for user in users)), None)
        if activation is None:
            return None
        if isinstance(activation, str):
            return Absorb(fused, [], [], {}, "", activation)
        slot = "post" if _slot(fused, 3) is not None else "pre"
        found = Absorb(
            fused, activation.nodes, list(fused.inputs), dict(fused.attributes), f"absorbed {activation.kind} ({slot})"
        )
        if attr(fused, slot, "") or attr(fused, "post", ""):
            found.reason = f"the fused node already has the {slot} activation slot filled"
        else:
            found.attributes[slot] = activation.kind
            found.attributes[f"{slot}_params"] = activation.params
        return found


class AbsorbResidual(_Absorb):
    """`Fused(…) + Z` (either operand) = `Fused(…, Z)` when Z has exactly the output's shape (no broadcast)
    and does not itself depend on the fused output; a later activation then goes into `post`."""

    name = "absorb-residual"

    def follower(self, fused: Node, users: list[Node], ctx: PassContext) -> Absorb | None:
        source = fused.outputs[0]
        add = next((u for u in users if _is_onnx(u, "Add") and source in u.inputs[:2]), None)
        if add is None:
            return None
        a, b = add.inputs[0], add.inputs[1]
        residual = b if a is source else a
        found = Absorb(fused, [add], list(fused.inputs), dict(fused.attributes), "absorbed a residual Add")
        if _slot(fused, 3) is not None or attr(fused, "post", ""):
            found.reason = "the fused node already has the residual slot filled"
        elif problem := _shape_problem(source, residual):
            found.reason = problem
        elif residual is source or _depends_on(residual, fused):
            found.reason = "the residual would create a cycle (its producer depends on the fused output)"
        else:
            found.inputs += [None] * (3 - len(found.inputs))
            found.inputs[3:] = [residual]
        return found


def _shape_problem(source: Value, residual: Value) -> str | None:
    if source.dtype != residual.dtype:
        return f"residual dtype {residual.dtype} differs from the output's {source.dtype}"
    known = source.shape is not None and residual.shape is not None
    if not known or None in source.shape or None in residual.shape:
        return "residual broadcast does not fit: a shape is unknown"
    if tuple(source.shape) != tuple(residual.shape):
        return f"residual broadcast does not fit: {list(residual.shape)} against the output's {list(source.shape)}"
    return None


def _depends_on(value: Value, node: Node) -> bool:
    """Whether `value` is computed from an output of `node`."""
    seen: set[Node] = set()
    stack = [value.producer()]
    while stack:
        producer = stack.pop()
        if producer is None or producer in seen:
            continue
        if producer is node:
            return True
        seen.add(producer)
        stack.extend(v.producer() for v in producer.inputs if v is not None)
    return False


class FuseEpilogue(RulePass):
    """Conv → FusedConv and Gemm / MatMul → FusedGemm, then bias, activation and residual absorbed."""

    name = "fuse-epilogue"
    rules = (ConvToFusedConv, GemmToFusedGemm, MatMulToFusedGemm, AbsorbBias, AbsorbResidual, AbsorbActivation)
