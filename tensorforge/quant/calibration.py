"""Post-training calibration: run the float model over calibration batches, observe every tensor a quantized
layer reads (and each layer's output), and turn the observed ranges into per-tensor int8 scales.

The input of a depthwise convolution is also observed per channel (its channels' maxima over the data, the
minmax rule): BatchNorm-folded depthwise networks feed them channels whose ranges differ a hundredfold, which
one per-tensor scale crushes into a few levels, while a per-channel input scale folds into the per-channel
dequantization at no cost to a kernel (`passes.utils.is_depthwise`). The table keeps both; `per_tensor()`
drops the channel ranges.

`collect_histograms` runs the model once over the data; `table_from_histograms` applies a calibrator, so
several methods can be compared on one pass; `calibrate` does both. Calibration data is a sequence of feeds
(input name → array), checked against the model's inputs batch by batch; `load_calibration_data` reads them
from .npy / .npz files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..ir import Model, Value
from ..ir.clone import clone_model
from ..ops.executor import Executor, bind_feeds
from ..passes.utils import is_depthwise
from .calibrators import check_method, compute_amax
from .fingerprint import model_fingerprint
from .histogram import DEFAULT_BINS, Histogram
from .layers import quantizable_layers
from .scale import MIN_SCALE, QMAX, symmetric_scale, symmetric_scales


@dataclass(frozen=True, slots=True)
class TensorRange:
    """A calibrated tensor: its clipping threshold and the symmetric int8 scale `amax / 127`."""

    amax: float
    scale: float


@dataclass
class CalibrationTable:
    """Per-tensor ranges from one calibration method, for the model with `fingerprint`."""

    method: str
    params: dict[str, Any]
    fingerprint: str
    ranges: dict[str, TensorRange]
    batches: int = 0
    channels: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per-channel amax of depthwise inputs

    def scale(self, name: str, qmax: float = QMAX) -> float:
        """The symmetric scale of tensor `name` for a type whose largest value is `qmax` (int8's 127 by
        default, 448 for float8 E4M3)."""
        entry = self.ranges.get(name)
        if entry is None:
            raise InputError(
                f"the calibration table has no range for tensor {name!r}: it was computed for another model "
                "or another optimization of it; calibrate the model being quantized"
            )
        return entry.scale if qmax == QMAX else max(entry.amax / qmax, MIN_SCALE)

    def channel_scales(self, name: str, qmax: float = QMAX) -> torch.Tensor | None:
        """float32 per-channel scales `amax[c] / qmax` of tensor `name`, or None when it has no channel ranges."""
        amax = self.channels.get(name)
        if amax is None:
            return None
        return symmetric_scales(torch.tensor(amax, dtype=torch.float64), qmax)

    def per_tensor(self) -> CalibrationTable:
        """This table without channel ranges: every activation quantized per tensor."""
        return replace(self, channels={})


@dataclass
class CalibrationStatistics:
    """Histograms of every observed tensor, over `batches` calibration batches."""

    fingerprint: str
    histograms: dict[str, Histogram]
    batches: int = 0
    samples: int = 0
    channel_amax: dict[str, torch.Tensor] = field(default_factory=dict)  # depthwise inputs: max |x| per channel


def observed_tensors(model: Model) -> list[Value]:
    """The activations quantized layers read, then their outputs, without repeats, in graph order."""
    seen: dict[str, Value] = {}
    layers = quantizable_layers(model)
    for layer in layers:
        for value in layer.activations:
            seen.setdefault(value.name, value)
    for layer in layers:
        seen.setdefault(layer.output.name, layer.output)
    return list(seen.values())


def depthwise_inputs(model: Model) -> list[Value]:
    """The activations depthwise convolutions read (observed per channel too), without repeats."""
    seen: dict[str, Value] = {}
    for layer in quantizable_layers(model):
        if is_depthwise(layer.node) and not layer.operands[0].is_weight:
            seen.setdefault(layer.node.inputs[0].name, layer.node.inputs[0])
    return list(seen.values())


def collect_histograms(
    model: Model,
    feeds: Iterable[Mapping[str, Any]],
    *,
    device: str | torch.device = "cpu",
    bins: int = DEFAULT_BINS,
) -> CalibrationStatistics:
    """Run `model` in float over `feeds` on `device` and histogram every observed tensor."""
    observed = [v.name for v in observed_tensors(model)]
    if not observed:
        raise InputError("the model has no quantizable layer (Conv, ConvTranspose, Gemm, MatMul): nothing to calibrate")
    per_channel = [v.name for v in depthwise_inputs(model)]
    executor = Executor(_observing(model, observed), device)
    stats = CalibrationStatistics(model_fingerprint(model), {name: Histogram(bins) for name in observed})
    for index, feed in enumerate(feeds):
        source = f"calibration batch {index}"
        check_batch(model, feed, source)
        results = executor.run(feed)
        for name in observed:
            try:
                stats.histograms[name].add(results[name])
            except ValueError as err:
                raise InputError(f"{source}: tensor {name!r}: {err}; the float model overflows on this batch") from None
        for name in per_channel:
            _add_channel_amax(stats.channel_amax, name, results[name])
        stats.batches += 1
        stats.samples += _batch_size(feed)
    if stats.batches == 0:
        raise InputError("the calibration set is empty: give at least one batch of inputs")
    return stats


def table_from_histograms(
    stats: CalibrationStatistics, method: str = "entropy", params: Mapping[str, Any] | None = None
) -> CalibrationTable:
    """Apply calibrator `method` (with `params`) to each observed tensor's histogram."""
    check_method(method, params)
    ranges = {}
    for name, hist in stats.histograms.items():
        amax = compute_amax(hist, method, params)
        ranges[name] = TensorRange(amax, symmetric_scale(amax))
    channels = {name: tuple(amax.tolist()) for name, amax in stats.channel_amax.items()}
    return CalibrationTable(method, dict(params or {}), stats.fingerprint, ranges, stats.batches, channels)


