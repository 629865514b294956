"""Throughput and latency of an engine (or of the reference executor), measured the way trtexec does.

Each inference on CUDA is three phases on its stream, each bracketed by CUDA events: the inputs copied from
pinned host memory to the device (host-to-device), the inference enqueued on those device-resident inputs
(GPU compute; a CUDA graph replay where the context captured one), the outputs copied back to pinned host
memory (device-to-host). Latency is the first event to the last, as the GPU saw it. At most `_IN_FLIGHT`
inferences per stream are queued ahead of the GPU. On the CPU an inference is one synchronous call, timed with
`time.perf_counter_ns`, and there are no copies.

With `streams` = N, N workers (each its own execution context and stream) run from N threads at once for the
same duration; throughput is all their inferences over the wall time from the first start to the last end.
Before that, each worker runs once alone (the CUDA graph capture) and then warms up for `warmup_s`. One worker
runs on the calling thread: on the CPU a second thread that runs torch's OpenMP loops gets a second team of
OpenMP threads, and once more threads are docked in teams than there are cores, libgomp stops letting its idle
threads spin between loops, so that every loop wakes its threads from sleep (an engine of many small layers, such as
MobileNetV3 at batch 1, ran 1.8× slower from a worker thread than from the thread that built it).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..ir import Model, format_type
from ..ops import Executor
from ..tensors import from_any, to_numpy
from .engine import Engine

Shape = tuple[int, ...]
Infer = Callable[[dict[str, torch.Tensor]], Mapping[str, Any]]  # enqueues one inference on the current stream

_IN_FLIGHT = 2  # inferences a CUDA worker queues before waiting for the oldest
_QUANTILES = {"median": 50, "p90": 90, "p99": 99}


@dataclass(frozen=True)
class BenchOptions:
    """How long to warm up and to measure (seconds), and how many concurrent streams (threads)."""

    warmup_s: float = 0.2
    duration_s: float = 3.0
    streams: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise InputError(f"the warm-up must be a number of seconds >= 0, got {self.warmup_s}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise InputError(f"the duration must be a number of seconds > 0, got {self.duration_s}")
        if self.streams < 1:
            raise InputError(f"the number of streams must be at least 1, got {self.streams}")


@dataclass(frozen=True)
class BenchResult:
    """What `bench_engine` / `bench_executor` measured; times in milliseconds, statistics as
    {min, mean, median, p90, p99}. On the CPU an inference is one call: `compute_ms` is `latency_ms`, and
    `h2d_ms`, `d2h_ms` and `enqueue_ms` are None."""

    runner: str  # "engine" or "executor"
    device: str
    graphs: bool  # whether the timed inferences replayed recorded graphs (CUDA graphs, or CPU graphs on the CPU)
    streams: int
    batch: int  # samples per inference: the first input's leading dim
    shapes: dict[str, Shape]
    options: BenchOptions
    iterations: int
    wall_s: float
    latency_ms: dict[str, float]
    compute_ms: dict[str, float]
    enqueue_ms: dict[str, float] | None  # host time of the enqueue call
    h2d_ms: dict[str, float] | None
    d2h_ms: dict[str, float] | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def inferences_per_s(self) -> float:
        return self.iterations / self.wall_s

    @property
    def samples_per_s(self) -> float:
        return self.inferences_per_s * self.batch

    def to_dict(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "device": self.device,
            "graphs": self.graphs,
            "streams": self.streams,
            "batch": self.batch,
            "shapes": {name: list(shape) for name, shape in self.shapes.items()},
            "warmup_s": self.options.warmup_s,
            "duration_s": self.options.duration_s,
            "iterations": self.iterations,
            "wall_s": self.wall_s,
            "throughput": {"inferences_per_s": self.inferences_per_s, "samples_per_s": self.samples_per_s},
            "latency_ms": self.latency_ms,
            "compute_ms": self.compute_ms,
            "enqueue_ms": self.enqueue_ms,
            "h2d_ms": self.h2d_ms,
            "d2h_ms": self.d2h_ms,
            "notes": list(self.notes),
        }


# -- what to run -----------------------------------------------------------------------------------------


def engine_shapes(engine: Engine, given: Mapping[str, Shape], batch: int | None = None) -> dict[str, Shape]:
    """Input shapes to run `engine` at: the opt shapes of the first profile that accepts them once `given`
    replaces some and `batch` (if set) replaces every leading dim; a clear error if no profile does."""
    tried = []
    for plan in engine.plans:
        shapes = {**{name: r.opt for name, r in plan.profile.ranges.items()}, **given}
        shapes = with_batch(shapes, batch)
        if not plan.profile.problems(shapes):
            return shapes
        tried.append(shapes)
    try:
        engine.select_plan(tried[0])
    except InputError as err:
        raise InputError(f"--batch {batch}: {err}" if batch is not None else str(err)) from None
    return tried[0]


def model_shapes(model: Model, given: Mapping[str, Shape], batch: int | None = None) -> dict[str, Shape]:
    """Input shapes to run an ONNX `model` at: `given`, else the declared shape with a dynamic leading dim
    set to `batch` (or 1); `batch` replaces every leading dim. Other dynamic dims must be given."""
    graph = model.graph
    shapes = {}
    for value in graph.inputs:
        if value.name in graph.initializers:
            continue
        shape = given.get(value.name)
        if shape is None:
            if value.shape is None:
                raise InputError(f"input {value.name!r} has no declared shape: give one with --shape")
            declared = list(value.shape)
            if declared and not isinstance(declared[0], int):
                declared[0] = batch or 1
            elif declared and batch is not None and declared[0] != batch:
                raise InputError(
                    f"--batch {batch}: input {value.name!r} ({format_type(value.dtype, value.shape)}) has a fixed "
                    f"leading dim of {declared[0]}"
                )
            dynamic = [d for d in declared if not isinstance(d, int)]
            if dynamic:
                raise InputError(
                    f"input {value.name!r} ({format_type(value.dtype, value.shape)}) has dynamic dims "
                    f"{[d or '?' for d in dynamic]}: give its shape with --shape {value.name}=..."
                )
            shape = tuple(declared)
        shapes[value.name] = shape
    return with_batch(shapes, batch)


def with_batch(shapes: Mapping[str, Shape], batch: int | None) -> dict[str, Shape]:
    """`shapes` with every leading dim set to `batch` (unchanged when None)."""
    if batch is None:
        return dict(shapes)
    if batch < 1:
        raise InputError(f"--batch must be at least 1, got {batch}")
    scalars = [name for name, shape in shapes.items() if not shape]
    if scalars:
        raise InputError(f"--batch {batch}: inputs {scalars} are scalars, with no batch dim to set")
    return {name: (batch, *shape[1:]) for name, shape in shapes.items()}


def batch_of(feeds: Mapping[str, Any]) -> int:
    """Samples per inference: the leading dim of the first input with one (1 if none has)."""
    for data in feeds.values():
        shape = tuple(getattr(data, "shape", ()))
        if shape:
            return int(shape[0])
    return 1


# -- measuring -------------------------------------------------------------------------------------------


def bench_engine(
    engine: Engine,
    feeds: Mapping[str, Any],
    options: BenchOptions,
    *,
    cuda_graphs: bool | None = None,
    cpu_graphs: bool | None = None,
) -> BenchResult:
    """Benchmark `engine` on `feeds` with `options.streams` execution contexts, each on its own stream.
    `cuda_graphs` / `cpu_graphs` None: on where the engine runs there."""
    contexts = [engine.create_context(cuda_graphs=cuda_graphs, cpu_graphs=cpu_graphs) for _ in range(options.streams)]
    workers = [_Worker(context.enqueue, context.stream, feeds, engine.device) for context in contexts]
    _prime(workers)
    notes = sorted({reason for context in contexts for reason in context.eager_shapes.values()})
    replayed = all(context.captured_shapes for context in contexts)
    kind = "CUDA" if engine.device.type == "cuda" else "CPU"
    notes = [f"a {kind} graph could not be recorded, so the timed runs are eager: {note}" for note in notes]
    return _measure(workers, options, "engine", engine.device, replayed, feeds, notes)


def bench_executor(model: Model, feeds: Mapping[str, Any], options: BenchOptions, device: str) -> BenchResult:
    """Benchmark the reference executor running `model` on `device` (eagerly), one stream per worker."""
    executor = Executor(model, device)
    on_cuda = executor.device.type == "cuda"
    workers = [
        _Worker(executor.run, torch.cuda.Stream(executor.device) if on_cuda else None, feeds, executor.device)
        for _ in range(options.streams)
    ]
    _prime(workers)
    return _measure(workers, options, "executor", executor.device, False, feeds, [])


def bench_onnxruntime(session: Any, feeds: Mapping[str, Any], options: BenchOptions, device: str) -> BenchResult:
    """Benchmark an ONNX Runtime `session` (on `device`, where its first provider runs) on `feeds`, from
    `options.streams` threads at once. Each inference is one `session.run` on host arrays, so on a GPU its latency
    holds the copies in and out, as the engine's does; it is timed on the host, without a breakdown."""
    wanted = {i.name for i in session.get_inputs()}
    missing = sorted(wanted - set(feeds))
    if missing:
        raise InputError(
            f"ONNX Runtime's model has inputs {missing} that the engine's have not: is it the model the engine was "
            "built from?"
        )
    arrays = {name: to_numpy(_tensor(name, feeds[name])) for name in wanted}
    workers = [_Worker(lambda _: session.run(None, arrays), None, {}, "cpu") for _ in range(options.streams)]
    _prime(workers)
    result = _measure(workers, options, "onnxruntime", torch.device("cpu"), False, feeds, [])
    return replace(result, device=device)


