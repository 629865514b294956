"""String ops on numpy object arrays, and TfIdfVectorizer (which also counts integer n-grams)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch

from .registry import OpContext, register


def _strings(values) -> np.ndarray:
    return np.asarray(values, dtype=object)


@register("StringConcat", since=20)
def string_concat(ctx: OpContext, X, Y):
    """Elementwise X + Y with numpy broadcasting."""
    return _strings(np.add(X, Y, dtype=object))


@register("RegexFullMatch", since=20)
def regex_full_match(ctx: OpContext, X, *, pattern):
    """Whether each string matches `pattern` as a whole (RE2 syntax, run with Python's `re`)."""
    regex = re.compile(pattern)
    matches = [regex.fullmatch(s) is not None for s in X.reshape(-1)]
    return torch.tensor(matches, dtype=torch.bool, device=ctx.device).reshape(X.shape)


@register("StringSplit", since=20)
def string_split(ctx: OpContext, X, *, delimiter=None, maxsplit=None):
    """Split each string on `delimiter` (on runs of whitespace, trimmed, when unset or empty), at most
    `maxsplit` times. Y is X's shape plus one axis padded with "" to the most pieces; Z counts them."""
    limit = -1 if maxsplit is None else maxsplit
    separator = delimiter or None
    pieces = [s.split(separator, limit) for s in X.reshape(-1)]
    width = max((len(p) for p in pieces), default=0)
    out = np.full((len(pieces), width), "", dtype=object)
    for row, parts in enumerate(pieces):
        out[row, : len(parts)] = parts
    counts = torch.tensor([len(p) for p in pieces], dtype=torch.int64, device=ctx.device)
    return out.reshape((*X.shape, width)), counts.reshape(X.shape)


@register("StringNormalizer", since=10)
def string_normalizer(ctx: OpContext, X, *, case_change_action="NONE", is_case_sensitive=0, locale="", stopwords=None):
    """Drop `stopwords` (compared case-insensitively unless `is_case_sensitive`) from a [C] or [1, C]
    tensor, then apply `case_change_action` (LOWER, UPPER or NONE). When every element is dropped the
    output is [""] (shape [1], or [1, 1] for a [1, C] input)."""
    if X.ndim not in (1, 2) or (X.ndim == 2 and X.shape[0] != 1):
        raise ValueError(f"StringNormalizer takes a [C] or [1, C] tensor, not shape {list(X.shape)}")
    if is_case_sensitive:
        stop = set(stopwords or [])
        kept = [s for s in X.reshape(-1) if s not in stop]
    else:
        stop = {w.lower() for w in stopwords or []}
        kept = [s for s in X.reshape(-1) if s.lower() not in stop]
    if case_change_action == "LOWER":
        kept = [s.lower() for s in kept]
    elif case_change_action == "UPPER":
        kept = [s.upper() for s in kept]
    elif case_change_action != "NONE":
        raise ValueError(f"unknown case_change_action {case_change_action!r}")
    out = _strings(kept or [""])
    return out.reshape(1, -1) if X.ndim == 2 else out


@register("TfIdfVectorizer", since=9)
def tfidf_vectorizer(
    ctx: OpContext, X, *, max_gram_length, max_skip_count, min_gram_length, mode, ngram_counts,
    ngram_indexes, pool_int64s=None, pool_strings=None, weights=None,
):  # fmt: skip
    """Count the pool's n-grams (n in [min_gram_length, max_gram_length]) in each row of a [C] or
    [N, C] input; an n-gram takes every (skip + 1)-th item for each skip in [0, max_skip_count]
    (1-grams are counted once). Pool n-gram i counts into output column ngram_indexes[i]. Mode TF keeps
    counts, IDF clips them to 1 and scales by `weights`, TFIDF scales counts by `weights`."""
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"unknown TfIdfVectorizer mode {mode!r}")
    pool = _ngram_pool(pool_strings if pool_strings is not None else pool_int64s, ngram_counts)
    width = max(ngram_indexes) + 1
    rows = X.reshape(1, -1) if X.ndim == 1 else X
    tokens = rows.tolist()
    counts = torch.zeros((len(tokens), width), dtype=torch.float32)
    for row, items in enumerate(tokens):
        for n in range(max(min_gram_length, 1), max_gram_length + 1):
            for skip in range(max_skip_count + 1 if n > 1 else 1):
                step = skip + 1
                for start in range(len(items) - (n - 1) * step):
                    index = pool.get(tuple(items[start : start + (n - 1) * step + 1 : step]))
                    if index is not None:
                        counts[row, ngram_indexes[index]] += 1
    scale = torch.ones(width) if weights is None else _scatter(weights, ngram_indexes, width)
    if mode == "IDF":
        counts = counts.clamp(max=1) * scale
    elif mode == "TFIDF":
        counts = counts * scale
    counts = counts.to(ctx.device)
    return counts[0] if X.ndim == 1 else counts


def _ngram_pool(pool: Sequence, ngram_counts: Sequence[int]) -> dict[tuple, int]:
    """Pool n-gram tuple -> its ordinal: entries from ngram_counts[k] on are (k + 1)-grams."""
    items = list(pool)
    bounds = [*ngram_counts, len(items)]
    lookup: dict[tuple, int] = {}
    for k in range(len(ngram_counts)):
        n = k + 1
        for offset in range(bounds[k], bounds[k + 1], n):
            lookup[tuple(items[offset : offset + n])] = len(lookup)
    return lookup


def _scatter(weights: Sequence[float], indexes: Sequence[int], width: int) -> torch.Tensor:
    scale = torch.zeros(width)
    scale[list(indexes)] = torch.tensor(weights, dtype=torch.float32)
    return scale
