"""Blocks of a CPU build with our kernels for them: a depthwise convolution and the 1×1 convolution that reads it,
a squeeze-and-excitation block and the 1×1 convolution that reads it, and a classifier's head (global average pool,
flatten, product), each as one node.

    FusedConv(FusedConv(X, Wd, Bd; group = C, pre = a), Wp, Bp, Z; 1×1, pre = p, post = q)
        =  tensorforge::DepthwisePointwise(X, Wd, Bd, Wp, Bp, Z; act = a, pre = p, post = q)

    FusedConv(SqueezeExcite(X, W1, B1, W2, B2; act1, act2), Wp, Bp, Z; 1×1, pre = p, post = q)
        =  tensorforge::SqueezeExcitePointwise(X, W1, B1, W2, B2, Wp, Bp, Z; act1, act2, pre = p, post = q)

    FusedGemm(Flatten(GlobalAveragePool(X); axis = 1), B, C; transB, pre = p, post = q)
        =  tensorforge::PooledGemm(X, B, C; transB, pre = p, post = q)

    Flatten(FusedConv(GlobalAveragePool(X), W, B; 1×1, pre = p, post = q); axis = 1)
        =  tensorforge::PooledGemm(X, W[:, :, 0, 0], B; transB = 1, pre = p, post = q)

(the semantics are in `ops/depthwise_pointwise.py`, `ops/squeeze_excite_pointwise.py` and `ops/pooled_gemm.py`).
The depthwise convolution: constant weight [C, 1, KH, KW], group = C, any strides, padding and dilations, a
constant bias, one activation, no residual, and its output read by the 1×1 convolution only. The 1×1 convolution:
constant weight, one group, unit stride, no padding, constant bias, any epilogue. The squeeze-excite block's output
must be read by the 1×1 convolution only. The head's product: a constant weight, a constant bias over its columns,
no residual, alpha and beta 1, A not transposed; the pool's input 4-D, its and the flattening's outputs read by the
next node only. A head whose pooled features go through a 1×1 convolution first (PP-LCNet's, the orientation
classifier's) is the same product when the convolution has one group, no padding, a constant bias, no residual and
its output flattened to [N, channels] (a Flatten at axis 1, or a Reshape to that shape) by its only reader. Every
activation must be one the kernels have (`CpuKernels`, given by the builder). Run after epilogue and squeeze-excite
fusion.

The nodes exist for our CPU kernels: `kernels.cpu.depthwise_pointwise` computes a row of the depthwise output into a
buffer and the 1×1 row from it, so the block's widest tensor never goes to memory (1.10-1.31× the two kernels apart
on MobileNetV3's pairs, caches evicted between calls as in a network); for the squeeze-excite block the gate is
computed alone and the 1×1 kernel scales each image's weight rows by it (the gated tensor is never written); the
head's pool and product are one call of the 1×1 kernel (`PointwiseConv.pooled`). The builder runs the rules for CPU
builds whose tactic families include "cpu" on a CPU that runs the kernels (`pipeline.default_passes`); elsewhere the
nodes stay apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Node, Value
from .base import PassContext, Rule, RulePass
from .patterns import (
    PatternMatch,
    _float_problem,
    _interior_problem,
    _producer,
    _replace_chain,
    _tensorforge_producer,
)
from .squeeze_excite import _fused_conv, _pointwise_problem
from .utils import add_initializer, constant

_WINDOW_ATTRIBUTES = ("auto_pad", "dilations", "pads", "strides")
_EPILOGUE = ("pre", "pre_params", "post", "post_params")


@dataclass(frozen=True)
class CpuKernels:
    """The activations the CPU kernels for fused blocks evaluate: the 1×1 and depthwise convolutions' and the
    squeeze-excite gate's."""

    convolution: tuple[str, ...]
    gate: tuple[str, ...]


def _bias(conv: Node) -> Value | None:
    return conv.inputs[2] if len(conv.inputs) > 2 else None


def _depthwise_problem(conv: Node) -> str | None:
    """Why `conv` is not a depthwise convolution with a constant weight and bias and only a `pre` activation."""
    weight, a = conv.inputs[1], conv.attributes
    channels = conv.inputs[0].shape[1] if conv.inputs[0].rank == 4 else None
    if constant(weight) is None or weight.rank != 4 or weight.shape[1] != 1:
        return "the first convolution's weight is not a constant depthwise kernel [C, 1, KH, KW]"
    if a.get("group", 1) != channels or weight.shape[0] != channels:
        return f"the first convolution is not depthwise (group {a.get('group', 1)}, {channels} channels)"
    bias = _bias(conv)
    if bias is not None and constant(bias) is None:
        return "the depthwise convolution's bias is not a constant"
    if len(conv.inputs) > 3 and conv.inputs[3] is not None:
        return "the depthwise convolution adds a residual"
    if a.get("post", ""):
        return "the depthwise convolution has an activation after a residual"
    return None


