"""The quantization step of an int8 / fp8 build, between graph optimization and tuning.

1. Scales: from the calibration cache when it exists (it must belong to this optimized model), else by
   calibrating the optimized float model on the calibration data (the reference executor on the build's
   device; method "auto" tries each calibrator and keeps the one whose all-quantized model agrees best with
   float there), then written to the cache when one is named. Depthwise convolutions' inputs quantize per channel
   unless the config says otherwise (`depthwise_channels`).
2. Layers: with an accuracy target, the mixed-precision search returns the most sensitive layers to float
   until the simulated int8 model meets it on the calibration data; layers the user names stay float too.
   Unless chaining is off, the simulation also rounds the residuals the chained engine will add from their
   quantized values (`simulate_quantized(residuals=True)`), so the builder may keep those quantized.
3. Every other calibrated FusedConv becomes a QuantizedConv (`quant.lower`); the report says which layers
   stayed float and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..ir import Model, format_type
from ..quant import (
    Target,
    best_calibrator,
    calibrate,
    calibrator_label,
    collect_histograms,
    load_calibration_data,
    mixed_precision,
    quantizable_layers,
    read_cache,
    residual_rounding,
    write_cache,
)
from ..quant.lower import lowerable, quantize_layers
from ..quant.simulate import rounded_residuals
from .config import BuildConfig, QuantizationConfig

Feeds = Iterable[Mapping[str, Any]]


def quantize_model(
    model: Model, config: BuildConfig, device: torch.device, calibration_data: Feeds | None = None
) -> dict[str, Any]:
    """Make `model`'s calibrated layers quantized (in place) and return the report's quantization section.

    `calibration_data` (batches of feeds) overrides `config.quantization.data`."""
    quant = config.quantized_type
    settings = config.quantization or QuantizationConfig()
    try:
        return _quantize(model, config, quant, settings, device, calibration_data)
    except InputError as error:
        if "bad inputs" not in str(error):
            raise
        shapes = ", ".join(f"{v.name} {format_type(v.dtype, v.shape)}" for v in _inputs(model))
        raise InputError(
            f"{error}\ncalibration batches must fit the shapes this engine is built for ({shapes}): give batches "
            "of those shapes, or a --profile or --shape that covers theirs"
        ) from None


def _inputs(model: Model) -> list:
    return [v for v in model.graph.inputs if v.name not in model.graph.initializers]


def _quantize(model, config, quant, settings, device, calibration_data) -> dict[str, Any]:
    feeds = _feeds(model, settings, calibration_data)
    fixed = lowerable(quantizable_layers(model))
    metric = settings.target[0] if settings.target else "cosine"  # how calibrators are compared ("auto")
    tried = {}
    cache = Path(settings.cache) if settings.cache else None
    if cache is not None and cache.exists():
        table = read_cache(cache, model)
        source = f"calibration cache {cache}"
    elif feeds is None:
        raise InputError(
            f"a {quant} build needs calibration data: give --calib FILE_OR_DIR (.npy / .npz batches) or a "
            "calibration cache made for this model (--calib-cache)"
        )
    elif settings.method == "auto":
        table, tried = _best_calibrator(model, feeds, settings, quant, device, [*fixed, *settings.keep_float], metric)
        source = f"{table.batches} calibration batches, {calibrator_label(table.method, table.params)} (auto)"
        if cache is not None:
            write_cache(table, cache)
    else:
        table = calibrate(model, feeds, settings.method, params=settings.params, device=device)
        source = f"{table.batches} calibration batches, {settings.method}"
        if cache is not None:
            write_cache(table, cache)
    if not settings.depthwise_channels:
        table = table.per_tensor()
    keep = list(settings.keep_float)
    reasons = {name: "kept in float by the build config" for name in keep}
    section: dict[str, Any] = {"type": quant, "scales": source, "method": table.method}
    if tried:
        section["calibrators"] = {"metric": metric, **{label: a.metric(metric) for label, a in tried.items()}}
    if table.channels:
        section["per_channel_inputs"] = sorted(table.channels)
    if settings.target is not None:
        if feeds is None:
            raise InputError("an accuracy target needs calibration data to measure it on: give --calib")
        result = mixed_precision(
            model, table, feeds, Target(*settings.target), device=device, fixed_float=[*fixed, *keep], quant=quant,
            residuals=settings.chain != "off",
        )  # fmt: skip
        keep += result.keep_float
        reasons.update(result.reasons)
        section["target"] = {
            "metric": settings.target[0],
            "value": settings.target[1],
            "all_quantized": result.all_quantized.metric(settings.target[0]),
            "achieved": result.achieved.metric(settings.target[0]),
            "met": result.met,
            "residuals": result.residuals,  # measured with the chained engine's quantized residuals
        }
    elif settings.chain != "off" and (
        rounding := _residual_rounding(model, table, feeds, quant, device, [*fixed, *keep])
    ):
        section["residual_rounding"] = rounding
    lowering = quantize_layers(model, table, keep_float=keep, quant=quant)
    reasons.update({name: why for name, why in lowering.left_float.items() if name not in reasons})
    section["quantized"] = list(lowering.quantized)
    section["float"] = reasons
    return section


def _residual_rounding(model, table, feeds, quant, device, fixed) -> dict[str, Any] | None:
    """Whether a chained engine may round its residual streams (without a target, which decides itself): only
    where measured on the calibration data to cost little accuracy (`quant.ROUNDING_LOSS_FACTOR`)."""
    if feeds is None:
        if not rounded_residuals(model, table, fixed, quant):
            return None
        return {"kept": False, "why": "not measured (a calibration cache without data): give --calib to measure it"}
    rounding = residual_rounding(model, table, feeds, device=device, fixed_float=fixed, quant=quant)
    return rounding.report() if rounding is not None else None


def _best_calibrator(model, feeds, settings, quant, device, fixed, metric):
    """The table of the calibrator whose all-quantized model agrees best by `metric` with float on `feeds` (the
    `fixed` layers stay float), and every calibrator's agreement."""
    stats = collect_histograms(model, feeds, device=device)
    if not settings.depthwise_channels:
        stats.channel_amax.clear()
    return best_calibrator(
        model, stats, feeds, metric, device=device, fixed_float=fixed, quant=quant, residuals=settings.chain != "off"
    )


def _feeds(model: Model, settings: QuantizationConfig, given: Feeds | None) -> list[Mapping[str, Any]] | None:
    if given is not None:
        return list(given)
    if settings.data is None:
        return None
    return load_calibration_data(settings.data, model)
