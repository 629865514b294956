"""`tensorforge::SqueezeExcite(X, W1, B1?, W2, B2?)`: a squeeze-and-excitation block (Hu et al. 2018) in one node.

    S = GlobalAveragePool(X)                                     [N, C, 1, 1]
    H = FusedConv(S, W1, B1; 1×1, pre = act1, pre_params = p1)   [N, R, 1, 1]
    G = FusedConv(H, W2, B2; 1×1, pre = act2, pre_params = p2)   [N, C, 1, 1]
    Y = Mul(X, G)                                                 X's shape, G broadcast over H×W

X is 4-D (N, C, H, W); W1 is [R, C, 1, 1] and W2 [C, R, 1, 1] (ungrouped, unit stride, no padding, so each
convolution is a product with a [N, C] matrix); `act1` / `act2` name activations from `fused.ACTIVATIONS`
("" for none). The reference evaluates exactly those four ops through the registry's own implementations, so a
fused graph computes what the original computed. The point of the node is the run time: MobileNetV3 and
EfficientNet gate every block this way, and on the CPU each of the four layers costs far more in per-call
overhead (a oneDNN call, a layer of the execution loop) than its few thousand multiply-adds.
"""

from __future__ import annotations

from .fused import DOMAIN, OPSET, fused_conv
from .pool import global_average_pool
from .registry import REGISTRY, OpContext, register

_MUL_OPSET = 14


@register("SqueezeExcite", since=OPSET, domain=DOMAIN)
def squeeze_excite(
    ctx: OpContext, x, w1, b1=None, w2=None, b2=None, *, act1="", act1_params=(), act2="", act2_params=()
):
    squeezed = global_average_pool(ctx, x)
    hidden = fused_conv(ctx, squeezed, w1, b1, pre=act1, pre_params=act1_params)
    gate = fused_conv(ctx, hidden, w2, b2, pre=act2, pre_params=act2_params)
    return REGISTRY.lookup("Mul", "", _MUL_OPSET).impl(ctx, x, gate)
