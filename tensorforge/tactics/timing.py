"""Careful timing of one candidate: warm-up calls, an L2 flush before each timed call, the median of many.

On CUDA each call is bracketed by CUDA events on the current stream, after a write of a buffer twice the size
of the L2 cache so that no call finds its operands left warm by the one before; on the CPU each call is timed
with `time.perf_counter_ns`. A candidate that raises scores `inf` with the error kept: timing never aborts a
build. Times are in milliseconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import DeviceError
from ..ops.cuda_graphs import capture

# With min_time_s unmet, measuring stops anyway at this many times `repeats` samples.
_MAX_SAMPLES_FACTOR = 10
# L2 flush size when the driver reports no L2 size (as inductor does): larger than any GPU's L2.
_FALLBACK_FLUSH_BYTES = 256 * 2**20


def _check_budget(warmup: int, repeats: int, min_time_s: float) -> None:
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"timing warmup must be an int >= 0, not {warmup!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"timing repeats must be an int >= 1, not {repeats!r}")
    if not isinstance(min_time_s, (int, float)) or not min_time_s >= 0 or math.isinf(min_time_s):
        raise ValueError(f"timing min_time_s must be a finite number of seconds >= 0, not {min_time_s!r}")


@dataclass(frozen=True)
class Timing:
    """What `measure` found, in milliseconds. A failed candidate has `error` set, no samples and `inf` times."""

    median: float
    min: float
    mean: float
    p90: float
    samples: tuple[float, ...]
    error: str | None = None

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> Timing:
        if not samples:
            raise ValueError("Timing.from_samples() needs at least one sample")
        ordered = sorted(samples)
        return cls(
            median=_quantile(ordered, 0.5),
            min=ordered[0],
            mean=math.fsum(ordered) / len(ordered),
            p90=_quantile(ordered, 0.9),
            samples=tuple(samples),
        )

    @classmethod
    def failed(cls, error: str) -> Timing:
        return cls(median=math.inf, min=math.inf, mean=math.inf, p90=math.inf, samples=(), error=error)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class TimingBudget:
    """How hard `measure` tries: warm-up calls, timed calls, and the least total time spent in timed calls.

    `TimingBudget.for_effort(level)` gives the presets; `measure(fn, device=d, **budget.as_kwargs())` uses one.
    """

    warmup: int
    repeats: int
    min_time_s: float
    # A candidate whose first timed call takes more than this many times the fastest candidate so far stops there
    # (its one sample is its time): it cannot win, and its remaining calls are most of a build's timing.
    give_up_ratio: float = math.inf

    def __post_init__(self) -> None:
        _check_budget(self.warmup, self.repeats, self.min_time_s)
        if not self.give_up_ratio > 1:
            raise ValueError(f"give_up_ratio must be above 1, not {self.give_up_ratio!r}")

    @classmethod
    def for_effort(cls, effort: int) -> TimingBudget:
        """0: quick look, 1: the default, 2: careful (for final builds and shared caches)."""
        if not isinstance(effort, int) or isinstance(effort, bool) or effort not in _EFFORTS:
            raise ValueError(f"timing effort must be 0, 1 or 2, not {effort!r}")
        return _EFFORTS[effort]

    def as_kwargs(self) -> dict[str, Any]:
        return {"warmup": self.warmup, "repeats": self.repeats, "min_time_s": self.min_time_s}


_EFFORTS = {
    0: TimingBudget(warmup=2, repeats=10, min_time_s=0.0, give_up_ratio=4.0),
    1: TimingBudget(warmup=5, repeats=30, min_time_s=0.02, give_up_ratio=4.0),
    2: TimingBudget(warmup=10, repeats=100, min_time_s=0.1),
}


METHOD = "cuda-graph-replay"  # how CUDA timings are taken; part of the timing cache's key


# what torch says of CUDA errors after which the process's context is unusable: every later call fails with them
_CONTEXT_LOST = (
    "illegal instruction",
    "illegal memory access",
    "an illegal address",
    "unspecified launch failure",
    "misaligned address",
    "device-side assert",
)


class ContextLost(DeviceError):
    """A CUDA error left this process's context unusable (it is sticky: every later kernel fails with it)."""


# the exception types torch and Triton raise CUDA's errors as (torch.AcceleratorError is a RuntimeError)
_CUDA_ERROR_TYPES = ("RuntimeError", "AcceleratorError")


def context_lost(err: BaseException | str) -> bool:
    """Whether `err` (an exception, or a failure note "Type: message" as `measure` writes them) is a CUDA error after
    which nothing more runs in this process. Only the types CUDA's errors come as count: a kernel's own refusal
    (a ValueError) may name such an error in its advice without having met one."""
    if isinstance(err, BaseException):
        kind, message = ("RuntimeError" if isinstance(err, RuntimeError) else type(err).__name__), str(err)
    else:
        kind, _, message = err.partition(": ")
    return kind in _CUDA_ERROR_TYPES and any(signature in message for signature in _CONTEXT_LOST)


