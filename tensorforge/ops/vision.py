"""Vision ops: GridSample (N-D), AffineGrid, RoiAlign and NonMaxSuppression."""

from __future__ import annotations

import itertools
import math

import torch

from .helpers import to_ints, upcast
from .registry import OpContext, register

# -- GridSample -----------------------------------------------------------------------------------------


def _reflect(u: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Reflect coordinates outside [low, high] back into it, bouncing off both borders."""
    span = high - low
    if span <= 0:
        return torch.full_like(u, low)
    below = u < low
    distance = torch.where(below, low - u, u - high)
    flips = torch.floor(distance / span)
    rest = distance - flips * span
    reflected = torch.where(below == (flips % 2 == 0), low + rest, high - rest)
    return torch.where(below | (u > high), reflected, u)


def _cubic_weights(t: torch.Tensor, a: float = -0.75) -> list[torch.Tensor]:
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 from floor(x), t = x - floor(x)."""

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _grid_taps(u: torch.Tensor, length: int, mode: str, padding_mode: str, align_corners: bool):
    """For one spatial axis: [(index, weight)] taps of the pixel coordinates `u`, where out-of-range
    indices are clamped (border), reflected (reflection) or given weight 0 (zeros)."""
    low, high = (0.0, length - 1.0) if align_corners else (-0.5, length - 0.5)
    if mode == "nearest":
        u = torch.round(u)  # half to even
    if padding_mode == "border":
        u = torch.where((u < low) | (u > high), u.clamp(0, length - 1), u)
    elif padding_mode == "reflection":
        u = _reflect(u, low, high)
    if mode == "nearest":
        taps = [(torch.trunc(u), torch.ones_like(u))]
    else:
        base = torch.floor(u)
        t = u - base
        if mode == "linear":
            taps = [(base, 1 - t), (base + 1, t)]
        else:
            taps = list(zip([base - 1, base, base + 1, base + 2], _cubic_weights(t), strict=True))
    result = []
    for index, weight in taps:
        if padding_mode == "zeros":
            weight = torch.where((index >= 0) & (index < length), weight, torch.zeros_like(weight))
        elif padding_mode == "reflection":
            index = _reflect(index, low, high)
        result.append((index.clamp(0, length - 1).long(), weight))
    return result


def _grid_sample(x, grid, *, mode: str, padding_mode: str, align_corners: bool):
    """Sample x (N, C, D1..Dk) at grid (N, O1..Ok, k), whose last axis lists (x, y, ...) coordinates
    normalized to [-1, 1] (axis Dk first); the corners are pixel centers with align_corners, else
    pixel edges."""
    n, c, *spatial = x.shape
    out_shape = grid.shape[1:-1]
    coords = upcast(grid).flip(-1).reshape(n, -1, len(spatial))
    data = upcast(x).reshape(n, c, -1)
    per_axis = []
    for axis, length in enumerate(spatial):
        g = coords[..., axis]
        u = (g + 1) / 2 * (length - 1) if align_corners else ((g + 1) * length - 1) / 2
        per_axis.append(_grid_taps(u, length, mode, padding_mode, align_corners))
    strides = [math.prod(spatial[axis + 1 :]) for axis in range(len(spatial))]
    result = torch.zeros(n, c, coords.shape[1], dtype=data.dtype, device=data.device)
    for combo in itertools.product(*per_axis):
        flat = sum(index * stride for (index, _), stride in zip(combo, strides, strict=True))
        weight = math.prod(w for _, w in combo).to(data.dtype)
        values = data.gather(2, flat[:, None, :].expand(n, c, -1))
        result += values * weight[:, None, :]
    return result.reshape(n, c, *out_shape).to(x.dtype)


_GRID_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


@register("GridSample", since=16)
def grid_sample_v16(ctx: OpContext, x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """Opsets 16-19: 4-D input, modes bilinear / nearest / bicubic."""
    if x.dim() != 4 or mode not in _GRID_MODES_16:
        raise ValueError(f"GridSample-16 takes a 4-D input and mode in {sorted(_GRID_MODES_16)}")
    return _grid_sample(
        x, grid, mode=_GRID_MODES_16[mode], padding_mode=padding_mode, align_corners=bool(align_corners)
    )


@register("GridSample", since=20)
@register("GridSample", since=22)
def grid_sample(ctx: OpContext, x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """Opset 20+: N-D input, modes linear / nearest / cubic."""
    if mode not in ("linear", "nearest", "cubic"):
        raise ValueError(f"unknown GridSample mode {mode!r}")
    return _grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=bool(align_corners))


# -- AffineGrid -----------------------------------------------------------------------------------------


@register("AffineGrid", since=20)
def affine_grid(ctx: OpContext, theta, size, *, align_corners=0):
    """The sampling grid (N, D1..Dk, k) of theta (N, k, k+1) applied to normalized output coordinates:
    -1 and 1 are the corner pixel centers with align_corners (a single pixel is at -1), else the edges."""
    _, _, *spatial = to_ints(size)
    compute = upcast(theta)
    axes = []
    for length in spatial:
        steps = torch.arange(length, dtype=compute.dtype, device=theta.device)
        if align_corners:
            axes.append(-1 + steps * (2 / (length - 1) if length > 1 else 0.0))
        else:
            axes.append(-1 + 1 / length + steps * (2 / length))
    mesh = torch.meshgrid(*axes, indexing="ij")
    points = torch.stack([*reversed(mesh), torch.ones_like(mesh[0])], dim=-1).reshape(-1, len(spatial) + 1)
    grid = points @ compute.transpose(1, 2)  # (N, points, k)
    return grid.reshape(theta.shape[0], *spatial, len(spatial)).to(theta.dtype)


# -- RoiAlign -------------------------------------------------------------------------------------------


def _roi_axis(start, size, pooled: int, grid, max_grid: int, length: int):
    """Bilinear sampling along one axis for every roi, pooled bin and sample (R, pooled, max_grid):
    low/high pixel indices, their weights, whether the sample is in range, and whether it exists."""
    bins = torch.arange(pooled, dtype=start.dtype, device=start.device)
    samples = torch.arange(max_grid, dtype=start.dtype, device=start.device)
    bin_size = (size / pooled)[:, None, None]
    grid = grid[:, None, None]
    pos = start[:, None, None] + bins[None, :, None] * bin_size + (samples + 0.5) * bin_size / grid
    inside = (pos >= -1) & (pos <= length)
    pos = pos.clamp(min=0)
    low = torch.floor(pos)
    at_edge = low >= length - 1
    low = torch.where(at_edge, torch.full_like(low, length - 1), low)
    high = torch.where(at_edge, low, low + 1)
    frac = torch.where(at_edge, torch.zeros_like(pos), pos - low)
    exists = samples[None, None, :] < grid
    return low.long(), high.long(), 1 - frac, frac, inside, exists


def _roi_align(x, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel):
    """Pool each roi (x1, y1, x2, y2, in input coordinates times spatial_scale) into output_height x
    output_width bins, averaging (or taking the max of) bilinear samples on a regular grid per bin: with
    sampling_ratio > 0 that many per axis, else ceil(roi extent / bins). A sample's max-mode value is the
    largest of its four weighted corner values, as in the reference kernels."""
    n, c, height, width = x.shape
    data = upcast(x)
    boxes = rois.to(data.dtype) * spatial_scale - (0.5 if half_pixel else 0.0)
    start_w, start_h, end_w, end_h = boxes.unbind(1)
    roi_w, roi_h = end_w - start_w, end_h - start_h
    if not half_pixel:
        roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
    if sampling_ratio > 0:
        grid_h = torch.full_like(roi_h, sampling_ratio)
        grid_w = torch.full_like(roi_w, sampling_ratio)
    else:
        grid_h, grid_w = torch.ceil(roi_h / output_height), torch.ceil(roi_w / output_width)
    max_h = max(int(grid_h.max()), 1) if len(rois) else 1
    max_w = max(int(grid_w.max()), 1) if len(rois) else 1
    y_low, y_high, y_lw, y_hw, y_in, y_exists = _roi_axis(start_h, roi_h, output_height, grid_h, max_h, height)
    x_low, x_high, x_lw, x_hw, x_in, x_exists = _roi_axis(start_w, roi_w, output_width, grid_w, max_w, width)

    def outer(a, b):  # (R, oh, gh) x (R, ow, gw) -> (R, oh, gh, ow, gw)
        return a[:, :, :, None, None] * b[:, None, None, :, :]

    valid = outer(y_in, x_in)
    exists = outer(y_exists, x_exists)
    pixels = data.reshape(n, c, -1).permute(0, 2, 1)  # (N, HW, C)
    batch = batch_indices.long()[:, None]
    corners = []
    for ys, yw in ((y_low, y_lw), (y_high, y_hw)):
        for xs, xw in ((x_low, x_lw), (x_high, x_hw)):
            flat = (ys[:, :, :, None, None] * width + xs[:, None, None, :, :]).reshape(len(rois), -1)
            weight = torch.where(valid, outer(yw, xw), 0.0).reshape(len(rois), -1, 1)
            corners.append(pixels[batch, flat] * weight)  # (R, samples, C)
    shape = (len(rois), output_height, max_h, output_width, max_w, c)
    exists = exists[..., None]
    if mode == "avg":
        total = torch.where(exists, sum(corners).reshape(shape), 0.0).sum(dim=(2, 4))
        count = (grid_h * grid_w).clamp(min=1).to(data.dtype)[:, None, None, None]
        pooled = total / count
    elif mode == "max":
        best = torch.stack(corners).amax(dim=0).reshape(shape)
        pooled = torch.where(exists, best, -torch.inf).amax(dim=(2, 4))
    else:
        raise ValueError(f"unknown RoiAlign mode {mode!r}")
    return pooled.permute(0, 3, 1, 2).to(x.dtype)


@register("RoiAlign", since=10)
def roi_align_v10(
    ctx: OpContext,
    x,
    rois,
    batch_indices,
    *,
    mode="avg",
    output_height=1,
    output_width=1,
    sampling_ratio=0,
    spatial_scale=1.0,
):
    """Opsets 10-15: no half-pixel offset, rois at least one pixel wide and high."""
    return roi_align(
        ctx,
        x,
        rois,
        batch_indices,
        coordinate_transformation_mode="output_half_pixel",
        mode=mode,
        output_height=output_height,
        output_width=output_width,
        sampling_ratio=sampling_ratio,
        spatial_scale=spatial_scale,
    )


@register("RoiAlign", since=16)
@register("RoiAlign", since=22)
def roi_align(
    ctx: OpContext,
    x,
    rois,
    batch_indices,
    *,
    coordinate_transformation_mode="half_pixel",
    mode="avg",
    output_height=1,
    output_width=1,
    sampling_ratio=0,
    spatial_scale=1.0,
):
    """Opset 16+: half_pixel (default) shifts roi coordinates by -0.5; output_half_pixel is the old way."""
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"unknown coordinate_transformation_mode {coordinate_transformation_mode!r}")
    return _roi_align(
        x,
        rois,
        batch_indices,
        mode=mode,
        output_height=output_height,
        output_width=output_width,
        sampling_ratio=sampling_ratio,
        spatial_scale=spatial_scale,
        half_pixel=coordinate_transformation_mode == "half_pixel",
    )


# -- NonMaxSuppression ----------------------------------------------------------------------------------


def _corners(boxes: torch.Tensor, center_point_box: int) -> torch.Tensor:
    """Boxes as (y_min, x_min, y_max, x_max) from [y1, x1, y2, x2] (either corner order) or, with
    center_point_box, [x_center, y_center, width, height]."""
    if center_point_box:
        xc, yc, w, h = boxes.unbind(-1)
        return torch.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], dim=-1)
    y1, x1, y2, x2 = boxes.unbind(-1)
    return torch.stack([torch.minimum(y1, y2), torch.minimum(x1, x2), torch.maximum(y1, y2), torch.maximum(x1, x2)], -1)