@dataclass
class _Samples:
    latency: list[float] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    enqueue: list[float] = field(default_factory=list)
    h2d: list[float] = field(default_factory=list)
    d2h: list[float] = field(default_factory=list)


class _Worker:
    """One stream's inference loop: its own input and output buffers, events kept until they are read."""

    def __init__(self, infer: Infer, stream: torch.cuda.Stream | None, feeds: Mapping[str, Any], device) -> None:
        self.infer = infer
        self.stream = stream
        self.device = torch.device(device)
        host = {name: _tensor(name, data) for name, data in feeds.items()}
        if stream is None:  # the CPU: the inputs are where the inference reads them
            self.inputs = host
            return
        self.host_inputs = {name: tensor.pin_memory() for name, tensor in host.items()}
        self.inputs = {name: torch.empty_like(t, device=self.device) for name, t in self.host_inputs.items()}
        self.host_outputs: dict[str, torch.Tensor] = {}

    def scope(self) -> ExitStack:
        """The device and stream this worker's thread runs on."""
        stack = ExitStack()
        if self.stream is not None:
            stack.enter_context(torch.cuda.device(self.device))
            stack.enter_context(torch.cuda.stream(self.stream))
        return stack

    def prime(self) -> None:
        """One untimed inference: captures the CUDA graph, sizes the pinned output buffers."""
        with self.scope():
            if self.stream is None:
                self.infer(self.inputs)
                return
            for name, tensor in self.host_inputs.items():
                self.inputs[name].copy_(tensor, non_blocking=True)
            results = self.infer(self.inputs)
            for name, result in results.items():
                if isinstance(result, torch.Tensor):
                    self.host_outputs[name] = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
            self.stream.synchronize()

    def loop(self, seconds: float, samples: _Samples | None) -> None:
        """Run inferences until `seconds` have passed (at least one when `samples` is kept)."""
        deadline = time.perf_counter() + seconds
        with self.scope():
            if self.stream is None:
                self._loop_cpu(deadline, samples)
            else:
                self._loop_cuda(deadline, samples)

    def _loop_cpu(self, deadline: float, samples: _Samples | None) -> None:
        first = samples is not None
        while first or time.perf_counter() < deadline:
            first = False
            start = time.perf_counter_ns()
            self.infer(self.inputs)
            elapsed = (time.perf_counter_ns() - start) / 1e6
            if samples is not None:
                samples.latency.append(elapsed)
                samples.compute.append(elapsed)

    def _loop_cuda(self, deadline: float, samples: _Samples | None) -> None:
        pending: deque[tuple[list[torch.cuda.Event], float]] = deque()
        first = samples is not None
        while first or time.perf_counter() < deadline:
            first = False
            events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            events[0].record()
            for name, tensor in self.host_inputs.items():
                self.inputs[name].copy_(tensor, non_blocking=True)
            events[1].record()
            start = time.perf_counter_ns()
            results = self.infer(self.inputs)
            enqueue = (time.perf_counter_ns() - start) / 1e6
            events[2].record()
            for name, target in self.host_outputs.items():
                target.copy_(results[name], non_blocking=True)
            events[3].record()
            pending.append((events, enqueue))
            if len(pending) > _IN_FLIGHT:
                _read(pending.popleft(), samples)
        self.stream.synchronize()
        while pending:
            _read(pending.popleft(), samples)


