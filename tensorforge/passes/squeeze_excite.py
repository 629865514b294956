"""Squeeze-and-excitation blocks as one node (CPU and CUDA builds).

    Mul(X, FusedConv(FusedConv(GlobalAveragePool(X), W1, B1; pre=a1), W2, B2; pre=a2))
        =  tensorforge::SqueezeExcite(X, W1, B1, W2, B2; act1=a1, act2=a2)

(the semantics are in `ops/squeeze_excite.py`). The pool may also be a ReduceMean over axes 2 and 3 that keeps
them. Both convolutions must be 1×1, ungrouped, unit-stride and unpadded, with constant weights and biases, no
residual and no `post` activation, and every intermediate (the pooled vector, the hidden layer, the gate) must
be read by the next node of the block only. Run after epilogue fusion, which folds the biases and the
activations (ReLU / SiLU, HardSigmoid / Sigmoid) into the two convolutions.

Four layers become one: on the CPU each of them costs a fixed few tens of microseconds per call (oneDNN's
descriptor set-up, the execution loop) for a few thousand multiply-adds, which made the blocks of MobileNetV3
and EfficientNet-B0 several times slower than their arithmetic. On CUDA at batch 1 the cost is launches: the
four layers were a pool (one or two kernels), two 1×1 convolutions on a 1×1 map and a broadcast product that
only the reference ran, four or five dependent kernels per block even replayed in one CUDA graph;
`triton.squeeze-excite` runs the node in two, `vendor.torch-squeeze-excite` in torch calls. The builder runs the
rule for CPU and CUDA builds (`pipeline.default_passes` given a device); the device-independent pipeline leaves
the blocks apart.
"""

from __future__ import annotations

from ..ir import Node, Value
from .base import PassContext, Rule, RulePass
from .patterns import (
    PatternMatch,
    _float_problem,
    _interior_problem,
    _producer,
    _replace_chain,
    _tensorforge_producer,
    reduce_axes,
)
from .utils import attr, constant


def _fused_conv(value: Value | None) -> Node | None:
    return _tensorforge_producer(value, "FusedConv")


def _pool(value: Value | None) -> Node | None:
    """The GlobalAveragePool, or ReduceMean over axes 2 and 3 keeping them, that produces `value`."""
    pool = _producer(value, "GlobalAveragePool")
    if pool is not None:
        return pool
    mean = _producer(value, "ReduceMean")
    if mean is None or mean.inputs[0].rank != 4 or not attr(mean, "keepdims", 1):
        return None
    axes = reduce_axes(mean)
    return mean if isinstance(axes, tuple) and sorted(a % 4 for a in axes) == [2, 3] else None


def _pointwise_problem(conv: Node, what: str, pre_only: bool = True) -> str | None:
    """Why `conv` is not a 1×1 product with a constant weight and bias (and, `pre_only`, only a `pre` activation:
    no residual, no `post`)."""
    a = conv.attributes
    weight = conv.inputs[1]
    if constant(weight) is None or weight.rank != 4 or tuple(weight.shape[2:]) != (1, 1):
        return f"the {what} convolution's weight is not a constant 1×1 kernel"
    if a.get("group", 1) != 1:
        return f"the {what} convolution is grouped"
    if any(s != 1 for s in a.get("strides") or ()) or any(d != 1 for d in a.get("dilations") or ()):
        return f"the {what} convolution is strided or dilated"
    if any(p != 0 for p in a.get("pads") or ()) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"the {what} convolution is padded"
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if bias is not None and constant(bias) is None:
        return f"the {what} convolution's bias is not a constant"
    if pre_only and len(conv.inputs) > 3 and conv.inputs[3] is not None:
        return f"the {what} convolution adds a residual"
    if pre_only and a.get("post", ""):
        return f"the {what} convolution has an activation after a residual"
    return None


class SqueezeExcitePattern(Rule):
    """`Mul(X, conv2(conv1(pool(X))))` = `SqueezeExcite(X, W1, B1, W2, B2)` (see the module)."""

    name = "squeeze-excite"
    op_types = ("Mul",)

    def match(self, node: Node, ctx: PassContext) -> PatternMatch | None:
        for x, gate in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            expand = _fused_conv(gate)
            reduce = _fused_conv(expand.inputs[0]) if expand is not None else None
            pool = _pool(reduce.inputs[0]) if reduce is not None else None
            if pool is not None and pool.inputs[0] is x:
                return PatternMatch([pool, reduce, expand, node], x, extra={"reduce": reduce, "expand": expand})
        return None

    def check(self, match: PatternMatch, ctx: PassContext) -> str | None:
        x, reduce, expand = match.x, match.extra["reduce"], match.extra["expand"]
        if x.rank != 4:
            return f"the gated tensor has rank {x.rank}, not 4"
        problem = _float_problem(x) or _interior_problem(match)
        problem = problem or _pointwise_problem(reduce, "reducing") or _pointwise_problem(expand, "expanding")
        if problem:
            return problem
        channels, hidden = x.shape[1], reduce.inputs[1].shape[0]
        if reduce.inputs[1].shape[1] != channels or tuple(expand.inputs[1].shape[:2]) != (channels, hidden):
            return "the convolutions do not map the gated tensor's channels back to themselves"
        if match.root.outputs[0].shape != x.shape:
            return "the product is not of the gated tensor's shape"
        return None

    def rewrite(self, match: PatternMatch, ctx: PassContext) -> str:
        reduce, expand = match.extra["reduce"], match.extra["expand"]

        def bias(conv: Node) -> Value | None:
            return conv.inputs[2] if len(conv.inputs) > 2 else None

        attributes = {
            "act1": reduce.attributes.get("pre", ""),
            "act1_params": list(reduce.attributes.get("pre_params", ())),
            "act2": expand.attributes.get("pre", ""),
            "act2_params": list(expand.attributes.get("pre_params", ())),
        }
        inputs = [match.x, reduce.inputs[1], bias(reduce), expand.inputs[1], bias(expand)]
        detail = f"{match.x.shape[1]} channels through {reduce.inputs[1].shape[0]}"
        name = match.root.name
        fused = _replace_chain(ctx, match, "SqueezeExcite", inputs, attributes)
        fused.name = name or fused.name  # the gating product's: the block's name in profiles
        return f"{detail} ({attributes['act1'] or 'linear'}, {attributes['act2'] or 'linear'})"


class FuseSqueezeExcite(RulePass):
    name = "fuse-squeeze-excite"
    rules = (SqueezeExcitePattern,)
