"""`tensorforge::SqueezeExcitePointwise(X, W1, B1?, W2, B2?, Wp, Bp?, Z?)`: a squeeze-and-excitation block and the
1×1 convolution that reads it, in one node (the end of an EfficientNet / MobileNetV3 block):

    S = SqueezeExcite(X, W1, B1, W2, B2; act1, act1_params, act2, act2_params)     (`ops/squeeze_excite.py`)
    Y = FusedConv(S, Wp, Bp, Z; 1×1, pre, pre_params, post, post_params)

Wp is [K, C, 1, 1] (one group, unit stride, no padding). The reference evaluates exactly those two nodes. The point
of the node is the CPU kernel: it computes the gate alone and the 1×1 convolution scales each input channel by it
as it reads X, so the gated tensor, as wide as X, is never written and read back.
"""

from __future__ import annotations

from .fused import DOMAIN, OPSET, fused_conv
from .registry import OpContext, register
from .squeeze_excite import squeeze_excite


@register("SqueezeExcitePointwise", since=OPSET, domain=DOMAIN)
def squeeze_excite_pointwise(
    ctx: OpContext,
    x,
    w1,
    b1=None,
    w2=None,
    b2=None,
    wp=None,
    bp=None,
    z=None,
    *,
    act1="",
    act1_params=(),
    act2="",
    act2_params=(),
    pre="",
    pre_params=(),
    post="",
    post_params=(),
):
    gated = squeeze_excite(
        ctx, x, w1, b1, w2, b2, act1=act1, act1_params=act1_params, act2=act2, act2_params=act2_params
    )
    return fused_conv(ctx, gated, wp, bp, z, pre=pre, pre_params=pre_params, post=post, post_params=post_params)
