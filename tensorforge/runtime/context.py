"""`ExecutionContext`: runs an engine on its inputs, on a CUDA stream, replaying one recorded graph per shape.

A context checks every feed against the engine's inputs (names, dtypes, ranks, the profiles' shape ranges),
picks the first profile that accepts the shapes, and runs that plan's schedule. The first run of a new input
shape runs eagerly, then records the schedule: into a CUDA graph on CUDA, into a CPU graph (the kernel calls
without the Python around them, `cpu_graph`) on the CPU; later runs of that shape copy the feeds into the
graph's input buffers and replay it. A schedule that cannot be recorded (a kernel that synchronizes
with the host, Python that reads tensor values) stays eager for that shape, with the reason kept in
`eager_shapes`.

Several contexts may run one engine at once (threads, streams): each has its own stream, graphs, memory pool
and arena (one per plan, the size of its memory plan, allocated on first use: the layers whose kernels write
into given buffers put their outputs there); the weights and kernels are the engine's.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import InputError
from ..ops.cuda_graphs import capture
from ..ops.executor import bind_feeds
from . import cpu_graph
from .engine import Engine

ShapeKey = tuple[int, tuple[tuple[str, tuple[int, ...], torch.dtype], ...]]


class _Captured:
    """One recorded graph (CUDA or CPU): the static input buffers it reads and the output tensors it writes."""

    __slots__ = ("graph", "inputs", "outputs")

    def __init__(self, graph: Any, inputs: dict[str, torch.Tensor], outputs: list[Any]) -> None:
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs


class ExecutionContext:
    """`run(feeds)` blocks until the outputs are ready; `enqueue(feeds)` returns once the work is queued.
    `cuda_graphs` / `cpu_graphs`: whether runs replay recorded graphs (None: on where the engine runs there)."""

    def __init__(
        self,
        engine: Engine,
        *,
        stream: torch.cuda.Stream | None = None,
        cuda_graphs: bool | None = None,
        cpu_graphs: bool | None = None,
    ) -> None:
        self.engine = engine
        self.device = engine.device
        on_cuda = self.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise InputError("CUDA graphs need an engine built for CUDA; this one runs on the CPU")
        if cpu_graphs and on_cuda:
            raise InputError("CPU graphs need an engine built for the CPU; this one runs on CUDA")
        self.cuda_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        sparse = (engine.report.get("sparsity") or {}).get("sparse_kernels", [])  # (None when sparsity is off)
        if on_cuda and not self.cuda_graphs and any(nodes for nodes in sparse):
            warnings.warn(
                "this engine runs layers on 2:4 sparse kernels; torch's cuSPARSELt products cost 0.3 ms to hundreds "
                "of milliseconds a call run without a CUDA graph (host-side setup that a replay skips): keep "
                "cuda_graphs on",
                stacklevel=2,
            )
        self.cpu_graphs = not on_cuda if cpu_graphs is None else cpu_graphs
        self.stream = stream if stream is not None or not on_cuda else torch.cuda.Stream(self.device)
        self._graphs: dict[ShapeKey, _Captured] = {}
        self._last: _Captured | None = None  # the graph the last run replayed (`_replayable`)
        self.eager_shapes: dict[ShapeKey, str] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._kept = cpu_graph.KeptMemory()  # the kept memory all this context's CPU graphs share
        self._arenas: dict[int, torch.Tensor] = {}

    @property
    def arena_bytes(self) -> int:
        """Bytes of the arenas this context has allocated so far."""
        return sum(arena.numel() for arena in self._arenas.values())

    def _arena(self, index: int, schedule) -> torch.Tensor | None:
        if not schedule.binds_arena:
            return None
        arena = self._arenas.get(index)
        if arena is None:
            arena = torch.empty(schedule.arena_bytes, dtype=torch.uint8, device=self.device)
            self._arenas[index] = arena
        return arena

    @property
    def captured_shapes(self) -> list[ShapeKey]:
        return list(self._graphs)

    def run(self, feeds: Mapping[str, Any], outputs: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Run on `feeds` (torch tensors, numpy arrays or DLPack objects by input name) and wait for the result.

        With `outputs` (tensors by output name, of the output's shape and dtype, on the engine's device) the
        results are written there and those same tensors are returned.
        """
        results = self.enqueue(feeds, outputs)
        if self.stream is not None:
            self.stream.synchronize()
        return results

    def enqueue(
        self,
        feeds: Mapping[str, Any],
        outputs: Mapping[str, torch.Tensor] | None = None,
        stream: torch.cuda.Stream | None = None,
    ) -> dict[str, Any]:
        """Queue a run on `stream` (the context's own by default) and return its outputs without waiting:
        they are valid once the stream has finished (`stream.synchronize()` or an event)."""
        stream = stream or self.stream
        if stream is None:
            return self._deliver(self._execute(feeds), outputs)
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)  # feeds the caller produced on its stream are ready
        with torch.cuda.stream(stream):
            return self._deliver(self._execute(feeds), outputs)

    # -- internals ------------------------------------------------------------------------------------

    def _execute(self, feeds: Mapping[str, Any]) -> list[Any]:
        captured = self._replayable(feeds)
        if captured is not None:
            return self._replay(captured, feeds)
        shapes = {name: tuple(data.shape) for name, data in feeds.items() if hasattr(data, "shape")}
        index = self.engine.select_plan(shapes)  # before the graph's own checks: its static dims come from profiles
        # numpy feeds are shared, not copied, as torch feeds are: a replay copies them into its own inputs
        graph = self.engine.model.graph
        bound = {value.name: tensor for value, tensor in bind_feeds(graph, feeds, self.device, copy=False).items()}
        schedule = self.engine.schedule(index)
        arena = self._arena(index, schedule)
        if not self.graphs:
            return schedule.execute(bound, arena=arena)
        key: ShapeKey = (index, tuple(sorted((n, tuple(t.shape), t.dtype) for n, t in bound.items())))
        captured = self._graphs.get(key)
        if captured is not None:
            return self._replay(captured, bound)
        results = schedule.execute(bound, arena=arena)  # eager: warms up cuDNN / cuBLAS, packs weights
        if key not in self.eager_shapes:
            self._capture(key, schedule, bound)
        return results

    def _replayable(self, feeds: Mapping[str, Any]) -> _Captured | None:
        """The graph the last run replayed, where `feeds` are torch tensors with its inputs' names, shapes, dtypes
        and device: they would pass every check that run's feeds passed and select the same graph, so the run
        skips them (at batch 1 the checks, run with caches the kernels emptied, cost 3-5% of a small network)."""
        last = self._last
        if last is None or len(feeds) != len(last.inputs):
            return None
        for name, tensor in feeds.items():
            static = last.inputs.get(name)
            if static is None or type(tensor) is not torch.Tensor:
                return None
            if tensor.shape != static.shape or tensor.dtype != static.dtype or tensor.device != static.device:
                return None
        return last

    def _replay(self, captured: _Captured, feeds: Mapping[str, torch.Tensor]) -> list[Any]:
        for name, tensor in feeds.items():
            captured.inputs[name].copy_(tensor, non_blocking=True)
        replayed = captured.graph.replay()  # a CPU graph returns its outputs, a CUDA graph rewrites them
        self._last = captured
        return captured.outputs if replayed is None else replayed

    @property
    def graphs(self) -> bool:
        """Whether runs replay recorded graphs (CUDA graphs on CUDA, CPU graphs on the CPU)."""
        return self.cuda_graphs if self.device.type == "cuda" else self.cpu_graphs

    def _capture(self, key: ShapeKey, schedule, bound: Mapping[str, torch.Tensor]) -> None:
        static = {name: tensor.clone() for name, tensor in bound.items()}
        arena = self._arena(key[0], schedule)
        try:
            if self.device.type == "cuda":
                graph, outputs = capture(lambda: schedule.execute(static, arena=arena), pool=self._pool)
            else:
                graph, outputs = schedule.record(static, arena, memory=self._kept)
        except Exception as err:  # e.g. a kernel that reads a value back to the host
            self.eager_shapes[key] = f"{type(err).__name__}: {err}"
            return
        self._graphs[key] = _Captured(graph, static, outputs)

    def _deliver(self, results: list[Any], outputs: Mapping[str, torch.Tensor] | None) -> dict[str, Any]:
        """Results by output name: copies of the graph's buffers, or written into the caller's `outputs`."""
        names = [value.name for value in self.engine.model.graph.outputs]
        outputs = outputs or {}
        unknown = sorted(set(outputs) - set(names))
        if unknown:
            raise InputError(f"output buffers given for {unknown}, which are not outputs (outputs are {names})")
        delivered = {}
        for name, result in zip(names, results, strict=True):
            target = outputs.get(name)
            if target is None:
                delivered[name] = result.clone() if self.graphs and isinstance(result, torch.Tensor) else result
                continue
            if not isinstance(result, torch.Tensor) or target.shape != result.shape or target.dtype != result.dtype:
                shown = f"{result.dtype} {list(result.shape)}" if isinstance(result, torch.Tensor) else "not a tensor"
                raise InputError(
                    f"the output buffer for {name!r} is {target.dtype} {list(target.shape)}, the output is {shown}"
                )
            target.copy_(result, non_blocking=True)
            delivered[name] = target
        return delivered
