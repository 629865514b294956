"""The autotuner: time every supported candidate of a layer on real inputs and pick the fastest correct one.

Each candidate first runs once and is compared with the reference tactic's output (max-norm relative error
within the per-dtype tolerance below); a wrong or failing candidate scores inf. Correct ones are timed with
`timing.measure`; results are kept in a `TimingCache` under the layer's signature, so a rebuild with the cache
re-times nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import DType, Node, qualified_op
from . import vendor  # noqa: F401 - registers the reference and vendor families
from .base import Tactic, tactics_for
from .timing import Timing, TimingBudget, measure
from .timing_cache import TimingCache, describe, device_key, signature, software_versions

# Largest max-norm relative error a candidate may have against the reference, by output dtype.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


@dataclass
class Candidate:
    tactic: str
    config: dict[str, Any]
    median_ms: float
    note: str = ""


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
    shapes = [None if t is None else list(t.shape) for t in inputs]
    dtypes = [None if t is None else t.dtype for t in inputs]
    op = qualified_op(node)
    key = signature(device_key(device), software_versions(), op, shapes, dtypes, "NCHW", dict(node.attributes))
    return key, describe(op, shapes, dtypes, "NCHW")


def autotune(
    node: Node,
    opset: int,
    inputs: Sequence[torch.Tensor | None],
    device: torch.device | str,
    *,
    effort: int = 1,
    families: Sequence[str] | None = None,
    cache: TimingCache | None = None,
) -> Choice:
    """The fastest correct tactic for `node` on `inputs` (on `device`), with every candidate's score."""
    device = torch.device(device)
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
        for config in tactic.space(effort):
            cached = cache.get(key, tactic.key, config) if cache is not None else None
            if cached is not None:
                note = f"cached failure: {cached.error}" if cached.error else "cached"
                candidates.append(Candidate(tactic.key, config, cached.median_ms, note))
                continue
            candidate, timing = _try(tactic, node, opset, inputs, device, config, reference, budget)
            candidates.append(candidate)
            if cache is not None and timing is not None:
                cache.record(key, tactic.key, config, timing, description=description)
    best = min(candidates, key=lambda c: c.median_ms)
    if not math.isfinite(best.median_ms):
        notes = "; ".join(f"{c.tactic}: {c.note}" for c in candidates)
        raise RuntimeError(f"{node.label}: no tactic ran correctly ({notes})")
    return Choice(best.tactic, best.config, best.median_ms, candidates, from_cache)


def _reference_outputs(node, opset, inputs, device) -> tuple[torch.Tensor, ...]:
    from .vendor import ReferenceTactic

    with torch.inference_mode():
        return ReferenceTactic().build(node, opset, device, {})(inputs)


def _try(tactic: Tactic, node, opset, inputs, device, config, reference, budget) -> tuple[Candidate, Timing | None]:
    try:
        kernel = tactic.build(node, opset, device, config)
        with torch.inference_mode():
            outputs = kernel(inputs)
        problem = _mismatch(outputs, reference)
    except Exception as err:  # a failing candidate scores inf; the build goes on
        return Candidate(tactic.key, config, math.inf, f"failed: {type(err).__name__}: {err}"), None
    if problem:
        return Candidate(tactic.key, config, math.inf, f"wrong result: {problem}"), None

    def call():
        with torch.inference_mode():
            kernel(inputs)

    timing = measure(call, device=device, **budget.as_kwargs())
    note = "" if timing.ok else f"failed while timed: {timing.error}"
    return Candidate(tactic.key, config, timing.median, note), timing


def _mismatch(outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> str:
    if len(outputs) < len(reference):
        return f"{len(outputs)} outputs, expected {len(reference)}"
    for index, (got, want) in enumerate(zip(outputs, reference, strict=False)):
        if got.shape != want.shape or got.dtype != want.dtype:
            return (
                f"output {index} is {DType.from_torch(got.dtype)}{list(got.shape)}, expected "
                f"{DType.from_torch(want.dtype)}{list(want.shape)}"
            )
        if not want.is_floating_point():
            if not torch.equal(got, want):
                return f"output {index} differs"
            continue
        scale = want.abs().max().item() if want.numel() else 0.0
        error = (got.double() - want.double()).abs().max().item() / scale if scale else 0.0
        if error > TOLERANCE.get(want.dtype, 1e-4):
            return f"output {index} relative error {error:.2e} > {TOLERANCE.get(want.dtype, 1e-4):g}"
    return ""