class DepthwisePointwisePattern(Rule):
    """`FusedConv(FusedConv(X; depthwise); 1×1)` = `DepthwisePointwise` (see the module)."""

    name = "depthwise-pointwise"
    op_types = ("tensorforge::FusedConv",)

    def __init__(self, kernels: CpuKernels) -> None:
        self.activations = kernels.convolution

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        depthwise = _fused_conv(node.inputs[0])
        if depthwise is None or depthwise.attributes.get("group", 1) == 1:  # not grouped: no depthwise block
            return None
        return PatternMatch([depthwise, node], depthwise.inputs[0], extra={"depthwise": depthwise})

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        depthwise, pointwise = match.extra["depthwise"], match.root
        if match.x.rank != 4:
            return f"the input has rank {match.x.rank}, not 4"
        problem = _float_problem(match.x) or _interior_problem(match) or _depthwise_problem(depthwise)
        problem = problem or _pointwise_problem(pointwise, "1×1", pre_only=False)
        if problem:
            return problem
        return _missing_activation(
            (depthwise, ("pre",), self.activations), (pointwise, ("pre", "post"), self.activations)
        )

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        depthwise, weight = match.extra["depthwise"], match.extra["depthwise"].inputs[1]
        d = depthwise.attributes
        attributes = {key: d[key] for key in _WINDOW_ATTRIBUTES if key in d}
        attributes.update(act=d.get("pre", ""), act_params=list(d.get("pre_params", ())))
        detail = f"{weight.shape[0]} channels, {weight.shape[2]}×{weight.shape[3]}"
        detail += f", into {match.root.inputs[1].shape[0]}"
        _fuse_with_pointwise(ctx, match, "DepthwisePointwise", [match.x, weight, _bias(depthwise)], attributes)
        return detail


class SqueezeExcitePointwisePattern(Rule):
    """`FusedConv(SqueezeExcite(X); 1×1)` = `SqueezeExcitePointwise` (see the module)."""

    name = "squeeze-excite-pointwise"
    op_types = ("tensorforge::FusedConv",)

    def __init__(self, kernels: CpuKernels) -> None:
        self.kernels = kernels

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        block = _tensorforge_producer(node.inputs[0], "SqueezeExcite")
        if block is None:
            return None
        return PatternMatch([block, node], block.inputs[0], extra={"block": block})

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        block, pointwise = match.extra["block"], match.root
        problem = _float_problem(match.x) or _interior_problem(match)
        problem = problem or _pointwise_problem(pointwise, "1×1", pre_only=False)
        if problem:
            return problem
        return _missing_activation(
            (block, ("act1", "act2"), self.kernels.gate), (pointwise, ("pre", "post"), self.kernels.convolution)
        )

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        block = match.extra["block"]
        detail = f"{match.x.shape[1]} channels into {match.root.inputs[1].shape[0]}"
        head = [*block.inputs[:5], *([None] * (5 - len(block.inputs)))]
        _fuse_with_pointwise(ctx, match, "SqueezeExcitePointwise", head, dict(block.attributes))
        return detail


class PooledGemmPattern(Rule):
    """`FusedGemm(Flatten(GlobalAveragePool(X)))` = `PooledGemm` (see the module)."""

    name = "pooled-gemm"
    op_types = ("tensorforge::FusedGemm",)

    def __init__(self, kernels: CpuKernels) -> None:
        self.activations = kernels.convolution

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        flatten = _producer(node.inputs[0], "Flatten")
        pool = _producer(flatten.inputs[0], "GlobalAveragePool") if flatten is not None else None
        if pool is None:
            return None
        return PatternMatch([pool, flatten, node], pool.inputs[0], extra={"flatten": flatten})

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        gemm, a = match.root, match.root.attributes
        if match.x.rank != 4:
            return f"the pool's input has rank {match.x.rank}, not 4"
        if match.extra["flatten"].attributes.get("axis", 1) != 1:
            return "the flattening is not at axis 1"
        problem = _float_problem(match.x) or _interior_problem(match)
        if problem:
            return problem
        weight = gemm.inputs[1]
        if constant(weight) is None or weight.rank != 2:
            return "the product's weight is not a constant matrix"
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            return "the product has transA, alpha or beta"
        columns = weight.shape[0 if a.get("transB", 0) else 1]
        bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
        if bias is not None and (constant(bias) is None or tuple(bias.shape or ()) not in ((columns,), (1, columns))):
            return f"the product's bias is not a constant over its {columns} columns"
        if len(gemm.inputs) > 3 and gemm.inputs[3] is not None:
            return "the product adds a residual"
        return _missing_activation((gemm, ("pre", "post"), self.activations))

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        gemm = match.root
        attributes = {key: gemm.attributes[key] for key in ("transB", *_EPILOGUE) if key in gemm.attributes}
        bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
        _replace_named(ctx, match, "PooledGemm", [match.x, gemm.inputs[1], bias], attributes, gemm)
        return f"{match.x.shape[1]} channels into {gemm.outputs[0].shape[-1]}"


