"""Per-layer profiling: how long every layer of an engine's schedule takes, as a table, a trace and a chart.

`profile_engine(engine, feeds)` runs the schedule of the plan that accepts `feeds` a few times untimed, then
`runs` times with a timer around every layer's kernel (`Schedule.execute(..., around=...)`), and takes each
layer's median. On CUDA the timer records a pair of `torch.cuda.Event`s per layer on the current stream, with
no synchronization inside the loop and one at the end; on the CPU it reads `time.perf_counter_ns`.

On the CPU the profile times what a context runs: the schedule recorded as a CPU graph (`cpu_graph`), each
recorded call tagged with its layer, and a timed replay sums each layer's calls (a layer with none, a view, takes
no time); the Python of an eager run, 10-15 µs a layer, would inflate small layers. Where the schedule cannot be
recorded (or with `graphs=False`) it runs eagerly with the clock around each layer, and `mode` says which.

On CUDA per-layer timing runs the schedule eagerly (no CUDA graph): every kernel is launched from Python. Were the GPU
to wait for each launch, a layer's events would also time the host's work between them (two profiles of one
detector engine, one after the other, summed 10.8 and 18.1 ms). So on CUDA each timed run starts behind a sleep
kernel long enough for the host to enqueue the whole run (`_hold_cycles`, from the warm-up runs' host time): the
layers then run back to back and each pair of events times its own kernels, as a CUDA graph replay of the
schedule would run them (`tensorforge bench` times that replay). Layers
write into an arena as in an execution context, so a concatenation whose inputs were written in place shows
the copies it really makes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, UnsupportedError
from ..ir import qualified_op
from ..ops.executor import bind_feeds
from .engine import Engine
from .plan import Layer


@dataclass(frozen=True)
class LayerTime:
    """One layer: where it is (schedule position, node index), what ran, and how long it took."""

    position: int
    node: int
    name: str
    op: str
    tactic: str
    precision: str
    layout: str
    median_ms: float
    share: float  # of the sum of all layers' medians
    start_ms: float  # in the representative run (the one of median length), from that run's start
    duration_ms: float  # in the representative run


@dataclass(frozen=True)
class LayerProfile:
    """What `profile_engine` measured: the layers in schedule order, and the whole timed runs."""

    device: str
    plan: int
    shapes: dict[str, tuple[int, ...]]
    runs: int
    warmup: int
    layers: tuple[LayerTime, ...]
    run_ms: float  # median of the timed runs, first layer's start to last layer's end
    mode: str = "eager"  # how the layers ran: "eager", or "cpu graph" (a replay of the recorded calls)
    note: str = ""  # why a CPU profile ran eagerly, where it could not replay

    @property
    def total_ms(self) -> float:
        """The sum of the layers' medians."""
        return math.fsum(layer.median_ms for layer in self.layers)

    def slowest(self, count: int | None = None) -> list[LayerTime]:
        """The `count` slowest layers (all with None), slowest first."""
        ordered = sorted(self.layers, key=lambda layer: -layer.median_ms)
        return ordered if count is None else ordered[:count]

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "plan": self.plan,
            "shapes": {name: list(shape) for name, shape in self.shapes.items()},
            "runs": self.runs,
            "warmup": self.warmup,
            "total_ms": self.total_ms,
            "run_ms": self.run_ms,
            "mode": self.mode,
            "note": self.note,
            "layers": [asdict(layer) for layer in self.layers],
        }

    def chrome_trace(self) -> dict[str, Any]:
        """The representative run in the Trace Event Format: one "X" event per layer on one track, times in µs
        (opens in Perfetto and chrome://tracing)."""
        track = {"pid": 0, "tid": 0}
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", **track, "args": {"name": f"tensorforge {self.device}"}},
            {"name": "thread_name", "ph": "M", **track, "args": {"name": f"plan {self.plan} layers ({self.mode})"}},
        ]
        for layer in self.layers:
            events.append(
                {
                    "name": layer.name or layer.op,
                    "cat": layer.op,
                    "ph": "X",
                    "ts": layer.start_ms * 1e3,
                    "dur": layer.duration_ms * 1e3,
                    **track,
                    "args": {
                        "position": layer.position,
                        "node": layer.node,
                        "op": layer.op,
                        "tactic": layer.tactic,
                        "precision": layer.precision,
                        "layout": layer.layout,
                        "median_ms": layer.median_ms,
                    },
                }
            )
        other = {"shapes": {name: list(shape) for name, shape in self.shapes.items()}, "runs": self.runs}
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        """Write `chrome_trace()` as JSON to `path`."""
        Path(path).write_text(json.dumps(self.chrome_trace()))

    def plot(self, path: str | os.PathLike[str], top: int = 20) -> None:
        """A horizontal bar chart of the `top` slowest layers' medians, written as a PNG to `path`."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            raise UnsupportedError("plotting a profile needs matplotlib: pip install matplotlib") from None
        layers = self.slowest(top)[::-1]  # slowest at the top of the chart
        figure = Figure(figsize=(9, 1.5 + 0.3 * len(layers)), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots()
        labels = [f"{_shorten(layer.name or '#' + str(layer.node))} ({layer.op})" for layer in layers]
        bars = axes.barh(labels, [layer.median_ms for layer in layers], color="tab:blue")
        axes.bar_label(bars, [f"{layer.median_ms:.3f} ms ({layer.share:.1%})" for layer in layers], padding=3)
        axes.margins(x=0.25)
        axes.set_xlabel(f"median ms per layer ({self.mode}, per-layer timing)")
        axes.set_title(
            f"slowest {len(layers)} of {len(self.layers)} layers on {self.device}; "
            f"sum {self.total_ms:.3f} ms over {self.runs} runs"
        )
        axes.tick_params(axis="y", labelsize=8)
        figure.savefig(path, dpi=110, format="png")


def profile_engine(
    engine: Engine, feeds: Mapping[str, Any], *, runs: int = 10, warmup: int = 3, graphs: bool | None = None
) -> LayerProfile:
    """Time every layer of the plan that accepts `feeds` (tensors, numpy arrays or DLPack objects by input
    name): `warmup` untimed runs, then the median of `runs` timed ones per layer. On the CPU the runs replay a
    CPU graph unless `graphs` is False (None: as an execution context would)."""
    if runs < 1 or warmup < 0:
        raise InputError(f"profiling needs runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    shapes = {name: tuple(data.shape) for name, data in feeds.items() if hasattr(data, "shape")}
    index = engine.select_plan(shapes)
    device = engine.device
    bound = {value.name: tensor for value, tensor in bind_feeds(engine.model.graph, feeds, device).items()}
    schedule = engine.schedule(index)
    arena = torch.empty(schedule.arena_bytes, dtype=torch.uint8, device=device) if schedule.binds_arena else None
    note = ""
    if device.type == "cpu" and graphs is not False:
        timed, note = _replayed(schedule, bound, arena, runs, warmup)
        if timed is not None:
            return _summarize(engine, index, schedule.layers, timed, shapes, str(device), runs, warmup, "cpu graph")
    host_ms = []
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for _ in range(max(warmup, 1 if device.type == "cuda" else 0)):
            started = time.perf_counter()
            schedule.execute(bound, arena=arena)
            host_ms.append((time.perf_counter() - started) * 1e3)
        timer = _CudaTimer(device, _hold_cycles(min(host_ms))) if device.type == "cuda" else _CpuTimer()
        for _ in range(runs):
            timer.begin()
            schedule.execute(bound, around=timer.around, arena=arena)
            timer.end()
        timed = timer.collect()
    return _summarize(engine, index, schedule.layers, timed, shapes, str(device), runs, warmup, "eager", note)


def _replayed(schedule, bound, arena, runs: int, warmup: int) -> tuple[list[_Run] | None, str]:
    """The timed replays of `schedule` recorded as a CPU graph, each call tagged with its layer's position, or
    None and why it cannot be recorded."""
    position = [-1]

    @contextlib.contextmanager
    def at(layer: Layer):
        position[0] += 1
        yield

    static = {name: tensor.clone() for name, tensor in bound.items()}
    schedule.execute(static, arena=arena)  # warm-up, as a context runs before it records
    try:
        graph, _ = schedule.record(static, arena, around=at, tag=lambda: position[0])
    except Exception as err:  # what an execution context would also run eagerly
        return None, f"{type(err).__name__}: {err}"
    layers = len(schedule.layers)
    for _ in range(warmup):
        graph.replay()
    timed: list[_Run] = []
    for _ in range(runs):
        _, marks = graph.timed_replay()
        origin = marks[0][1] if marks else 0
        spans: list[list[int]] = [[] for _ in range(layers)]
        for tag, start, stop in marks:
            spans[tag].append((start, stop))
        per_layer, previous = [], origin
        for calls in spans:
            if calls:
                previous = calls[-1][1]
                per_layer.append(((calls[0][0] - origin) / 1e6, sum(b - a for a, b in calls) / 1e6))
            else:  # no call of its own (a view): no time, at the end of the layer before
                per_layer.append(((previous - origin) / 1e6, 0.0))
        timed.append((per_layer, ((marks[-1][2] - origin) / 1e6) if marks else 0.0))
    return timed, ""


# A run as the timers report it: (start_ms, duration_ms) per layer from the run's start, and the run's length.
_Run = tuple[list[tuple[float, float]], float]


class _CpuTimer:
    """Host clock around each layer; the CPU runs kernels synchronously."""

    def __init__(self) -> None:
        self._runs: list[tuple[int, list[tuple[int, int]], int]] = []

    def begin(self) -> None:
        self._marks: list[tuple[int, int]] = []
        self._origin = time.perf_counter_ns()

    def around(self, layer: Layer) -> _CpuTimer:
        return self

    def __enter__(self) -> None:
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        self._marks.append((self._start, time.perf_counter_ns()))

    def end(self) -> None:
        self._runs.append((self._origin, self._marks, self._marks[-1][1] if self._marks else self._origin))

    def collect(self) -> list[_Run]:
        return [
            ([((start - origin) / 1e6, (stop - start) / 1e6) for start, stop in marks], (last - origin) / 1e6)
            for origin, marks, last in self._runs
        ]


class _CudaTimer:
    """A pair of CUDA events per layer on the current stream; read once, after one synchronization. Each run
    starts behind a sleep kernel of `hold_cycles` GPU clock cycles (0: none)."""

    def __init__(self, device: torch.device, hold_cycles: int = 0) -> None:
        self._device = device
        self._hold_cycles = hold_cycles
        self._runs: list[tuple[torch.cuda.Event, list[tuple[torch.cuda.Event, torch.cuda.Event]]]] = []

    def begin(self) -> None:
        if self._hold_cycles:
            torch.cuda._sleep(self._hold_cycles)
        self._marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._origin = _event()

    def around(self, layer: Layer) -> _CudaTimer:
        return self

    def __enter__(self) -> None:
        self._start = _event()

    def __exit__(self, *exc: object) -> None:
        self._marks.append((self._start, _event()))

    def end(self) -> None:
        self._runs.append((self._origin, self._marks))

    def collect(self) -> list[_Run]:
        torch.cuda.synchronize(self._device)
        runs = []
        for origin, marks in self._runs:
            layers = [(origin.elapsed_time(start), start.elapsed_time(stop)) for start, stop in marks]
            runs.append((layers, origin.elapsed_time(marks[-1][1]) if marks else 0.0))
        return runs


def _hold_cycles(host_ms: float) -> int:
    """GPU clock cycles of a sleep that outlasts `host_ms` of enqueueing three times over plus two milliseconds.
    The sleep's rate is measured on the current device, the faster of two probes (a probe at lower clocks would
    count fewer cycles a millisecond, and the hold would end early once the clocks rise)."""
    per_ms = 0.0
    probe = 1 << 20
    for _ in range(2):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        stop.record()
        stop.synchronize()
        per_ms = max(per_ms, probe / max(start.elapsed_time(stop), 1e-3))
    return int(per_ms * (3.0 * host_ms + 2.0))


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _summarize(
    engine: Engine,
    plan: int,
    layers: list[Layer],
    timed: list[_Run],
    shapes: dict[str, tuple[int, ...]],
    device: str,
    runs: int,
    warmup: int,
    mode: str,
    note: str = "",
) -> LayerProfile:
    medians = [statistics.median(run[0][i][1] for run in timed) for i in range(len(layers))]
    total = math.fsum(medians)
    spans = [span for _, span in timed]
    representative = timed[sorted(range(len(timed)), key=spans.__getitem__)[len(timed) // 2]][0]
    nodes = engine.model.graph.nodes
    rows = []
    for position, (layer, median, (start, duration)) in enumerate(zip(layers, medians, representative, strict=True)):
        node = nodes[layer.node]
        rows.append(
            LayerTime(
                position=position,
                node=layer.node,
                name=node.name,
                op=qualified_op(node),
                tactic=layer.tactic,
                precision=layer.precision,
                layout=layer.layout,
                median_ms=median,
                share=median / total if total > 0 else 0.0,
                start_ms=start,
                duration_ms=duration,
            )
        )
    return LayerProfile(device, plan, shapes, runs, warmup, tuple(rows), statistics.median(spans), mode, note)


def _shorten(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]
