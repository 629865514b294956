"""`Engine`: an optimized graph with a tuned plan per optimization profile, saved to and loaded from a file.

An engine is immutable once built. Its weights (converted once per precision and layout the layers use) and
its compiled schedules are shared by every `ExecutionContext` created from it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..build.config import BuildConfig
from ..errors import InputError
from ..ir import Model, format_type
from ..ir.serialize import model_from_dict, model_to_dict
from ..tactics.variant import ConstantCache
from .engine_file import EngineFileError, check_runs_here, load_engine_file, save_engine_file
from .environment import Environment
from .plan import Plan
from .schedule import Schedule

FORMAT = "tensorforge-engine"


class Engine:
    """The result of a build: `create_context()` to run it, `save(path)` to keep it."""

    def __init__(
        self,
        model: Model,
        config: BuildConfig,
        plans: Sequence[Plan],
        environment: Environment,
        report: Mapping[str, Any] | None = None,
        *,
        device: str | torch.device | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.plans = tuple(plans)
        self.environment = environment
        self.report = dict(report or {})
        self.device = torch.device(device if device is not None else config.device)
        self._constants: ConstantCache = {}
        self._schedules: dict[int, Schedule] = {}
        self._lock = threading.Lock()

    # -- running --------------------------------------------------------------------------------------

    def create_context(self, **options: Any):
        """A new `ExecutionContext` (its own stream, CUDA graphs and buffers) sharing this engine's weights."""
        from .context import ExecutionContext

        return ExecutionContext(self, **options)

    def schedule(self, index: int) -> Schedule:
        """The compiled schedule of plan `index`, built on first use and shared by all contexts."""
        with self._lock:
            schedule = self._schedules.get(index)
            if schedule is None:
                plan = self.plans[index]
                schedule = Schedule(self.model, plan.layers, self.device, self._constants, plan.memory)
                self._schedules[index] = schedule
            return schedule

    def select_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> int:
        """The first plan whose profile accepts `shapes`; a clear error listing the profiles otherwise."""
        problems = []
        for index, plan in enumerate(self.plans):
            found = plan.profile.problems(shapes)
            if not found:
                return index
            problems.append(f"profile {index}: " + "; ".join(found))
        given = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        raise InputError(
            f"no optimization profile of this engine accepts the input shapes ({given}):\n  "
            + "\n  ".join(problems)
            + "\nrebuild the engine with a --profile that covers these shapes"
        )

    def describe_inputs(self) -> str:
        graph = self.model.graph
        return ", ".join(
            f"{v.name}: {format_type(v.dtype, v.shape)}" for v in graph.inputs if v.name not in graph.initializers
        )

    # -- files ----------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the engine file (refusing to replace an existing file unless `overwrite`)."""
        graph, tensors = model_to_dict(self.model)
        header = {
            "format": FORMAT,
            "environment": self.environment,
            "config": self.config.to_dict(),
            "model": graph,
            "plans": [plan.to_dict() for plan in self.plans],
            "report": self.report,
        }
        save_engine_file(path, header, tensors, overwrite=overwrite)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, device: str | torch.device | None = None, check_environment: bool = True
    ) -> Engine:
        """Read an engine file; refuse one built for another device or software stack, saying what differs.

        `check_environment=False` reads any engine (its weights stay on the CPU) to inspect it, not to run it.
        """
        header, tensors = _read_header(path)
        config = _parse(path, "build config", lambda: BuildConfig.from_dict(header["config"]))
        if check_environment:
            device = torch.device(device if device is not None else config.device)
            check_runs_here(header["environment"], device, repr(str(path)))
        else:
            device = torch.device(device if device is not None else "cpu")
        model = _parse(path, "graph", lambda: model_from_dict(header["model"], tensors))
        plans = _parse(path, "plans", lambda: [Plan.from_dict(plan) for plan in header["plans"]])
        nodes = len(model.graph)
        for plan in plans:
            bad = [layer.node for layer in plan.layers if not 0 <= layer.node < nodes]
            if bad:
                raise EngineFileError(f"{str(path)!r}: layers name nodes {bad} outside the graph; rebuild the engine")
        return cls(model, config, plans, header["environment"], header.get("report"), device=device)


def _read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    header, tensors = load_engine_file(path, device="cpu", check_environment=False)
    if header.get("format") != FORMAT:
        raise EngineFileError(f"{str(path)!r} is an engine file of format {header.get('format')!r}, not {FORMAT!r}")
    return header, tensors


def _parse(path: str | os.PathLike[str], what: str, parse):
    try:
        return parse()
    except EngineFileError:
        raise
    except Exception as err:  # a malformed header: say where, never a raw traceback
        raise EngineFileError(
            f"the {what} in the header of {str(path)!r} is malformed ({type(err).__name__}: {err}); rebuild the engine"
        ) from None


def read_engine_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of an engine file without checking it against this machine (for `inspect`)."""
    return _read_header(path)[0]
