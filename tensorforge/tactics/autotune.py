"""The autotuner: time every supported candidate of a layer on real inputs and pick the fastest correct one.

A candidate is a tactic × one of its configs × a variant (precision and layout, `variant.py`). Each first
runs once and is compared with the reference tactic's float32 output on the same inputs (max-norm relative
error within the tolerance of its precision, below); a wrong or failing candidate scores inf. Correct ones
are timed with `timing.measure` on the inputs as the producers deliver them, so a cast or a memory-format
change a variant needs is part of its time. Results are kept in a `TimingCache` under the layer's signature,
so a rebuild with the cache re-times nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import DType, Node, qualified_op
from ..ops.math_flags import full_float32
from . import cuda_family, triton_conv, triton_family, triton_gemm, triton_pointwise, vendor  # noqa: F401 - registers the tactic families
from .base import Tactic, tactics_for
from .timing import Timing, TimingBudget, measure
from .timing_cache import TimingCache, describe, device_key, signature, software_versions
from .variant import (
    ConstantCache,
    LayerKernel,
    Variant,
    constant_inputs,
    convert,
    prepare_constants,
    variants,
)

# Largest max-norm relative error a candidate may have against the float32 reference, by its precision;
# outputs the graph declares in another float type (float64, float16) are held to that type's bound.
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 5e-3, "bf16": 3e-2}
DTYPE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
_REFERENCE_VARIANT = Variant("fp32", "NCHW")


@dataclass
class Candidate:
    """One candidate of a layer and its score (inf: unsupported, failed or wrong; `note` says which)."""

    tactic: str
    config: dict[str, Any]
    median_ms: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        time = self.median_ms if math.isfinite(self.median_ms) else None
        return {"tactic": self.tactic, "config": self.config, "median_ms": time, "note": self.note}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        time = data["median_ms"]
        return cls(data["tactic"], dict(data["config"]), math.inf if time is None else float(time), data["note"])


@dataclass
class Choice:
    tactic: str
    config: dict[str, Any]
    median_ms: float
    candidates: list[Candidate] = field(default_factory=list)
    from_cache: bool = False

    def table(self, layer: str) -> str:
        """The build-log table: each candidate's time and % of the best, the winner marked."""
        lines = [f"{layer}: {self.tactic} {self.median_ms:.4f} ms" + (" (timing cache)" if self.from_cache else "")]
        for c in sorted(self.candidates, key=lambda c: c.median_ms):
            share = f"{100 * c.median_ms / self.median_ms:7.1f}%" if math.isfinite(c.median_ms) else "    inf"
            mark = "*" if (c.tactic, c.config) == (self.tactic, self.config) else " "
            time = f"{c.median_ms:9.4f} ms" if math.isfinite(c.median_ms) else "      inf"
            lines.append(f"  {mark} {c.tactic:<24} {time} {share}  {c.note}".rstrip())
        return "\n".join(lines)


def layer_signature(node: Node, inputs: Sequence[torch.Tensor | None], device: torch.device) -> tuple[str, str]:
    """The timing-cache key of `node` on `inputs` (shapes, dtypes and memory formats), and its description."""
    shapes = [None if t is None else list(t.shape) for t in inputs]
    dtypes = [None if t is None else t.dtype for t in inputs]
    layout = "NHWC" if any(_channels_last(t) for t in inputs) else "NCHW"
    op = qualified_op(node)
    key = signature(device_key(device), software_versions(), op, shapes, dtypes, layout, dict(node.attributes))
    return key, describe(op, shapes, dtypes, layout)


def _channels_last(tensor: torch.Tensor | None) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.dim() == 4
        and tensor.is_contiguous(memory_format=torch.channels_last)
        and not tensor.is_contiguous()
    )


def autotune(
    node: Node,
    opset: int,
    inputs: Sequence[torch.Tensor | None],
    device: torch.device | str,
    *,
    effort: int = 1,
    precisions: Sequence[str] = ("fp32",),
    families: Sequence[str] | None = None,
    cache: TimingCache | None = None,
    constants: ConstantCache | None = None,
) -> Choice:
    """The fastest correct candidate for `node` on `inputs` (on `device`), with every candidate's score.

    `inputs` are the layer's inputs as its producers deliver them (a constant input may be passed as None:
    the node's value is used). `precisions` are the ones the build allows; `constants` caches the converted
    weights across layers and calls.
    """
    device = torch.device(device)
    constants = {} if constants is None else constants
    inputs = _with_constants(node, inputs, device)
    key, description = layer_signature(node, inputs, device)
    reference = _reference_outputs(node, opset, inputs, device)
    budget = TimingBudget.for_effort(effort)
    candidates = []
    from_cache = cache is not None and key in cache
    for tactic in tactics_for(node, None):
        if families is not None and tactic.family not in families and tactic.family != "reference":
            continue
        reason = tactic.supports(node, opset, device)
        if reason is not None:
            candidates.append(Candidate(tactic.key, {}, math.inf, f"unsupported: {reason}"))
            continue
        for variant in variants(tactic, node, precisions, device):
            for space_config in tactic.space(effort):
                config = {"precision": variant.precision, "layout": variant.layout, **space_config}
                cached = cache.get(key, tactic.key, config) if cache is not None else None
                if cached is not None:
                    note = f"cached failure: {cached.error}" if cached.error else "cached"
                    candidates.append(Candidate(tactic.key, config, cached.median_ms, note))
                    continue
                trial = _Trial(tactic, node, opset, device, config, constants)
                candidate, timing = trial.run(inputs, reference, budget)
                candidates.append(candidate)
                if cache is not None and timing is not None:
                    cache.record(key, tactic.key, config, timing, description=description)
    best = min(candidates, key=lambda c: c.median_ms)
    if not math.isfinite(best.median_ms):
        notes = "; ".join(f"{c.tactic} {_short(c.config)}: {c.note}" for c in candidates)
        raise RuntimeError(f"{node.label}: no tactic ran correctly ({notes})")
    return Choice(best.tactic, best.config, best.median_ms, candidates, from_cache)


