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
