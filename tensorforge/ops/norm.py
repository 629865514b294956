"""Normalization ops (batch, instance, layer, group, RMS, LRN, Lp, mean-variance) and Dropout.

Half-precision inputs are normalized in float32 (or the `stash_type` where the op has one) and cast back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..ir import DType
from .helpers import normalize_axis, upcast
from .registry import OpContext, register


def _standardize(
    x: torch.Tensor, dims: Sequence[int], epsilon: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x - mean) * inv_std over `dims` (population variance), with the kept-dim mean and inv_std."""
    mean = x.mean(dim=tuple(dims), keepdim=True)
    centered = x - mean
    inv_std = torch.rsqrt((centered * centered).mean(dim=tuple(dims), keepdim=True) + epsilon)
    return centered * inv_std, mean, inv_std


def _per_channel(param: torch.Tensor, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """A (C,) parameter shaped (C, 1, ..., 1) to broadcast against an (N, C, ...) tensor."""
    return param.to(dtype).reshape(-1, *([1] * (rank - 2)))


# -- BatchNormalization -------------------------------------------------------------------------------


def _batch_norm(x, scale, b, mean, var, *, epsilon: float, momentum: float, training: bool, spatial: bool = True):
    """Y, and in training mode also the batch mean/variance and the updated running mean/variance.

    Training normalizes with the batch statistics (population variance over every axis but the channel
    axis, or only over N when `spatial` is false) and updates `running = mean * momentum + batch *
    (1 - momentum)`. With `spatial` false the parameters have shape (C, D1, ..., Dn).
    """
    xc = upcast(x)
    compute = xc.dtype
    rank = x.dim()

    def shaped(param):
        param = param.to(compute)
        return param.reshape(x.shape[1:]) if not spatial else _per_channel(param, rank, compute)

    dims = (0,) if not spatial else (0, *range(2, rank))
    if training:
        batch_mean = xc.mean(dim=dims)
        batch_var = xc.var(dim=dims, unbiased=False)
        use_mean, use_var = batch_mean, batch_var
    else:
        use_mean, use_var = mean, var
    y = (xc - shaped(use_mean)) * torch.rsqrt(shaped(use_var) + epsilon) * shaped(scale) + shaped(b)
    y = y.to(x.dtype)
    if not training:
        return y, None, None, None, None
    running_mean = mean.to(compute) * momentum + batch_mean * (1 - momentum)
    running_var = var.to(compute) * momentum + batch_var * (1 - momentum)
    stats_dtype = mean.dtype
    return (
        y,
        running_mean.to(stats_dtype),
        running_var.to(var.dtype),
        batch_mean.to(stats_dtype),
        batch_var.to(var.dtype),
    )


@register("BatchNormalization", since=1)
def batch_norm_v1(
    ctx: OpContext,
    x,
    scale,
    b,
    mean,
    var,
    *,
    consumed_inputs=None,
    epsilon=1e-5,
    is_test=0,
    momentum=0.9,
    spatial=1,
):
    """Opsets 1-6: `is_test` = 0 (the default) is training mode. Outputs Y, the running mean and
    variance, and the batch mean and variance (those the node does not name are dropped)."""
    return _batch_norm(
        x,
        scale,
        b,
        mean,
        var,
        epsilon=epsilon,
        momentum=momentum,
        training=not is_test,
        spatial=bool(spatial),
    )


@register("BatchNormalization", since=6)
def batch_norm_v6(ctx: OpContext, x, scale, b, mean, var, *, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1):
    return batch_norm_v1(
        ctx, x, scale, b, mean, var, epsilon=epsilon, is_test=is_test, momentum=momentum, spatial=spatial
    )


@register("BatchNormalization", since=7)
def batch_norm_v7(ctx: OpContext, x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1):
    """Opsets 7-13: the node is in training mode when it asks for more outputs than Y."""
    training = any(ctx.output_present(i) for i in range(1, ctx.num_outputs))
    return _batch_norm(
        x,
        scale,
        b,
        mean,
        var,
        epsilon=epsilon,
        momentum=momentum,
        training=training,
        spatial=bool(spatial),
    )


@register("BatchNormalization", since=9)
def batch_norm_v9(ctx: OpContext, x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9):
    return batch_norm_v7(ctx, x, scale, b, mean, var, epsilon=epsilon, momentum=momentum)


@register("BatchNormalization", since=14)
@register("BatchNormalization", since=15)
def batch_norm(ctx: OpContext, x, scale, b, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    """Opset 14+: outputs Y and, in training mode, the updated running mean and variance."""
    y, running_mean, running_var, _, _ = _batch_norm(
        x,
        scale,
        b,
        input_mean,
        input_var,
        epsilon=epsilon,
        momentum=momentum,
        training=bool(training_mode),
    )
    if not training_mode:
        return y
    return y, running_mean, running_var


# -- Instance, layer, group and RMS normalization -----------------------------------------------------


@register("InstanceNormalization", since=1)
def instance_norm_v1(ctx: OpContext, x, scale, b, *, consumed_inputs=None, epsilon=1e-5):
    return instance_norm(ctx, x, scale, b, epsilon=epsilon)


@register("InstanceNormalization", since=6)
@register("InstanceNormalization", since=22)
def instance_norm(ctx: OpContext, x, scale, b, *, epsilon=1e-5):
    """y = scale * (x - mean) / sqrt(var + epsilon) + B, statistics per instance and channel."""
    xc = upcast(x)
    compute = xc.dtype
    normalized, _, _ = _standardize(xc, range(2, x.dim()), epsilon)
    rank = x.dim()
    y = normalized * _per_channel(scale, rank, compute) + _per_channel(b, rank, compute)
    return y.to(x.dtype)


@register("LayerNormalization", since=17)
def layer_norm(ctx: OpContext, x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Standardize over axes [axis, rank) in `stash_type`, cast back to X's type, then `* Scale + B`.

    Mean and InvStdDev (optional outputs) keep the reduced axes as size 1 and have type `stash_type`.
    """
    axis = normalize_axis(axis, x.dim())
    stash = DType(stash_type).torch
    normalized, mean, inv_std = _standardize(x.to(stash), range(axis, x.dim()), epsilon)
    y = normalized.to(x.dtype) * scale
    if b is not None:
        y = y + b
    if ctx.num_outputs == 1:
        return y
    return (
        y,
        mean if ctx.output_present(1) else None,
        inv_std if ctx.output_present(2) else None,
    )


def _group_norm(x, scale, bias, *, num_groups: int, epsilon: float, stash: torch.dtype, per_group: bool):
    """Standardize each group of C / num_groups channels (in `stash`), then scale and shift per channel.

    With `per_group` (opset 18) scale and bias hold one value per group, shared by its channels.
    """
    n, channels = x.shape[:2]
    grouped = x.to(stash).reshape(n, num_groups, -1)
    normalized, _, _ = _standardize(grouped, (2,), epsilon)
    normalized = normalized.reshape(x.shape).to(x.dtype)
    if per_group:
        scale = scale.repeat_interleave(channels // num_groups)
        bias = bias.repeat_interleave(channels // num_groups)
    rank = x.dim()
    return normalized * _per_channel(scale, rank, x.dtype) + _per_channel(bias, rank, x.dtype)


@register("GroupNormalization", since=18)
def group_norm_v18(ctx: OpContext, x, scale, bias, *, epsilon=1e-5, num_groups):
    """Opset 18: scale and bias have shape (num_groups); computed in X's type (float32 for halves)."""
    return _group_norm(
        x,
        scale,
        bias,
        num_groups=num_groups,
        epsilon=epsilon,
        stash=upcast(x).dtype,
        per_group=True,
    )


@register("GroupNormalization", since=21)
def group_norm(ctx: OpContext, x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    """Opset 21: scale and bias have shape (C); the first stage is computed in `stash_type`."""
    return _group_norm(
        x,
        scale,
        bias,
        num_groups=num_groups,
        epsilon=epsilon,
        stash=DType(stash_type).torch,
        per_group=False,
    )


@register("RMSNormalization", since=23)
def rms_norm(ctx: OpContext, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """y = x / sqrt(mean(x^2 over axes [axis, rank)) + epsilon) * scale, first stage in `stash_type`."""
    axis = normalize_axis(axis, x.dim())
    xs = x.to(DType(stash_type).torch)
    mean_square = (xs * xs).mean(dim=tuple(range(axis, x.dim())), keepdim=True)
    return (xs * torch.rsqrt(mean_square + epsilon)).to(x.dtype) * scale


# -- LRN, Lp and mean-variance normalization ----------------------------------------------------------


@register("LRN", since=1)
@register("LRN", since=13)
def lrn(ctx: OpContext, x, *, alpha=0.0001, beta=0.75, bias=1.0, size):
    """y = x / (bias + alpha / size * square_sum) ^ beta, square_sum over channels
    [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] clipped to the tensor."""
    xc = upcast(x)
    square = xc.square()
    before, after = (size - 1) // 2, size // 2
    channels = x.shape[1]
    pad = [0, 0] * (x.dim() - 2) + [before, after]
    padded = torch.nn.functional.pad(square, pad)
    square_sum = sum(padded[:, i : i + channels] for i in range(size))
    return (xc / (bias + alpha / size * square_sum) ** beta).to(x.dtype)


@register("LpNormalization", since=1)
@register("LpNormalization", since=22)
def lp_norm(ctx: OpContext, x, *, axis=-1, p=2):
    """x / ||x||_p along `axis` (p is 1 or 2); where the norm is zero the output is zero."""
    if p not in (1, 2):
        raise ValueError(f"LpNormalization supports p = 1 or 2, got {p}")
    xc = upcast(x)
    norm = torch.linalg.vector_norm(xc, ord=p, dim=normalize_axis(axis, x.dim()), keepdim=True)
    return torch.where(norm == 0, torch.zeros_like(xc), xc / norm).to(x.dtype)


@register("MeanVarianceNormalization", since=9)
@register("MeanVarianceNormalization", since=13)
def mean_variance_norm(ctx: OpContext, x, *, axes=(0, 2, 3)):
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes`."""
    xc = upcast(x)
    dims = tuple(normalize_axis(a, x.dim()) for a in axes)
    mean = xc.mean(dim=dims, keepdim=True)
    variance = (xc * xc).mean(dim=dims, keepdim=True) - mean * mean
    return ((xc - mean) / (torch.sqrt(variance) + 1e-9)).to(x.dtype)


# -- Dropout --------------------------------------------------------------------------------------------


def _dropout(ctx: OpContext, x, ratio: float, training: bool, seed: int | None, mask_dtype: torch.dtype):
    """Identity with an all-true mask, or in training mode `x * mask / (1 - ratio)` with a random mask
    keeping each element with probability 1 - ratio.

    A seeded mask is drawn from numpy's MT19937 (`RandomState(seed).uniform(0, 1) >= ratio`, as the
    ONNX reference does), so that it is the same on every device; without a seed torch's generator is used.
    """
    want_mask = ctx.output_present(1)
    if not training or ratio == 0:
        if not want_mask:
            return x
        return x, torch.ones(x.shape, dtype=mask_dtype, device=x.device)
    if seed is None:
        keep = torch.rand(x.shape, device=x.device) >= ratio
    else:
        draws = np.random.RandomState(seed).uniform(0.0, 1.0, x.shape)
        keep = torch.from_numpy(draws >= ratio).to(x.device)
    y = (upcast(x) * keep * (1.0 / (1.0 - ratio))).to(x.dtype)
    return (y, keep.to(mask_dtype)) if want_mask else y


@register("Dropout", since=1)
def dropout_v1(ctx: OpContext, x, *, consumed_inputs=None, is_test=0, ratio=0.5):
    return dropout_v6(ctx, x, is_test=is_test, ratio=ratio)


@register("Dropout", since=6)
def dropout_v6(ctx: OpContext, x, *, is_test=0, ratio=0.5):
    """Opsets 1-6: training (random) dropout unless `is_test`; the mask has X's type."""
    return _dropout(ctx, x, ratio, not is_test, None, x.dtype)


@register("Dropout", since=7)
def dropout_v7(ctx: OpContext, x, *, ratio=0.5):
    """Opsets 7-9: inference is the identity; the mask has X's type."""
    return _dropout(ctx, x, ratio, False, None, x.dtype)


@register("Dropout", since=10)
def dropout_v10(ctx: OpContext, x, *, ratio=0.5):
    """Opsets 10-11: inference is the identity; the mask is bool."""
    return _dropout(ctx, x, ratio, False, None, torch.bool)


@register("Dropout", since=12)
@register("Dropout", since=13)
@register("Dropout", since=22)
def dropout(ctx: OpContext, x, ratio=None, training_mode=None, *, seed=None):
    """Opset 12+: `ratio` (default 0.5) and `training_mode` (default false) are inputs."""
    drop = 0.5 if ratio is None else float(ratio)
    training = training_mode is not None and bool(training_mode)
    return _dropout(ctx, x, drop, training, seed, torch.bool)
