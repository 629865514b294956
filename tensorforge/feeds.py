"""Input feeds for a model: parsing `--shape`/`--input` options and random data of the declared types."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from .errors import InputError
from .ir import DType, Model, Value, format_type
from .tensors import from_numpy


def parse_shape(text: str) -> tuple[int, ...]:
    """`1x3x224x224` (or `1,3,224,224`) → (1, 3, 224, 224); `scalar` or an empty string → ()."""
    text = text.strip().lower()
    if text in ("", "scalar"):
        return ()
    try:
        dims = tuple(int(d) for d in text.replace(",", "x").split("x"))
    except ValueError:
        raise InputError(f"cannot read shape {text!r}: write it like 1x3x224x224") from None
    if any(d < 0 for d in dims):
        raise InputError(f"shape {text!r} has a negative dimension")
    return dims


def parse_assignments(items: list[str], what: str) -> dict[str, str]:
    """`["a=1x3", "b=2"]` → {"a": "1x3", "b": "2"}, with a clear error for a malformed item."""
    parsed = {}
    for item in items:
        name, sep, rest = item.rpartition("=")
        if not sep or not name:
            raise InputError(f"{what} {item!r} must look like NAME=VALUE")
        parsed[name] = rest
    return parsed


def resolve_shape(value: Value, given: tuple[int, ...] | None) -> tuple[int, ...]:
    if given is not None:
        return given
    if value.shape is None:
        raise InputError(f"input {value.name!r} has no declared shape: give one with --shape {value.name}=1x3x224x224")
    dynamic = [d for d in value.shape if not isinstance(d, int)]
    if dynamic:
        raise InputError(
            f"input {value.name!r} ({format_type(value.dtype, value.shape)}) has dynamic dims "
            f"{[d or '?' for d in dynamic]}: give its shape with --shape {value.name}=..."
        )
    return tuple(int(d) for d in value.shape)


def random_tensor(dtype: DType, shape: tuple[int, ...], rng: np.random.Generator) -> torch.Tensor:
    """Random data of `dtype`: normal floats, small non-negative integers, fair booleans."""
    if dtype == DType.BOOL:
        return torch.from_numpy(rng.random(shape) < 0.5)
    if dtype.is_integer:
        return torch.from_numpy(rng.integers(0, 8, size=shape)).to(dtype.torch)
    if dtype.is_float:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dtype.torch)
    raise InputError(f"cannot make random data of type {dtype}: give the input with --input")


def build_feeds(
    model: Model,
    files: Mapping[str, str | Path],
    shapes: Mapping[str, tuple[int, ...]],
    seed: int = 0,
) -> dict[str, torch.Tensor | np.ndarray]:
    """Feeds from `.npy` files where given, random data of the declared (or `shapes`) shape elsewhere."""
    graph = model.graph
    names = {v.name for v in graph.inputs}
    for name in [*files, *shapes]:
        if name not in names:
            raise InputError(f"the model has no input {name!r}; its inputs are {sorted(names)}")
    rng = np.random.default_rng(seed)
    feeds: dict[str, torch.Tensor | np.ndarray] = {}
    for value in graph.inputs:
        if value.name in files:
            feeds[value.name] = from_numpy(_load_npy(files[value.name], value.name))
        elif value.name not in graph.initializers:
            dtype = value.dtype if value.dtype != DType.UNDEFINED else DType.FLOAT
            feeds[value.name] = random_tensor(dtype, resolve_shape(value, shapes.get(value.name)), rng)
    return feeds


def _load_npy(path: str | Path, name: str) -> np.ndarray:
    path = Path(path)
    if not path.exists():
        raise InputError(f"input file {str(path)!r} for {name!r} does not exist")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise InputError(f"input file {str(path)!r} for {name!r} is not a readable .npy array: {err}") from None
