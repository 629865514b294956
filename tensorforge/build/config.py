"""`BuildConfig`: everything a build may choose from, in one typed object stored in the engine header.

Optimization profiles follow Polygraphy's `Profile().add(name, min, opt, max)`: for each dynamic input, the
smallest, the tuned-for and the largest shape an engine accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8")
# The quantized precisions: their layers read scales from calibration (`QuantizationConfig`).
QUANTIZED_PRECISIONS = {"int8": "int8", "fp8": "fp8e4m3"}
EFFORT_LEVELS = (0, 1, 2)
CALIBRATION_METHODS = ("minmax", "entropy", "percentile", "mse", "auto")
TARGET_METRICS = ("cosine", "top1")
CHAIN_MODES = ("auto", "always", "off")  # QuantizationConfig.chain
# BuildConfig.sparsity: 2:4 sparse kernels off; where a layer's weight already has the pattern (a model pruned and
# fine-tuned so); or every eligible weight pruned to the pattern first (changes the answers: to measure the speed)
SPARSITY_MODES = ("off", "auto", "force")

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeRange:
    min: Shape
    opt: Shape
    max: Shape

    def contains(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= s <= hi for lo, s, hi in zip(self.min, shape, self.max, strict=True)
        )


@dataclass(frozen=True)
class Profile:
    """Shape ranges of the dynamic inputs, by input name."""

    ranges: Mapping[str, ShapeRange] = field(default_factory=dict)

    def add(self, name: str, min: Shape, opt: Shape, max: Shape) -> Profile:
        lo, mid, hi = (tuple(int(d) for d in s) for s in (min, opt, max))
        if not len(lo) == len(mid) == len(hi):
            raise InputError(f"profile for {name!r}: min {lo}, opt {mid} and max {hi} must have the same rank")
        if not all(a <= b <= c for a, b, c in zip(lo, mid, hi, strict=True)):
            raise InputError(f"profile for {name!r}: need min <= opt <= max on every axis, got {lo}, {mid}, {hi}")
        if any(d < 0 for d in lo):
            raise InputError(f"profile for {name!r}: negative dimension in {lo}")
        return Profile({**self.ranges, name: ShapeRange(lo, mid, hi)})

    def problems(self, shapes: Mapping[str, Shape]) -> list[str]:
        """Why `shapes` fall outside this profile (empty when they fit)."""
        found = []
        for name, shape_range in self.ranges.items():
            shape = shapes.get(name)
            if shape is not None and not shape_range.contains(tuple(shape)):
                found.append(
                    f"input {name!r} has shape {list(shape)}, outside the profile's "
                    f"min {list(shape_range.min)} .. max {list(shape_range.max)}"
                )
        return found

    def to_dict(self) -> dict[str, Any]:
        return {name: {"min": r.min, "opt": r.opt, "max": r.max} for name, r in self.ranges.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        profile = cls()
        for name, r in data.items():
            profile = profile.add(name, tuple(r["min"]), tuple(r["opt"]), tuple(r["max"]))
        return profile


@dataclass(frozen=True)
class QuantizationConfig:
    """How an int8 / fp8 build gets its scales and which layers stay float.

    `data`: calibration batches (a .npy / .npz file or a directory of them); `method` and `percentile` choose
    the calibrator ("auto": each of `quant.COMPARED_CALIBRATORS`, keeping the one whose all-quantized model
    agrees best with float on the calibration data, by the target's metric or else cosine); `cache`: a
    calibration cache file, read when it exists (it must belong to this model), else written; `target`: an
    accuracy the engine must keep against float on the calibration data, as (metric, value) with metric "cosine"
    (mean output cosine) or "top1" (argmax agreement): the most sensitive layers return to float until it is
    met; `keep_float`: layers (node names) the user keeps float; `chain`: whether quantized layers pass
    quantized activations to the quantized layers that read them (`passes.quant_chain`): "auto" tunes the
    chained graph too and keeps it when its plan times faster (chained wherever the graph allows, else only
    between the layers the unchained plan runs quantized); "always" chains wherever the graph allows, before
    tuning; "off": every quantized layer reads and writes float.
    `depthwise_channels`: a depthwise convolution's input quantizes with one scale per channel (its channels'
    calibrated maxima; free for the kernels, see `quant.calibration`); False: per tensor, as other activations.
    """

    data: str | None = None
    method: str = "entropy"
    percentile: float | None = None
    cache: str | None = None
    target: tuple[str, float] | None = None
    keep_float: tuple[str, ...] = ()
    chain: str = "auto"
    depthwise_channels: bool = True

    def __post_init__(self) -> None:
        if self.chain not in CHAIN_MODES:
            raise InputError(f"unknown chaining mode {self.chain!r}: choose from {list(CHAIN_MODES)}")
        if self.method not in CALIBRATION_METHODS:
            raise InputError(f"unknown calibration method {self.method!r}: choose from {list(CALIBRATION_METHODS)}")
        if self.percentile is not None and (self.method != "percentile" or not 0 < self.percentile <= 100):
            raise InputError("a percentile (in (0, 100]) goes with the percentile calibration method only")
        if self.target is not None:
            metric, value = self.target
            if metric not in TARGET_METRICS or not 0 <= value <= 1:
                raise InputError(
                    f"accuracy target {metric}={value}: the metric is one of {list(TARGET_METRICS)}, "
                    "the value in [0, 1]"
                )

    @property
    def params(self) -> dict[str, Any]:
        return {} if self.percentile is None else {"percentile": self.percentile}

    def to_dict(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "method": self.method,
            "percentile": self.percentile,
            "cache": self.cache,
            "target": None if self.target is None else list(self.target),
            "keep_float": list(self.keep_float),
            "chain": self.chain,
            "depthwise_channels": self.depthwise_channels,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantizationConfig:
        target = data.get("target")
        return cls(
            data=data.get("data"),
            method=data.get("method", "entropy"),
            percentile=data.get("percentile"),
            cache=data.get("cache"),
            target=None if target is None else (str(target[0]), float(target[1])),
            keep_float=tuple(data.get("keep_float", ())),
            chain=str(data.get("chain", "auto")),
            depthwise_channels=bool(data.get("depthwise_channels", True)),
        )


def parse_target(text: str) -> tuple[str, float]:
    """`"cosine=0.999"` → ("cosine", 0.999)."""
    metric, sep, value = text.partition("=")
    try:
        parsed = float(value)
    except ValueError:
        parsed = None
    if not sep or parsed is None:
        raise InputError(f"accuracy target {text!r}: write METRIC=VALUE, e.g. cosine=0.999 or top1=0.99")
    return metric.strip(), parsed


@dataclass(frozen=True)
class BuildConfig:
    device: str = "cpu"
    precisions: tuple[str, ...] = ("fp32",)
    profiles: tuple[Profile, ...] = ()
    effort: int = 1
    workspace_bytes: int = 1 << 30
    timing_cache: str | None = None
    tactic_families: tuple[str, ...] | None = None  # None: every family
    quantization: QuantizationConfig | None = None  # scales of int8 / fp8 layers
    # compile first, in parallel: on CUDA every layer's candidates (tactics.precompile), on the CPU our C++ kernels
    precompile: bool = True
    sparsity: str = "auto"  # SPARSITY_MODES

    def __post_init__(self) -> None:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise InputError(f"unknown device {self.device!r}: use cpu, cuda or cuda:N")
        unknown = [p for p in self.precisions if p not in PRECISIONS]
        if unknown:
            raise InputError(f"unknown precision(s) {unknown}: choose from {list(PRECISIONS)}")
        quantized = [p for p in self.precisions if p in QUANTIZED_PRECISIONS]
        if len(quantized) > 1:
            raise InputError(f"choose one quantized precision, not {quantized}")
        if "fp32" not in self.precisions:
            raise InputError("fp32 must stay allowed: it is the fallback for layers without a faster precision")
        if self.effort not in EFFORT_LEVELS:
            raise InputError(f"effort must be one of {list(EFFORT_LEVELS)}, got {self.effort}")
        if self.workspace_bytes < 0:
            raise InputError("the workspace limit must not be negative")
        if self.sparsity not in SPARSITY_MODES:
            raise InputError(f"sparsity must be one of {list(SPARSITY_MODES)}, got {self.sparsity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "precisions": list(self.precisions),
            "profiles": [p.to_dict() for p in self.profiles],
            "effort": self.effort,
            "workspace_bytes": self.workspace_bytes,
            "timing_cache": self.timing_cache,
            "tactic_families": None if self.tactic_families is None else list(self.tactic_families),
            "quantization": None if self.quantization is None else self.quantization.to_dict(),
            "precompile": self.precompile,
            "sparsity": self.sparsity,
        }

    @property
    def quantized_type(self) -> str | None:
        """The quantized type of the build's quantized layers ("int8", "fp8e4m3"), or None."""
        return next((QUANTIZED_PRECISIONS[p] for p in self.precisions if p in QUANTIZED_PRECISIONS), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildConfig:
        families = data.get("tactic_families")
        quantization = data.get("quantization")
        return cls(
            device=data["device"],
            precisions=tuple(data["precisions"]),
            profiles=tuple(Profile.from_dict(p) for p in data.get("profiles", [])),
            effort=data.get("effort", 1),
            workspace_bytes=data.get("workspace_bytes", 1 << 30),
            timing_cache=data.get("timing_cache"),
            tactic_families=None if families is None else tuple(families),
            quantization=None if quantization is None else QuantizationConfig.from_dict(quantization),
            precompile=data.get("precompile", True),
            sparsity=data.get("sparsity", "auto"),
        )


def parse_profile(items: list[str]) -> Profile:
    """`["x=1x3x224x224:8x3x224x224:32x3x224x224", "y=4x16"]` → a Profile (a single shape is min = opt = max)."""
    from ..feeds import parse_assignments, parse_shape

    profile = Profile()
    for name, text in parse_assignments(items, "--profile").items():
        parts = [parse_shape(part) for part in text.split(":")]
        if len(parts) == 1:
            parts *= 3
        if len(parts) != 3:
            raise InputError(f"--profile {name}={text}: give one shape or min:opt:max")
        profile = profile.add(name, *parts)
    return profile
