"""Simple ai.onnx.ml ops: ArrayFeatureExtractor, Binarizer and LabelEncoder."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .registry import OpContext, register

_ML = "ai.onnx.ml"


@register("ArrayFeatureExtractor", since=1, domain=_ML)
def array_feature_extractor(ctx: OpContext, X, Y):
    """Select the elements at indices `Y` along the last axis (a 1-D X gives a [1, len(Y)] result)."""
    indices = Y.reshape(-1)
    if isinstance(X, np.ndarray):
        picked = X[..., indices.tolist()]
    else:
        picked = X.index_select(-1, indices.to(X.device))
    return picked.reshape(1, -1) if X.ndim == 1 else picked


@register("Binarizer", since=1, domain=_ML)
def binarizer(ctx: OpContext, X, *, threshold=0.0):
    """1 where X > threshold, else 0, in X's dtype."""
    return (X > threshold).to(X.dtype)


def _key(value: Any) -> Any:
    """A dictionary key under which every float NaN is equal."""
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _encode(ctx: OpContext, X, keys: Sequence, values: Sequence, default: Any, dtype: torch.dtype | None):
    """Map each element of X through keys -> values (the last of repeated keys wins), else `default`.
    `dtype` None: the values are strings and the result a string array."""
    table = {_key(k): v for k, v in zip(keys, values, strict=True)}
    items = X.reshape(-1).tolist()
    mapped = [table.get(_key(item), default) for item in items]
    if dtype is None:
        return np.array(mapped, dtype=object).reshape(X.shape)
    return torch.tensor(mapped, dtype=dtype, device=ctx.device).reshape(X.shape)


@register("LabelEncoder", since=4, domain=_ML)
def label_encoder(
    ctx: OpContext, X, *, default_float=-0.0, default_int64=-1, default_string="_Unused", default_tensor=None,
    keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None,
    values_floats=None, values_int64s=None, values_strings=None, values_tensor=None,
):  # fmt: skip
    """Map keys_* to values_* (lists, or from opset 4 1-D tensors); unknown inputs map to the default
    that matches the values' type (`default_tensor` first)."""
    keys = next(k for k in (keys_tensor, keys_floats, keys_int64s, keys_strings) if k is not None)
    if isinstance(keys, torch.Tensor | np.ndarray):
        keys = keys.tolist()
    if values_tensor is not None:
        is_string = isinstance(values_tensor, np.ndarray)
        dtype = None if is_string else values_tensor.dtype
        values = values_tensor.tolist()
        if default_tensor is not None:
            default = default_tensor.reshape(-1).tolist()[0]
        elif is_string:
            default = default_string
        else:
            default = default_float if values_tensor.dtype.is_floating_point else default_int64
    elif values_strings is not None:
        values, default, dtype = values_strings, default_string, None
    elif values_int64s is not None:
        values, default, dtype = values_int64s, default_int64, torch.int64
    else:
        values, default, dtype = values_floats, default_float, torch.float32
    return _encode(ctx, X, keys, values, default, dtype)


@register("LabelEncoder", since=2, domain=_ML)
def label_encoder2(
    ctx: OpContext, X, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
    keys_floats=None, keys_int64s=None, keys_strings=None,
    values_floats=None, values_int64s=None, values_strings=None,
):  # fmt: skip
    """LabelEncoder with list attributes only."""
    return label_encoder(
        ctx, X, default_float=default_float, default_int64=default_int64, default_string=default_string,
        keys_floats=keys_floats, keys_int64s=keys_int64s, keys_strings=keys_strings,
        values_floats=values_floats, values_int64s=values_int64s, values_strings=values_strings,
    )  # fmt: skip


