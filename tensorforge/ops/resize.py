"""Resize (opsets 10-19) and the deprecated Upsample, as one separable resampler.

Each resized axis gets a table of source indices and weights (computed in float64 from the ONNX coordinate
transformation), then the tensor is gathered along that axis and the taps are summed with the weights.
Nearest mode only gathers, so it is exact for every element type (strings included).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from .helpers import normalize_axis, to_ints
from .registry import OpContext, register


@dataclass(frozen=True, slots=True)
class _Sampling:
    """How output coordinates map to input taps (the Resize attributes, with ONNX names)."""

    mode: str = "nearest"
    coordinate_transformation_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"  # or "legacy": floor upsampling, ceil downsampling
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False


def _source_coords(
    sampling: _Sampling,
    out: int,
    length_in: int,
    length_out: float,
    scale: float,
    roi: tuple[float, float],
) -> torch.Tensor:
    """x_original for every output index, in float64. `length_out` is the target length before
    flooring or rounding (`scale * length_in`, times the roi extent for tf_crop_and_resize)."""
    y = torch.arange(out, dtype=torch.float64)
    mode = sampling.coordinate_transformation_mode
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = length_in / 2 * (1 - out / length_out)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if length_out > 1 else torch.zeros_like(y)
    if mode == "align_corners":
        return torch.zeros_like(y) if length_out == 1 else y * (length_in - 1) / (length_out - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if length_out == 1:
            return torch.full_like(y, (end - start) * (length_in - 1) / 2 + start * (length_in - 1))
        return y * (end - start) * (length_in - 1) / (length_out - 1) + start * (length_in - 1)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _cubic_kernel(t: torch.Tensor, a: float) -> torch.Tensor:
    """Keys' cubic convolution kernel with parameter `a`."""
    t = t.abs()
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return torch.where(t <= 1, near, torch.where(t < 2, far, torch.zeros_like(t)))


def _nearest_taps(sampling: _Sampling, x: torch.Tensor, scale: float) -> torch.Tensor:
    """The nearest source index for each coordinate, by `nearest_mode` (an integral x maps to x)."""
    mode = sampling.nearest_mode
    if mode == "legacy":
        mode = "ceil" if scale < 1 else "floor"
    if mode == "round_prefer_floor":
        return torch.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return torch.floor(x + 0.5)
    if mode == "floor":
        return torch.floor(x)
    if mode == "ceil":
        return torch.ceil(x)
    raise ValueError(f"unknown nearest_mode {mode!r}")