def _iou(boxes: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of corner boxes (n, 4); 0 where the boxes do not overlap or one has no area."""
    y0, x0, y1, x1 = boxes.unbind(-1)
    area = (y1 - y0) * (x1 - x0)
    inter_h = (torch.minimum(y1[:, None], y1[None]) - torch.maximum(y0[:, None], y0[None])).clamp(min=0)
    inter_w = (torch.minimum(x1[:, None], x1[None]) - torch.maximum(x0[:, None], x0[None])).clamp(min=0)
    inter = inter_h * inter_w
    union = area[:, None] + area[None] - inter
    ok = (inter > 0) & (area[:, None] > 0) & (area[None] > 0) & (union > 0)
    return torch.where(ok, inter / torch.where(ok, union, 1.0), 0.0)


@register("NonMaxSuppression", since=10)
@register("NonMaxSuppression", since=11)
def non_max_suppression(
    ctx: OpContext,
    boxes,
    scores,
    max_output_boxes_per_class=None,
    iou_threshold=None,
    score_threshold=None,
    *,
    center_point_box=0,
):
    """Per batch and class, greedily keep the highest-scoring boxes (ties: lower index first) whose IoU
    with every kept box is <= iou_threshold, at most max_output_boxes_per_class (default 0) of them,
    among boxes scoring > score_threshold when given. Returns int64 [num_selected, 3] rows of
    (batch, class, box)."""
    limit = max(to_ints(max_output_boxes_per_class)[0], 0) if _given(max_output_boxes_per_class) else 0
    iou_limit = float(iou_threshold.reshape(-1)[0]) if _given(iou_threshold) else 0.0
    boxes = upcast(boxes).cpu()
    scores = upcast(scores).cpu()
    selected = []
    for b in range(boxes.shape[0] if limit else 0):
        overlaps = _iou(_corners(boxes[b], center_point_box))
        for c in range(scores.shape[1]):
            class_scores = scores[b, c]
            order = torch.sort(class_scores, descending=True, stable=True).indices
            if _given(score_threshold):
                order = order[class_scores[order] > float(score_threshold.reshape(-1)[0])]
            kept: list[int] = []
            for i in order.tolist():
                if len(kept) == limit:
                    break
                if not kept or bool((overlaps[i, kept] <= iou_limit).all()):
                    kept.append(i)
            selected.extend((b, c, i) for i in kept)
    return torch.tensor(selected, dtype=torch.int64, device=ctx.device).reshape(-1, 3)


def _given(value) -> bool:
    return value is not None and value.numel() > 0
