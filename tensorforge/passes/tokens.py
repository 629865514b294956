"""A feature map flattened into tokens, transposed before it is flattened:

    Transpose(Reshape(x, [N, C, H·W]), [0, 2, 1]) = Reshape(Transpose(x, [0, 2, 3, 1]), [0, -1, C])

for x of shape [N, C, H, W] with C known (the Reshape's 0 copies N, whatever it is at run time).

Why: a vision transformer's patch embedding (`x.flatten(2).transpose(1, 2)` after the patch convolution) exports
as the left side. Where the convolution writes channels_last (our CPU kernels, NHWC engines on CUDA) the right side
is two views of the same memory, [N, H·W, C] contiguous; the left side copied the map to flatten it and left the
tokens strided for the layers after. From an NCHW map either side makes one copy. The Reshape's computed target
(Shape → Slice → Concat from a dynamic-batch export) becomes a constant, and its computation dead code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir import Graph, Node, qualified_op
from .base import PassContext, Rule, RulePass
from .cleanup import transpose_perm
from .utils import add_initializer, is_graph_output, replace_node


@dataclass
class _Tokens:
    transpose: Node
    reshape: Node


class TransposeBeforeFlatten(Rule):
    """The module docstring's rewrite, at the Transpose."""

    name = "transpose-before-flatten"
    op_types = ("Transpose",)

    def match(self, node: Node, ctx: PassContext) -> _Tokens | None:
        if qualified_op(node) != "Transpose" or transpose_perm(node) != [0, 2, 1]:
            return None
        reshape = node.inputs[0].producer()
        if reshape is None or qualified_op(reshape) != "Reshape" or ctx.opset(reshape.domain) < 5:
            return None
        x, flat = reshape.inputs[0], reshape.outputs[0]
        if x.shape is None or len(x.shape) != 4 or flat.shape is None or len(flat.shape) != 3:
            return None
        if tuple(flat.shape[:2]) != tuple(x.shape[:2]):  # [N, C, H, W] → [N, C, H·W]
            return None
        return _Tokens(node, reshape)

    def check(self, match: _Tokens, ctx: PassContext) -> str | None:
        flat = match.reshape.outputs[0]
        if is_graph_output(flat) or len(flat.uses()) != 1:
            return "the flattened map is read elsewhere (the rewrite would compute it twice)"
        channels = match.reshape.inputs[0].shape[1]
        if not isinstance(channels, int):
            return f"the channel count {channels!r} is not known"
        return None

    def rewrite(self, match: _Tokens, ctx: PassContext) -> str:
        graph: Graph = ctx.model.graph
        x, out = match.reshape.inputs[0], match.transpose.outputs[0]
        n, c, h, w = x.shape
        pixels = ctx.new_value(x.name + "_nhwc", like=x)
        pixels.shape = (n, h, w, c)
        graph.append(Node("Transpose", [x], [pixels], {"perm": [0, 2, 3, 1]}, name=match.transpose.name))
        target = add_initializer(graph, ctx.new_value(out.name + "_shape"), torch.tensor([0, -1, c]))
        tokens = Node("Reshape", [pixels, target], [ctx.new_value(out.name, like=out)], name=match.reshape.name)
        replace_node(match.transpose, tokens)  # the users (and a graph output's name) move to the Reshape
        graph.remove(match.reshape)
        return f"transposed {x.name!r} before flattening it into tokens"


class ChannelsLastTokens(RulePass):
    """Transposes a feature map before flattening it into tokens, not after."""

    name = "channels-last-tokens"
    rules = (TransposeBeforeFlatten,)
