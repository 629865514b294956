"""`tensorforge::DepthwisePointwise(X, Wd, Bd?, Wp, Bp?, Z?)`: a depthwise convolution and the 1×1 convolution that
reads it, in one node (the body of a MobileNet-style block):

    H = FusedConv(X, Wd, Bd; group = C, strides, pads, dilations, auto_pad, pre = act, pre_params = act_params)
    Y = FusedConv(H, Wp, Bp, Z; 1×1, pre, pre_params, post, post_params)

X is 4-D (N, C, H, W), Wd [C, 1, KH, KW], Wp [K, C, 1, 1] (one group, unit stride, no padding); `act`, `pre` and
`post` name activations from `fused.ACTIVATIONS` ("" for none). The reference evaluates exactly those two
FusedConvs, so a fused graph computes what the original computed. The point of the node is the CPU kernel
(`kernels.cpu.depthwise_pointwise`), which keeps H, the widest tensor of the block, out of memory.
"""

from __future__ import annotations

from .fused import DOMAIN, OPSET, fused_conv
from .registry import OpContext, register


@register("DepthwisePointwise", since=OPSET, domain=DOMAIN)
def depthwise_pointwise(
    ctx: OpContext,
    x,
    wd,
    bd=None,
    wp=None,
    bp=None,
    z=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    pads=None,
    strides=None,
    act="",
    act_params=(),
    pre="",
    pre_params=(),
    post="",
    post_params=(),
):
    hidden = fused_conv(
        ctx, x, wd, bd, auto_pad=auto_pad, dilations=dilations, group=x.shape[1], pads=pads, strides=strides,
        pre=act, pre_params=act_params,
    )  # fmt: skip
    return fused_conv(ctx, hidden, wp, bp, z, pre=pre, pre_params=pre_params, post=post, post_params=post_params)