def _read(item: tuple[list[torch.cuda.Event], float], samples: _Samples | None) -> None:
    events, enqueue = item
    events[3].synchronize()
    if samples is None:
        return
    samples.h2d.append(events[0].elapsed_time(events[1]))
    samples.compute.append(events[1].elapsed_time(events[2]))
    samples.d2h.append(events[2].elapsed_time(events[3]))
    samples.latency.append(events[0].elapsed_time(events[3]))
    samples.enqueue.append(enqueue)


def _tensor(name: str, data: Any) -> torch.Tensor:
    if isinstance(data, list | str) or (isinstance(data, np.ndarray) and data.dtype.kind in "OUS"):
        raise InputError(f"input {name!r} is not a numeric tensor; bench times tensor inputs only")
    tensor = from_any(data)
    return tensor.cpu() if tensor.device.type != "cpu" else tensor


def _prime(workers: list[_Worker]) -> None:
    """One run per worker, one worker at a time (CUDA graph captures do not overlap)."""
    for worker in workers:
        worker.prime()


def _measure(
    workers: list[_Worker],
    options: BenchOptions,
    runner: str,
    device: torch.device,
    graphs: bool,
    feeds: Mapping[str, Any],
    notes: list[str],
) -> BenchResult:
    barrier = threading.Barrier(len(workers))

    def work(worker: _Worker) -> tuple[float, float, _Samples]:
        try:
            worker.loop(options.warmup_s, None)
            barrier.wait()
            samples = _Samples()
            start = time.perf_counter()
            worker.loop(options.duration_s, samples)
            return start, time.perf_counter(), samples
        except BaseException:
            barrier.abort()  # the other workers stop waiting and the error surfaces
            raise

    if len(workers) == 1:  # on the calling thread: see the module docstring
        outcomes = [work(workers[0])]
    else:
        with ThreadPoolExecutor(max_workers=len(workers), thread_name_prefix="bench") as pool:
            futures = [pool.submit(work, worker) for worker in workers]
            errors = [future.exception() for future in futures]
        errors = [error for error in errors if error is not None]
        if errors:  # the worker that failed, not the ones it released from the barrier
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        outcomes = [future.result() for future in futures]
    merged = _Samples()
    for _, _, samples in outcomes:
        for name in ("latency", "compute", "enqueue", "h2d", "d2h"):
            getattr(merged, name).extend(getattr(samples, name))
    on_cuda = device.type == "cuda"
    return BenchResult(
        runner=runner,
        device=str(device),
        graphs=graphs,
        streams=len(workers),
        batch=batch_of(feeds),
        shapes={name: tuple(getattr(data, "shape", ())) for name, data in feeds.items()},
        options=options,
        iterations=len(merged.latency),
        wall_s=max(end for _, end, _ in outcomes) - min(start for start, _, _ in outcomes),
        latency_ms=summarize(merged.latency),
        compute_ms=summarize(merged.compute),
        enqueue_ms=summarize(merged.enqueue) if on_cuda else None,
        h2d_ms=summarize(merged.h2d) if on_cuda else None,
        d2h_ms=summarize(merged.d2h) if on_cuda else None,
        notes=tuple(notes),
    )


def summarize(samples: list[float]) -> dict[str, float]:
    """min, mean, median, p90 and p99 of `samples` (linear interpolation between order statistics)."""
    values = np.asarray(samples, dtype=np.float64)
    stats = {"min": float(values.min()), "mean": float(values.mean())}
    stats.update({name: float(np.percentile(values, q)) for name, q in _QUANTILES.items()})
    return stats