def _axis_table(
    sampling: _Sampling, x: torch.Tensor, length_in: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Source indices (out, taps), clamped into the axis (edge padding), and their weights (None for
    nearest).

    Linear and cubic take the taps nearest x; with antialias and scale < 1 the kernel is stretched by
    1 / scale (more taps) and the weights are normalized to sum 1.
    """
    if sampling.mode == "nearest":
        index = _nearest_taps(sampling, x, scale).long()
        return index.clamp(0, length_in - 1)[:, None], None
    stretch = min(scale, 1.0) if sampling.antialias else 1.0
    if sampling.mode == "linear":
        support = 1.0
    elif sampling.mode == "cubic":
        support = 2.0
    else:
        raise ValueError(f"unknown Resize mode {sampling.mode!r}")
    first = math.floor(-support / stretch) + 1  # first tap, relative to `left`
    taps = 2 - 2 * first
    left = torch.ceil(x) - 1  # the tap left of x; x itself when x is integral (ratio in (0, 1])
    index = left[:, None] + torch.arange(first, first + taps, dtype=torch.float64)
    distance = (index - x[:, None]) * stretch
    if sampling.mode == "linear":
        weight = (1 - distance.abs()).clamp(min=0)
    else:
        weight = _cubic_kernel(distance, sampling.cubic_coeff_a)
    if sampling.exclude_outside:
        weight = torch.where((index < 0) | (index >= length_in), 0.0, weight)
    if sampling.antialias or sampling.exclude_outside:
        total = weight.sum(dim=1, keepdim=True)
        weight = weight / torch.where(total == 0, 1.0, total)
    return index.long().clamp(0, length_in - 1), weight


def _resample_axis(data, axis: int, index: torch.Tensor, weight: torch.Tensor | None):
    """Gather `index` (out, taps) along `axis` and sum the taps with `weight` (both on data's device, the weight
    in its type)."""
    if isinstance(data, np.ndarray):
        return np.take(data, index[:, 0].numpy(), axis=axis)
    out, taps = index.shape
    picked = data.index_select(axis, index.reshape(-1))
    if weight is None:
        return picked
    picked = picked.reshape(*data.shape[:axis], out, taps, *data.shape[axis + 1 :])
    weight = weight.reshape(out, taps, *[1] * (data.dim() - axis - 1))
    return (picked * weight).sum(dim=axis + 1)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Interpolate float16/bfloat16/float32 in float32, integers and float64 in float64."""
    if dtype.is_floating_point and dtype.itemsize <= 4:
        return torch.float32
    return torch.float64


def _cast_back(result: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast interpolated values to the input type; integers round half to even and saturate."""
    if dtype.is_floating_point or dtype.is_complex:
        return result.to(dtype)
    low, high = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    return result.round().clamp(low, high).to(dtype)


def _geometry(
    lengths: list[int],
    scales: list[float] | None,
    sizes: list[int] | None,
    extents: list[float],
    keep_aspect_ratio_policy: str,
) -> list[tuple[int, float, float]]:
    """(output size, fractional target length, scale) of each resized axis.

    With `scales`, out = floor(length * extent * scale), extent being the roi's share of the axis in
    tf_crop_and_resize mode (else 1). With `sizes`, scale = size / length, or one common scale for every
    axis ("not_larger": the smallest, "not_smaller": the largest) with out = round_half_up(scale * length).
    """
    if sizes is None and scales is None:
        raise ValueError("Resize needs one of scales and sizes")
    count = len(sizes if scales is None else scales)
    if count != len(lengths):
        raise ValueError(f"Resize got {count} scales/sizes for {len(lengths)} axes")
    if scales is not None:
        return [
            (math.floor(length * extent * scale), length * extent * scale, scale)
            for length, extent, scale in zip(lengths, extents, scales, strict=True)
        ]
    ratios = [size / length for size, length in zip(sizes, lengths, strict=True)]
    if keep_aspect_ratio_policy == "stretch":
        return [(size, ratio * length, ratio) for size, length, ratio in zip(sizes, lengths, ratios, strict=True)]
    if keep_aspect_ratio_policy == "not_larger":
        common = min(ratios)
    elif keep_aspect_ratio_policy == "not_smaller":
        common = max(ratios)
    else:
        raise ValueError(f"unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}")
    return [(int(common * length + 0.5), common * length, common) for length in lengths]


def _resize(
    x,
    sampling: _Sampling,
    *,
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    roi: list[float] | None = None,
    axes: list[int] | None = None,
    keep_aspect_ratio_policy: str = "stretch",
    extrapolation_value: float = 0.0,
):
    """Resize `x` along `axes` (all by default); in tf_crop_and_resize mode, outputs whose source
    coordinate on any axis falls outside [0, length - 1] take `extrapolation_value`."""
    rank = x.ndim
    axes = [normalize_axis(a, rank) for a in axes] if axes else list(range(rank))
    lengths = [int(x.shape[a]) for a in axes]
    crop = sampling.coordinate_transformation_mode == "tf_crop_and_resize"
    windows = [(0.0, 1.0)] * len(axes)
    if crop:
        if not roi or len(roi) != 2 * len(axes):
            raise ValueError(f"tf_crop_and_resize needs a roi of {2 * len(axes)} values")
        windows = list(zip(roi[: len(axes)], roi[len(axes) :], strict=True))
    extents = [end - start for start, end in windows]
    geometry = _geometry(lengths, scales, sizes, extents, keep_aspect_ratio_policy)

    is_strings = isinstance(x, np.ndarray)
    if is_strings and sampling.mode != "nearest":
        raise ValueError("string tensors can only be resized in nearest mode")
    result = x if is_strings or sampling.mode == "nearest" else x.to(_compute_dtype(x.dtype))
    outside = None
    device = None if is_strings else result.device
    dtype = None if is_strings else result.dtype
    for axis, length, (out, target, scale), window in zip(axes, lengths, geometry, windows, strict=True):
        if out == length and scale == 1 and window == (0.0, 1.0):
            continue
        index, weight, axis_outside = _axis_plan(sampling, out, length, target, scale, window, device, dtype)
        result = _resample_axis(result, axis, index, weight)
        if crop:
            shape = [1] * rank
            shape[axis] = out
            axis_outside = axis_outside.reshape(shape)
            outside = axis_outside if outside is None else outside | axis_outside
    if is_strings:
        if outside is not None:
            result = np.where(outside.numpy(), extrapolation_value, result)
        return result
    if outside is not None:
        result = result.masked_fill(outside, extrapolation_value)
    return _cast_back(result, x.dtype)


@functools.lru_cache(maxsize=512)
def _axis_plan(
    sampling: _Sampling,
    out: int,
    length: int,
    target: float,
    scale: float,
    window: tuple[float, float],
    device: torch.device | None,
    dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One axis's source indices and weights (`_axis_table`) and which outputs fall outside the input (for
    tf_crop_and_resize), on `device` with the weights in `dtype` (None: on the CPU, for string tensors).

    Kept per geometry and device: the tables are computed on the host, and copying them to a GPU on every
    call would synchronize with it and forbid capturing the layer in a CUDA graph; after the first call
    (an engine's warm-up run) a capture finds them already there. Callers must not modify them."""
    coords = _source_coords(sampling, out, length, target, scale, window)
    index, weight = _axis_table(sampling, coords, length, scale)
    outside = (coords < 0) | (coords > length - 1)
    if device is None:
        return index, weight, outside
    weight = weight.to(device=device, dtype=dtype) if weight is not None else None
    return index.to(device), weight, outside.to(device)


def _floats(value) -> list[float] | None:
    """A list of floats from an optional 1-D tensor; an empty tensor counts as absent."""
    if value is None or value.numel() == 0:
        return None
    return [float(v) for v in value.reshape(-1).tolist()]


def _ints(value) -> list[int] | None:
    if value is None or value.numel() == 0:
        return None
    return to_ints(value)


@register("Resize", since=10)
def resize_v10(ctx: OpContext, x, scales, *, mode="nearest"):
    """Opset 10: asymmetric coordinates; nearest takes floor when upsampling, ceil when downsampling."""
    sampling = _Sampling(mode=mode, coordinate_transformation_mode="asymmetric", nearest_mode="legacy")
    return _resize(x, sampling, scales=_floats(scales))


@register("Resize", since=11)
@register("Resize", since=13)
def resize_v11(
    ctx: OpContext,
    x,
    roi=None,
    scales=None,
    sizes=None,
    *,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    mode="nearest",
    nearest_mode="round_prefer_floor",
):
    """Opsets 11-17: roi / scales / sizes inputs (an empty tensor or a missing input is absent)."""
    return resize(
        ctx,
        x,
        roi,
        scales,
        sizes,
        coordinate_transformation_mode=coordinate_transformation_mode,
        cubic_coeff_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value,
        mode=mode,
        nearest_mode=nearest_mode,
    )


@register("Resize", since=18)
@register("Resize", since=19)
def resize(
    ctx: OpContext,
    x,
    roi=None,
    scales=None,
    sizes=None,
    *,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
):
    """Opset 18+: adds `axes`, `antialias` and `keep_aspect_ratio_policy` (19: half_pixel_symmetric)."""
    sampling = _Sampling(
        mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        cubic_coeff_a=cubic_coeff_a,
        exclude_outside=bool(exclude_outside),
        antialias=bool(antialias) and mode != "nearest",
    )
    return _resize(
        x,
        sampling,
        scales=_floats(scales),
        sizes=_ints(sizes),
        roi=_floats(roi),
        axes=axes,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        extrapolation_value=extrapolation_value,
    )


def _upsample(x, scales: list[float], mode: str):
    """Upsample: asymmetric coordinates, nearest takes floor; "bilinear" (opset 1) means linear."""
    sampling = _Sampling(
        mode="linear" if mode == "bilinear" else mode,
        coordinate_transformation_mode="asymmetric",
        nearest_mode="legacy",
    )
    return _resize(x, sampling, scales=scales)


@register("Upsample", since=1)
def upsample_v1(ctx: OpContext, x, *, height_scale, mode="nearest", width_scale):
    """Opset 1: scales the last two axes of a 4-D tensor."""
    return _upsample(x, [1.0, 1.0, height_scale, width_scale], mode)


@register("Upsample", since=7)
def upsample_v7(ctx: OpContext, x, *, mode="nearest", scales):
    return _upsample(x, list(scales), mode)


@register("Upsample", since=9)
@register("Upsample", since=10)
def upsample(ctx: OpContext, x, scales, *, mode="nearest"):
    return _upsample(x, _floats(scales), mode)