@register("LabelEncoder", since=1, domain=_ML)
def label_encoder1(ctx: OpContext, X, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """LabelEncoder-1: strings map to their index in `classes_strings`, int64s to the class at that index."""
    classes = classes_strings or []
    if isinstance(X, np.ndarray):
        return _encode(ctx, X, classes, range(len(classes)), default_int64, torch.int64)
    return _encode(ctx, X, range(len(classes)), classes, default_string, None)


@register("TreeEnsemble", since=5, domain=_ML)
def tree_ensemble(
    ctx: OpContext, X, *, aggregate_function=1, leaf_targetids, leaf_weights, membership_values=None,
    n_targets=None, nodes_falseleafs, nodes_falsenodeids, nodes_featureids, nodes_hitrates=None,
    nodes_missing_value_tracks_true=None, nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids,
    post_transform=0, tree_roots,
):  # fmt: skip
    """Evaluate every tree on each row of X [N, F] down to one leaf, add (or average / min / max, per
    `aggregate_function`) the leaf weights per target, then apply `post_transform`. A node compares
    X[:, feature] with its split (modes LEQ, LT, GTE, GT, EQ, NEQ, or MEMBER of its NaN-delimited set in
    `membership_values`); a NaN feature follows `nodes_missing_value_tracks_true`."""
    device = X.device
    x = X.to(torch.float64)

    def ints(values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).to(device)

    feature, true_id, false_id = ints(nodes_featureids), ints(nodes_truenodeids), ints(nodes_falsenodeids)
    true_leaf, false_leaf = ints(nodes_trueleafs).bool(), ints(nodes_falseleafs).bool()
    modes, splits = ints(nodes_modes), nodes_splits.to(device, torch.float64)
    tracks_true = (
        torch.zeros_like(true_leaf) if nodes_missing_value_tracks_true is None
        else ints(nodes_missing_value_tracks_true).bool()
    )  # fmt: skip
    members = _member_sets(membership_values, modes.tolist()).to(device)
    node = ints(tree_roots).expand(x.shape[0], -1).clone()  # [N, trees]
    leaf = torch.zeros_like(node)
    done = torch.zeros_like(node, dtype=torch.bool)
    rows = torch.arange(x.shape[0], device=device).unsqueeze(1)
    for _ in range(modes.numel()):  # a path visits each node at most once
        if bool(done.all()):
            break
        value = x[rows, feature[node]]
        split, mode = splits[node], modes[node]
        compared = torch.stack(
            [value <= split, value < split, value >= split, value > split, value == split, value != split,
             (value.unsqueeze(-1) == members[node]).any(-1)]
        ).gather(0, mode.unsqueeze(0))[0]  # fmt: skip
        goes_true = torch.where(torch.isnan(value), tracks_true[node], compared)
        step = torch.where(goes_true, true_id[node], false_id[node])
        reached_leaf = torch.where(goes_true, true_leaf[node], false_leaf[node])
        finished = reached_leaf & ~done
        leaf = torch.where(finished, step, leaf)
        node = torch.where(done | reached_leaf, node, step)  # finished rows keep a valid interior node
        done = done | finished
    if not bool(done.all()):
        raise ValueError("a tree has a cycle: some rows never reach a leaf")
    targets = ints(leaf_targetids)[leaf]
    weights = leaf_weights.to(device, torch.float64)[leaf]
    width = n_targets if n_targets is not None else int(targets.max()) + 1
    scores = _aggregate(weights, targets, width, aggregate_function, len(tree_roots))
    return _post_transform(scores, post_transform).to(X.dtype)


def _member_sets(values: torch.Tensor | None, modes: list[int]) -> torch.Tensor:
    """[nodes, widest set] of each MEMBER node's values, NaN-padded (other nodes: all NaN)."""
    flat = [] if values is None else values.to(torch.float64).tolist()
    sets, current = [], []
    for v in flat:
        if math.isnan(v):
            sets.append(current)
            current = []
        else:
            current.append(v)
    if current:
        sets.append(current)
    per_node, it = [], iter(sets)
    for mode in modes:
        per_node.append(next(it) if mode == 6 else [])
    width = max((len(s) for s in per_node), default=0) or 1
    return torch.tensor([s + [math.nan] * (width - len(s)) for s in per_node], dtype=torch.float64)


def _aggregate(weights: torch.Tensor, targets: torch.Tensor, width: int, function: int, trees: int):
    """Combine per-tree leaf weights [N, trees] into [N, width] by target: AVERAGE, SUM, MIN or MAX
    (a target no leaf reaches scores 0)."""
    shape = (weights.shape[0], width)
    if function in (0, 1):
        total = weights.new_zeros(shape).scatter_add_(1, targets, weights)
        return total / trees if function == 0 else total
    if function in (2, 3):
        reduce = "amin" if function == 2 else "amax"
        start = weights.new_full(shape, math.inf if function == 2 else -math.inf)
        best = start.scatter_reduce_(1, targets, weights, reduce)
        return torch.where(torch.isinf(best), 0.0, best)
    raise ValueError(f"unknown aggregate_function {function}")


def _post_transform(scores: torch.Tensor, transform: int) -> torch.Tensor:
    """NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO (softmax over the non-zero scores) or PROBIT."""
    if transform == 0:
        return scores
    if transform == 1:
        return torch.softmax(scores, dim=-1)
    if transform == 2:
        return torch.sigmoid(scores)
    if transform == 3:
        nonzero = scores != 0
        exp = torch.where(nonzero, torch.exp(scores - scores.max(dim=-1, keepdim=True).values), 0.0)
        return exp / exp.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(exp.dtype).tiny)
    if transform == 4:
        return math.sqrt(2) * torch.erfinv(2 * scores - 1)
    raise ValueError(f"unknown post_transform {transform}")