def build_layer_kernel(
    tactic: Tactic,
    node: Node,
    opset: int,
    device: torch.device,
    config: dict[str, Any],
    constants: ConstantCache,
) -> LayerKernel:
    """`tactic`'s kernel for `node` in the config's variant, its weights converted once (shared via `constants`)."""
    variant = Variant.of(config)
    space_config = {k: v for k, v in config.items() if k not in ("precision", "layout")}
    kernel = tactic.build(node, opset, device, space_config)
    constants = prepare_constants(node, variant, device, constants)
    return LayerKernel(node, kernel, variant, constants, writes_into=tactic.writes_into)


def _short(config: dict[str, Any]) -> str:
    return "/".join(str(v) for v in config.values())


def _with_constants(node: Node, inputs: Sequence[torch.Tensor | None], device: torch.device) -> list[Any]:
    """`inputs` padded to the node's arity, each constant input taken from the graph (on `device`)."""
    full = list(inputs) + [None] * (len(node.inputs) - len(inputs))
    for index, value in constant_inputs(node).items():
        if full[index] is None:
            const = value.const
            full[index] = const.to(device) if isinstance(const, torch.Tensor) else const
    return full


def _activations(node: Node, inputs: Sequence[Any]) -> list[Any]:
    """The call arguments of a `LayerKernel`: the non-constant present inputs, in order."""
    consts = constant_inputs(node)
    return [t for i, (t, v) in enumerate(zip(inputs, node.inputs, strict=True)) if v is not None and i not in consts]


def _reference_outputs(node, opset, inputs, device) -> tuple[torch.Tensor, ...]:
    from .vendor import ReferenceTactic

    declared = [v.dtype if v is not None else DType.UNDEFINED for v in node.inputs]
    plain = [convert(t, d, _REFERENCE_VARIANT) for t, d in zip(inputs, declared, strict=True)]
    with torch.inference_mode(), full_float32():
        return ReferenceTactic().build(node, opset, device, {})(plain)


class _Trial:
    """One candidate: build it, check it against the reference, time it."""

    def __init__(self, tactic: Tactic, node: Node, opset: int, device: torch.device, config, constants) -> None:
        self.tactic, self.node, self.opset, self.device = tactic, node, opset, device
        self.config, self.constants = config, constants

    def _fail(self, note: str) -> tuple[Candidate, None]:
        return Candidate(self.tactic.key, self.config, math.inf, note), None

    def run(self, inputs, reference, budget: TimingBudget) -> tuple[Candidate, Timing | None]:
        args = _activations(self.node, inputs)
        variant = Variant.of(self.config)
        try:
            kernel = build_layer_kernel(self.tactic, self.node, self.opset, self.device, self.config, self.constants)
            with torch.inference_mode(), full_float32():
                outputs = kernel(args)
            is_reference = self.tactic.family == "reference" and variant.precision == "fp32"
            problem = "" if is_reference else _mismatch(outputs, reference, kernel.out_dtypes, variant)
        except Exception as err:  # a failing candidate scores inf; the build goes on
            return self._fail(f"failed: {type(err).__name__}: {err}")
        if problem:
            return self._fail(f"wrong result: {problem}")

        def call():
            with torch.inference_mode(), full_float32():
                kernel(args)

        timing = measure(call, device=self.device, **budget.as_kwargs())
        note = "" if timing.ok else f"failed while timed: {timing.error}"
        return Candidate(self.tactic.key, self.config, timing.median, note), timing


def _mismatch(
    outputs: Sequence[torch.Tensor],
    reference: Sequence[torch.Tensor],
    expected_dtypes: Sequence[torch.dtype | None],
    variant: Variant,
) -> str:
    if any(want is not None for want in reference[len(outputs) :]):
        return f"{len(outputs)} outputs, expected {len(reference)}"
    for index, (got, want) in enumerate(zip(outputs, reference, strict=False)):
        if not isinstance(want, torch.Tensor):
            continue
        dtype = expected_dtypes[index] if index < len(expected_dtypes) and expected_dtypes[index] else want.dtype
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != dtype:
            shown = f"{DType.from_torch(got.dtype)}{list(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)
            return f"output {index} is {shown}, expected {DType.from_torch(dtype)}{list(want.shape)}"
        if not want.is_floating_point():
            if not torch.equal(got, want):
                return f"output {index} differs"
            continue
        bound = TOLERANCE[variant.precision] if want.dtype == torch.float32 else DTYPE_TOLERANCE.get(want.dtype, 1e-4)
        error = relative_error(got, want)
        if not error <= bound:
            return f"output {index} relative error {error:.2e} > {bound:g}"
    return ""


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max|got − want| / max|want| over the finite elements of `want`; NaN and ±inf must match exactly
    (inf when they do not, so a half-precision overflow is an error)."""
    got, want = got.double(), want.double()
    finite, nan = torch.isfinite(want), torch.isnan(want)
    infinite = ~finite & ~nan
    if not torch.equal(torch.isnan(got), nan) or not torch.equal(got[infinite], want[infinite]):
        return math.inf
    if not finite.any():
        return 0.0
    scale = want[finite].abs().max().item()
    difference = (got[finite] - want[finite]).abs().max().item()
    if scale == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / scale
