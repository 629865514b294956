"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (inference semantics; fp16/bf16 compute in float32).

Input is (N, C) or (N, C, d1, ..., dk), target (N) or (N, d1, ..., dk) of class indices:
loss[n, d] = -input[n, target[n, d], d] * weight[target[n, d]]. A target equal to `ignore_index` has loss
0 and weight 0. Reduction "none" keeps the per-element losses, "sum" adds them, and "mean" divides the sum
by the total weight of the elements not ignored (their count when there is no weight).
"""

from __future__ import annotations

import torch

from .helpers import upcast
from .registry import OpContext, register


def _nll(log_prob, target, weight, ignore_index: int | None, reduction: str) -> torch.Tensor:
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"unknown reduction {reduction!r}")
    target = target.long()
    ignored = torch.zeros_like(target, dtype=torch.bool) if ignore_index is None else target == ignore_index
    safe = target.masked_fill(ignored, 0)
    picked = -log_prob.gather(1, safe.unsqueeze(1)).squeeze(1)
    scale = torch.ones_like(picked) if weight is None else upcast(weight)[safe]
    scale = scale.masked_fill(ignored, 0)
    loss = picked * scale
    if reduction == "none":
        return loss
    return loss.sum() / scale.sum() if reduction == "mean" else loss.sum()


@register("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(ctx: OpContext, input, target, weight=None, *, ignore_index=None, reduction="mean"):
    return _nll(upcast(input), target, weight, ignore_index, reduction).to(input.dtype)


@register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx: OpContext, scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    """NegativeLogLikelihoodLoss of LogSoftmax(scores) over the class axis 1; the second output is that
    log-probability."""
    log_prob = torch.log_softmax(upcast(scores), dim=1)
    loss = _nll(log_prob, labels, weights, ignore_index, reduction).to(scores.dtype)
    return loss, log_prob.to(scores.dtype) if ctx.output_present(1) else None