def first_line(err: BaseException) -> str:
    """The first line of `err`'s message (torch appends lines of advice to its CUDA errors)."""
    return str(err).strip().split("\n", 1)[0]


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device | str,
    warmup: int = 5,
    repeats: int = 30,
    flush_l2: bool = True,
    min_time_s: float = 0.02,
    give_up_ms: float = math.inf,
) -> Timing:
    """Time `fn()` on `device` ('cpu' or 'cuda[:i]'); the defaults are effort level 1.

    `fn` takes no arguments and, on CUDA, enqueues its work on the current stream. After `warmup` untimed
    calls it is captured in a CUDA graph, whose replays are timed (`METHOD`: the GPU time, without the
    host-side launch cost a graph replay does not pay; a call that cannot be captured is timed eagerly), at
    least `repeats` times and until the timed calls add up to `min_time_s` (at most 10 × `repeats` calls). A first
    timed call over `give_up_ms` is the only one (on CUDA after one untimed replay, so that a graph's first upload
    is not timed). `flush_l2` applies to CUDA only. If `fn` raises (while warming up, while timed, or in a CUDA
    error surfacing at synchronization), the result has `error` set and `inf` times, except for a CUDA error that
    leaves the context unusable (an illegal address or instruction: sticky, every later kernel would fail too),
    which raises `ContextLost`.
    """
    _check_budget(warmup, repeats, min_time_s)
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"measure(device={str(device)!r}): CUDA is not available here; time on device='cpu'")
        timer = _time_cuda
    elif device.type == "cpu":
        timer = _time_cpu
    else:
        raise ValueError(f"measure() times on 'cpu' or 'cuda' devices, not {str(device)!r}")
    try:
        samples = timer(fn, device, flush_l2, _Plan(warmup, repeats, min_time_s, give_up_ms))
    except Exception as exc:
        if context_lost(exc):
            raise ContextLost(f"{type(exc).__name__}: {first_line(exc)}") from exc
        return Timing.failed(f"{type(exc).__name__}: {exc}")
    return Timing.from_samples(samples)


def measure_interleaved(
    fns: Sequence[Callable[[], object]],
    *,
    device: torch.device | str,
    rounds: int = 3,
    warmup: int = 2,
    repeats: int = 10,
    min_time_s: float = 0.0,
) -> list[Timing]:
    """Time several functions against one another: `rounds` rounds, each timing every function in turn with
    `measure` (the later rounds warm up once), so that a change of the machine's load while they are timed
    (another process on a shared CPU) reaches them alike. Each result pools the samples of its rounds; a
    function that fails in any round fails."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"measure_interleaved needs rounds >= 1, not {rounds!r}")
    pooled: list[list[float]] = [[] for _ in fns]
    errors: list[str | None] = [None] * len(fns)
    for index in range(rounds):
        for position, fn in enumerate(fns):
            if errors[position] is not None:
                continue
            timing = measure(
                fn, device=device, warmup=warmup if index == 0 else 1, repeats=repeats, min_time_s=min_time_s
            )
            if timing.ok:
                pooled[position].extend(timing.samples)
            else:
                errors[position] = timing.error
    return [
        Timing.failed(error) if error is not None else Timing.from_samples(samples)
        for samples, error in zip(pooled, errors, strict=True)
    ]


@dataclass(frozen=True)
class _Plan:
    """What one `measure` call does: `warmup` untimed calls, then timed ones (see `measure`)."""

    warmup: int
    repeats: int
    min_time_s: float
    give_up_ms: float


def _time_cpu(fn: Callable[[], object], device: torch.device, flush_l2: bool, plan: _Plan) -> list[float]:
    for _ in range(plan.warmup):
        fn()
    samples: list[float] = []
    while _wants_more(samples, plan.repeats, plan.min_time_s):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e6)
        if len(samples) == 1 and samples[0] > plan.give_up_ms:
            break
    return samples


def _time_cuda(fn: Callable[[], object], device: torch.device, flush_l2: bool, plan: _Plan) -> list[float]:
    repeats = plan.repeats
    with torch.cuda.device(device):
        flush = torch.empty(_flush_bytes(device), dtype=torch.uint8, device=device) if flush_l2 else None
        for _ in range(plan.warmup):
            fn()
        torch.cuda.synchronize()
        fn = _graphed(fn) or fn
        samples: list[float] = []
        if math.isfinite(plan.give_up_ms):
            fn()  # a graph's first replay uploads it: not timed
            samples.append(_timed_once(fn, flush))
            if samples[0] > plan.give_up_ms:
                return samples
        while _wants_more(samples, repeats, plan.min_time_s):
            batch = min(repeats, repeats * _MAX_SAMPLES_FACTOR - len(samples))
            events = []
            for _ in range(batch):
                if flush is not None:
                    flush.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize()
            samples.extend(start.elapsed_time(end) for start, end in events)
        return samples


def _timed_once(fn: Callable[[], object], flush: torch.Tensor | None) -> float:
    """One call of `fn` after an L2 flush, timed with CUDA events (ms)."""
    if flush is not None:
        flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _graphed(fn: Callable[[], object]) -> Callable[[], object] | None:
    """`fn` captured in a CUDA graph, to time its replay: the GPU time of its work without the host's launch
    overhead, as an engine replays its layers. None when `fn` cannot be captured (it synchronizes with the
    host, say); it is then timed as it is."""
    try:
        graph, _ = capture(fn)
    except Exception:
        return None
    return graph.replay


def _flush_bytes(device: torch.device) -> int:
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    return 2 * l2_bytes if l2_bytes > 0 else _FALLBACK_FLUSH_BYTES


def _wants_more(samples: list[float], repeats: int, min_time_s: float) -> bool:
    if len(samples) < repeats:
        return True
    return math.fsum(samples) < min_time_s * 1e3 and len(samples) < repeats * _MAX_SAMPLES_FACTOR


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted samples, interpolating linearly between neighbours."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
