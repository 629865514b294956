"""`tensorforge::ExpandDepthwise(X, We, Be?, Wd, Bd?, Wp?, Bp?, Z?)`: a 1×1 expansion, the depthwise convolution
that reads it and, when Wp is given, the 1×1 projection after that, in one node (an inverted-residual block):

    E = FusedConv(X, We, Be; 1×1, pre = expand_act, pre_params = expand_act_params)
    D = FusedConv(E, Wd, Bd; group = Ce, strides, pads, dilations, auto_pad, pre = act, pre_params = act_params)
    Y = FusedConv(D, Wp, Bp, Z; 1×1, pre, pre_params, post, post_params)         (without Wp: Y = D)

X is 4-D (N, C, H, W), We [Ce, C, 1, 1], Wd [Ce, 1, KH, KW], Wp [K, Ce, 1, 1] (one group, unit stride, no padding);
the activations are names from `fused.ACTIVATIONS` ("" for none). The reference evaluates exactly those
FusedConvs. The point of the node is the CPU kernel (`kernels.cpu.expand_depthwise`), which never writes E, the
block's widest tensor.
"""

from __future__ import annotations

from .depthwise_pointwise import depthwise_pointwise
from .fused import DOMAIN, OPSET, fused_conv
from .registry import OpContext, register


@register("ExpandDepthwise", since=OPSET, domain=DOMAIN)
def expand_depthwise(
    ctx: OpContext,
    x,
    we,
    be=None,
    wd=None,
    bd=None,
    wp=None,
    bp=None,
    z=None,
    *,
    expand_act="",
    expand_act_params=(),
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
    expanded = fused_conv(ctx, x, we, be, pre=expand_act, pre_params=expand_act_params)
    window = {"auto_pad": auto_pad, "dilations": dilations, "pads": pads, "strides": strides}
    if wp is None:
        return fused_conv(ctx, expanded, wd, bd, group=expanded.shape[1], pre=act, pre_params=act_params, **window)
    return depthwise_pointwise(ctx, expanded, wd, bd, wp, bp, z, act=act, act_params=act_params, pre=pre,
                               pre_params=pre_params, post=post, post_params=post_params, **window)  # fmt: skip