def calibrate(
    model: Model,
    feeds: Iterable[Mapping[str, Any]],
    method: str = "entropy",
    *,
    params: Mapping[str, Any] | None = None,
    device: str | torch.device = "cpu",
    bins: int = DEFAULT_BINS,
) -> CalibrationTable:
    """Per-tensor int8 scales for `model` from the calibration batches `feeds` (input name → array).

    `method` is one of minmax, entropy, percentile (params: percentile, default 99.99) or mse; the float
    model runs through the reference executor on `device`.
    """
    check_method(method, params)
    return table_from_histograms(collect_histograms(model, feeds, device=device, bins=bins), method, params)


def _add_channel_amax(amax: dict[str, torch.Tensor], name: str, tensor: torch.Tensor) -> None:
    """Fold the channel maxima of `tensor` (N, C, ...) into `amax[name]` (float64, on the CPU)."""
    dims = [d for d in range(tensor.dim()) if d != 1]
    observed = tensor.detach().abs().amax(dim=dims).double().cpu()
    amax[name] = torch.maximum(amax[name], observed) if name in amax else observed


def check_batch(model: Model, feed: Mapping[str, Any], source: str) -> None:
    """Raise an `InputError` naming `source` if `feed` does not fit the model's inputs or is not finite."""
    if not isinstance(feed, Mapping):
        raise InputError(f"{source}: a batch must map input names to arrays, got {type(feed).__name__}")
    try:
        tensors = bind_feeds(model.graph, feed, torch.device("cpu"))
    except InputError as err:
        raise InputError(f"{source}: {err}") from None
    for value, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise InputError(
                f"{source}: input {value.name!r} holds {bad} NaN or Inf value(s); calibration needs finite data"
            )


def load_calibration_data(path: str | os.PathLike[str], model: Model) -> list[dict[str, np.ndarray]]:
    """Calibration batches from a directory of .npy / .npz files (one batch per file, in name order) or from
    one such file. A .npy file holds the single input of a one-input model; a .npz file holds one array per
    input name. Every batch is checked against the model's inputs."""
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.suffix in (".npy", ".npz") and p.is_file())
        if not files:
            raise InputError(f"calibration directory {root} holds no .npy or .npz files: the calibration set is empty")
    elif root.is_file():
        if root.suffix not in (".npy", ".npz"):
            raise InputError(f"calibration file {root} is not .npy or .npz")
        files = [root]
    else:
        raise InputError(f"calibration data {root} does not exist")
    batches = []
    for file in files:
        feed = _load_batch(file, model)
        check_batch(model, feed, f"calibration file {file}")
        batches.append(feed)
    return batches


def _load_batch(file: Path, model: Model) -> dict[str, np.ndarray]:
    inputs = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
    try:
        loaded = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise InputError(f"calibration file {file} cannot be read as {file.suffix}: {err}") from None
    if file.suffix == ".npz":
        with loaded:
            return {name: loaded[name] for name in loaded.files}
    if len(inputs) != 1:
        raise InputError(
            f"calibration file {file} holds one array, but the model has inputs {inputs}: "
            "use .npz files with one array per input name"
        )
    return {inputs[0]: loaded}


def _observing(model: Model, names: list[str]) -> Model:
    """A copy of `model` whose outputs also include the values named `names`."""
    copy = clone_model(model)
    graph = copy.graph
    by_name = {v.name: v for v in graph.inputs}
    for node in graph.nodes:
        by_name.update((v.name, v) for v in node.outputs if v.name)
    present = {v.name for v in graph.outputs}
    graph.outputs = [*graph.outputs, *(by_name[n] for n in names if n not in present)]
    return copy


def _batch_size(feed: Mapping[str, Any]) -> int:
    first = next(iter(feed.values()), None)
    shape = getattr(first, "shape", ())
    return int(shape[0]) if len(shape) else 1
