"""The pass manager: runs passes to a fixed point, validates after each, and reports what happened.

Each pass runs as a transaction: the manager keeps a structural copy of the model, and if the pass raises
or leaves a graph that fails validation, the copy is restored and the failure is recorded as an event.
An optimization can therefore decline, or fail, but never break the build or return an invalid graph.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import GraphError
from ..ir import Model, validate
from ..ir.clone import clone_model
from ..ops.fused import DOMAIN, OPSET
from .base import Event, Pass, PassContext, mark_origins, qualified_op


@dataclass
class PassRun:
    name: str
    iteration: int
    modified: bool
    nodes_before: int
    nodes_after: int
    seconds: float
    error: str = ""


@dataclass
class OptimizationReport:
    ops_before: dict[str, int]
    ops_after: dict[str, int] = field(default_factory=dict)
    runs: list[PassRun] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.ops_after.values())

    def fired(self, rule: str | None = None) -> list[Event]:
        return [e for e in self.events if e.status == "fired" and (rule is None or e.rule == rule)]

    def declined(self, rule: str | None = None) -> list[Event]:
        return [e for e in self.events if e.status == "declined" and (rule is None or e.rule == rule)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "passes": [asdict(r) for r in self.runs],
            "events": [asdict(e) for e in self.events],
        }

    def format(self) -> str:
        lines = [f"nodes: {self.nodes_before} -> {self.nodes_after}"]
        for run in self.runs:
            if not run.modified and not run.error:
                continue
            fired = [e for e in self.events if e.pass_name == run.name and e.status == "fired"]
            lines.append(
                f"{run.name} (iteration {run.iteration}): {run.nodes_before} -> {run.nodes_after} nodes"
                + (f", FAILED and rolled back: {run.error}" if run.error else "")
            )
            for rule, count in Counter(e.rule for e in fired).items():
                lines.append(f"  {rule}: {count}x")
        declined = Counter((e.rule, e.detail) for e in self.events if e.status == "declined")
        if declined:
            lines.append("declined:")
            for (rule, reason), count in declined.most_common():
                lines.append(f"  {rule}: {reason} ({count}x)")
        return "\n".join(lines)


def op_histogram(model: Model) -> dict[str, int]:
    return dict(Counter(qualified_op(n) for n in model.graph.nodes).most_common())


class PassManager:
    def __init__(self, passes: Sequence[Pass], max_iterations: int = 8) -> None:
        self.passes = list(passes)
        self.max_iterations = max_iterations

    def run(self, model: Model) -> tuple[Model, OptimizationReport]:
        """Optimize `model` in place (or a restored copy of it) and return it with the report."""
        mark_origins(model)
        report = OptimizationReport(ops_before=op_histogram(model))
        ctx = PassContext(model)
        for iteration in range(1, self.max_iterations + 1):
            any_modified = False
            for pass_ in self.passes:
                run = self._run_one(pass_, ctx, iteration)
                report.runs.append(run)
                any_modified |= run.modified
            if not any_modified:
                break
        if any(node.domain == DOMAIN for node in ctx.model.graph.all_nodes()):
            ctx.model.opset_imports.setdefault(DOMAIN, OPSET)
        report.ops_after = op_histogram(ctx.model)
        report.events = ctx.events
        return ctx.model, report

    def _run_one(self, pass_: Pass, ctx: PassContext, iteration: int) -> PassRun:
        snapshot = clone_model(ctx.model)
        before = len(ctx.model.graph)
        ctx.pass_name = pass_.name
        events_before = len(ctx.events)
        start = time.perf_counter()
        error = ""
        try:
            modified = pass_.run(ctx)
            if modified:
                ctx.model.graph.sort()
                validate(ctx.model.graph)
        except Exception as err:  # a broken pass must not break the build: roll back and say why
            kind = "left an invalid graph" if isinstance(err, GraphError) else f"raised {type(err).__name__}"
            error = f"{kind}: {err}"
            ctx.model = snapshot
            ctx._names = None
            del ctx.events[events_before:]  # the rewrites it reported were rolled back
            ctx.events.append(Event(pass_.name, pass_.name, "failed", "", error))
            modified = False
        return PassRun(
            pass_.name, iteration, modified, before, len(ctx.model.graph), time.perf_counter() - start, error
        )
