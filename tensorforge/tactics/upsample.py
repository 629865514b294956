"""Which Resize nodes are nearest upsampling by integer factors on H and W, the case the upsampling tactics take
(every output pixel copies input pixel (o_h // s_h, o_w // s_w))."""

from __future__ import annotations

from ..ir import Node

# (coordinate_transformation_mode, nearest_mode) pairs under which an integer upscale s maps output o to input
# o // s: asymmetric coordinates o / s floored; half-pixel ones (o + 0.5) / s - 0.5 lie strictly within half a
# step of o // s, so either rounding gives it.
_INTEGER_NEAREST = {
    ("asymmetric", "floor"),
    ("half_pixel", "round_prefer_floor"),
    ("half_pixel", "round_prefer_ceil"),
    ("pytorch_half_pixel", "round_prefer_floor"),
    ("pytorch_half_pixel", "round_prefer_ceil"),
}


def upsample_factors(node: Node, opset: int) -> tuple[int, int] | str:
    """The integer (H, W) factors of a nearest Resize that keeps N and C, or why there are none."""
    a = node.attributes
    if a.get("mode", "nearest") != "nearest":
        return f"nearest mode only; this Resize is {a.get('mode')!r}"
    if opset <= 10:
        rule = ("asymmetric", "floor")  # opset 10 floors when upsampling
    else:
        rule = (a.get("coordinate_transformation_mode", "half_pixel"), a.get("nearest_mode", "round_prefer_floor"))
    if rule not in _INTEGER_NEAREST:
        return f"coordinates {rule[0]!r} with rounding {rule[1]!r} do not map an output to output // factor"
    if a.get("axes") is not None or a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return "scales over all four axes (no `axes`), stretched, only"
    x = node.inputs[0]
    if x.rank != 4:
        return f"4-D inputs only; the input has rank {x.rank}"
    scales = node.inputs[1] if opset <= 10 else (node.inputs[2] if len(node.inputs) > 2 else None)
    sizes = node.inputs[3] if opset > 10 and len(node.inputs) > 3 else None
    if scales is not None and scales.is_const and scales.const.numel():
        factors = [float(v) for v in scales.const.reshape(-1).tolist()][-4:]
    elif sizes is not None and sizes.is_const and x.shape and all(isinstance(d, int) and d > 0 for d in x.shape[2:]):
        wanted = [int(v) for v in sizes.const.reshape(-1).tolist()][-2:]
        factors = [1.0, 1.0, *(o / i for o, i in zip(wanted, x.shape[2:], strict=True))]
    else:
        return "constant scales (or constant sizes of a static input) only"
    if len(factors) != 4 or factors[:2] != [1.0, 1.0] or not all(f >= 1 and f == int(f) for f in factors[2:]):
        return f"integer upscaling of H and W only; the factors are {factors}"
    return int(factors[2]), int(factors[3])