class PooledConvPattern(Rule):
    """`Flatten(FusedConv(GlobalAveragePool(X); 1×1))` = `PooledGemm` with the weight's [O, C] rows (see the
    module)."""

    name = "pooled-conv"
    op_types = ("tensorforge::FusedConv",)

    def __init__(self, kernels: CpuKernels) -> None:
        self.activations = kernels.convolution

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        pool = _producer(node.inputs[0], "GlobalAveragePool")
        if pool is None:
            return None
        uses = node.outputs[0].uses()
        reader = uses[0][0] if len(uses) == 1 and uses[0][1] == 0 else None
        if reader is None or reader.domain not in ("", "ai.onnx") or reader.op_type not in ("Flatten", "Reshape"):
            return PatternMatch([pool, node], pool.inputs[0], extra={"conv": node})
        return PatternMatch([pool, node, reader], pool.inputs[0], extra={"conv": node})

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        conv, a = match.extra["conv"], match.extra["conv"].attributes
        if match.x.rank != 4:
            return f"the pool's input has rank {match.x.rank}, not 4"
        problem = _float_problem(match.x) or _interior_problem(match)
        if problem:
            return problem
        weight = conv.inputs[1]
        if constant(weight) is None or weight.rank != 4 or tuple(weight.shape[2:]) != (1, 1):
            return "the convolution's weight is not a constant 1×1 kernel"
        if a.get("group", 1) != 1 or any(a.get("pads", ())):
            return "the convolution is grouped or padded"
        bias = _bias(conv)
        if bias is not None and constant(bias) is None:
            return "the convolution's bias is not a constant"
        if len(conv.inputs) > 3 and conv.inputs[3] is not None:
            return "the convolution adds a residual"
        flat = match.root.outputs[0].shape
        out = conv.outputs[0].shape
        if match.root is conv or match.root.attributes.get("axis", 1) != 1 or flat is None or out is None:
            return "the convolution's output is not flattened by its only reader"
        if len(flat) != 2 or list(flat) != list(out[:2]):
            return f"the convolution's output is reshaped to {list(flat)}, not [N, {out[1]}]"
        return _missing_activation((conv, ("pre", "post"), self.activations))

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        conv = match.extra["conv"]
        weight = constant(conv.inputs[1])
        rows = ctx.new_value(conv.inputs[1].name)
        add_initializer(ctx.model.graph, rows, weight.reshape(weight.shape[0], -1).contiguous())
        attributes = {"transB": 1, **{key: conv.attributes[key] for key in _EPILOGUE if key in conv.attributes}}
        _replace_named(ctx, match, "PooledGemm", [match.x, rows, _bias(conv)], attributes, conv)
        return f"{match.x.shape[1]} channels into {weight.shape[0]}"


def _expansion(value: Value) -> Node | None:
    """The 1×1 FusedConv that produces `value` (an expansion, if its checks pass), or None."""
    conv = _fused_conv(value)
    if conv is None or conv.inputs[1].rank != 4 or tuple(conv.inputs[1].shape[2:]) != (1, 1):
        return None
    return conv


class _ExpandRule(Rule):
    """What the two expansion rules share: the 1×1 expansion before the root (`_block_input` gives the root's
    input), its checks and the rewrite into one `ExpandDepthwise`."""

    def __init__(self, kernels: CpuKernels) -> None:
        self.activations = kernels.convolution

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        if not self._root(node):
            return None
        expand = _expansion(node.inputs[0])
        if expand is None:
            return None
        return PatternMatch([expand, node], expand.inputs[0], extra={"expand": expand})

    def _root(self, node: Node) -> bool:
        raise NotImplementedError

    def _expand_problem(self, match: PatternMatch) -> str | None:
        expand = match.extra["expand"]
        if match.x.rank != 4:
            return f"the input has rank {match.x.rank}, not 4"
        problem = _float_problem(match.x) or _interior_problem(match)
        problem = problem or _pointwise_problem(expand, "expansion", pre_only=True)
        return problem or _missing_activation((expand, ("pre",), self.activations))

    def _rewrite(self, ctx: PassContext, match: PatternMatch, depthwise: list, tail: list, attributes: dict) -> str:
        expand, root = match.extra["expand"], match.root
        a = expand.attributes
        attributes.update(expand_act=a.get("pre", ""), expand_act_params=list(a.get("pre_params", ())))
        detail = f"{match.x.shape[1]} channels expanded to {expand.inputs[1].shape[0]}"  # (before the chain goes)
        inputs = [match.x, expand.inputs[1], _bias(expand), *depthwise, *tail]
        _replace_named(ctx, match, "ExpandDepthwise", inputs, attributes, root)
        return detail


class ExpandDepthwisePointwisePattern(_ExpandRule):
    """`DepthwisePointwise(FusedConv(X; 1×1))` = `ExpandDepthwise` with its projection (see the module)."""

    name = "expand-depthwise-pointwise"
    op_types = ("tensorforge::DepthwisePointwise",)

    def _root(self, node: Node) -> bool:
        return True

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        return self._expand_problem(match)

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        root = match.root
        inputs = [*root.inputs, *([None] * (6 - len(root.inputs)))]
        return self._rewrite(ctx, match, inputs[1:3], inputs[3:6], dict(root.attributes))


class ExpandDepthwisePattern(_ExpandRule):
    """`FusedConv(FusedConv(X; 1×1); depthwise)` = `ExpandDepthwise` without a projection (see the module): the
    depthwise convolutions no 1×1 convolution could join, those before a squeeze-excite block."""

    name = "expand-depthwise"
    op_types = ("tensorforge::FusedConv",)

    def _root(self, node: Node) -> bool:
        return node.attributes.get("group", 1) != 1

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        depthwise = match.root
        problem = self._expand_problem(match) or _depthwise_problem(depthwise)
        return problem or _missing_activation((depthwise, ("pre",), self.activations))

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        depthwise = match.root
        d = depthwise.attributes
        attributes = {key: d[key] for key in _WINDOW_ATTRIBUTES if key in d}
        attributes.update(act=d.get("pre", ""), act_params=list(d.get("pre_params", ())))
        return self._rewrite(ctx, match, [depthwise.inputs[1], _bias(depthwise)], [], attributes)


def _missing_activation(*checks: tuple[Node, tuple[str, ...], tuple[str, ...]]) -> str | None:
    """The first activation a kernel lacks: `checks` are (node, its activation attributes, the kernel's names)."""
    for node, slots, names in checks:
        for slot in slots:
            if node.attributes.get(slot, "") not in names:
                return f"the kernel has no activation {node.attributes[slot]!r}"
    return None


def _fuse_with_pointwise(ctx: PassContext, match: PatternMatch, op_type: str, head: list, attributes: dict) -> None:
    """Replace the matched block with one `op_type` node: the first part's inputs (`head`) and attributes, then the
    1×1 convolution's weight, bias and residual and its epilogue; the node keeps the 1×1 convolution's name (the
    block's in profiles)."""
    pointwise = match.root
    attributes.update({key: pointwise.attributes[key] for key in _EPILOGUE if key in pointwise.attributes})
    residual = pointwise.inputs[3] if len(pointwise.inputs) > 3 else None
    _replace_named(ctx, match, op_type, [*head, pointwise.inputs[1], _bias(pointwise), residual], attributes, pointwise)


def _replace_named(
    ctx: PassContext, match: PatternMatch, op_type: str, inputs: list, attributes: dict, named: Node
) -> None:
    """`_replace_chain`, the fused node keeping `named`'s name (the block's in profiles) where it has one."""
    fused = _replace_chain(ctx, match, op_type, inputs, attributes)
    fused.name = named.name or fused.name


BLOCK_RULES = (DepthwisePointwisePattern, SqueezeExcitePointwisePattern, PooledGemmPattern, PooledConvPattern)
EXPANSION_RULES = (ExpandDepthwisePointwisePattern, ExpandDepthwisePattern)
RULES = BLOCK_RULES + EXPANSION_RULES


class FuseCpuBlocks(RulePass):
    name = "fuse-cpu-blocks"

    def __init__(self, kernels: CpuKernels) -> None:
        self.rules = tuple(lambda rule=rule: rule(kernels) for rule in BLOCK_RULES)


class FuseCpuExpansions(RulePass):
    """The expansions into the blocks `FuseCpuBlocks` made (a pass of its own, after it: a depthwise convolution
    joins its expansion only once no 1×1 convolution after it could join it instead)."""

    name = "fuse-cpu-expansions"

    def __init__(self, kernels: CpuKernels) -> None:
        self.rules = tuple(lambda rule=rule: rule(kernels) for rule in EXPANSION_RULES)
