"""`DynamicBatcher`: merge concurrent requests into batches over a pool of execution contexts.

A request is a dict of input tensors whose first axis is its batch (1..k). Requests wait in one bounded
queue; a worker (one per context, each on its own CUDA stream) takes the oldest, then gathers the next ones
whose inputs agree on every axis but the first, until the batch reaches the engine's largest batch, one of
the preferred sizes, or the oldest request has waited `max_delay_ms`. The batch runs as one call; its outputs
are split back along the first axis. A full queue answers `Busy` at once instead of growing; a request that
outlives its timeout before it runs gets `TimeoutError`; `close()` refuses new requests and finishes the
queued ones. On the CPU the workers run their batches on the process's one CPU inference thread
(`cpu_thread`: OpenMP loops started from several threads run far slower), so there extra contexts overlap the
gathering of batches, not their compute, which uses every core anyway.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import InputError, TensorforgeError
from ..tensors import from_any
from .cpu_thread import on_cpu_thread
from .engine import Engine


class Busy(TensorforgeError):
    """The request queue is full: try again later (HTTP 503)."""


class ShuttingDown(TensorforgeError):
    """The batcher is closing and takes no new requests."""


@dataclass
class _Request:
    inputs: dict[str, torch.Tensor]
    size: int
    signature: tuple
    deadline: float | None
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatcherStats:
    """Counters for metrics: requests by outcome, batches run, and the sizes of those batches."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    rejected_busy: int = 0
    timed_out: int = 0
    batches: int = 0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)


class DynamicBatcher:
    """Batches requests for `engine` on `contexts` execution contexts; `submit` returns a Future of the
    outputs (numpy arrays by output name, the request's own rows). `on_batch(size)` is told of every batch
    run (for metrics); `max_batch` caps the merged batch below the engine's largest (1 turns merging off)."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_delay_ms: float = 2.0,
        preferred_batch_sizes: Sequence[int] = (),
        max_queue: int = 256,
        contexts: int = 1,
        timeout_s: float | None = None,
        on_batch: Callable[[int], None] | None = None,
        max_batch: int | None = None,
    ) -> None:
        self.engine = engine
        self.on_batch = on_batch
        self.min_batch, self.max_batch = _batch_range(engine)
        if max_batch is not None:  # 1: no merging (each request runs alone)
            if not 1 <= max_batch <= self.max_batch:
                raise InputError(f"max_batch {max_batch} is outside 1..{self.max_batch}, the engine's batch range")
            self.max_batch = max_batch
        bad = [s for s in preferred_batch_sizes if not 1 <= s <= self.max_batch]
        if bad:
            raise InputError(f"preferred batch sizes {bad} are outside 1..{self.max_batch}, the engine's batch range")
        if max_queue < 1 or contexts < 1 or max_delay_ms < 0:
            raise InputError("max_queue and contexts must be at least 1, max_delay_ms at least 0")
        self.max_delay_s = max_delay_ms / 1e3
        self.preferred = sorted(set(preferred_batch_sizes))
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.stats = BatcherStats()
        self._queue: collections.deque[_Request] = collections.deque()
        self._lock = threading.Condition()
        self._closing = False
        graph = engine.model.graph
        self._inputs = [v for v in graph.inputs if v.name not in graph.initializers]
        self._outputs = [v.name for v in graph.outputs]
        self._workers = [
            threading.Thread(target=self._work, args=(engine.create_context(),), name=f"batcher-{i}", daemon=True)
            for i in range(contexts)
        ]
        for worker in self._workers:
            worker.start()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def submit(self, feeds: Mapping[str, Any], timeout_s: float | None = None) -> Future:
        """Queue one request; raises `Busy` when the queue is full, `ShuttingDown` after `close()`, and
        `InputError` for inputs that cannot be batched (names, ranks, batch sizes that disagree)."""
        request = self._request(feeds, timeout_s if timeout_s is not None else self.timeout_s)
        with self._lock:
            if self._closing:
                raise ShuttingDown("the model is shutting down and takes no new requests")
            if len(self._queue) >= self.max_queue:
                self.stats.rejected_busy += 1
                raise Busy(f"the request queue is full ({self.max_queue} waiting); try again later")
            self.stats.requests += 1
            self._queue.append(request)
            self._lock.notify()
        return request.future

    def infer(self, feeds: Mapping[str, Any], timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """`submit` and wait for the result."""
        return self.submit(feeds, timeout_s).result()

    def close(self, timeout_s: float | None = None) -> None:
        """Take no new requests, finish the queued ones, stop the workers."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        for worker in self._workers:
            worker.join(timeout_s)

    # -- internals ------------------------------------------------------------------------------------

    def _request(self, feeds: Mapping[str, Any], timeout_s: float | None) -> _Request:
        names = {v.name for v in self._inputs}
        unknown, missing = sorted(set(feeds) - names), sorted(names - set(feeds))
        if unknown or missing:
            raise InputError(f"inputs: unknown {unknown}, missing {missing}; the model takes {sorted(names)}")
        tensors = {name: from_any(data, "cpu") for name, data in feeds.items()}
        sizes = {name: (t.shape[0] if t.dim() else None) for name, t in tensors.items()}
        if None in sizes.values() or len(set(sizes.values())) != 1:
            raise InputError(f"every input needs the same batch size on its first axis; got {sizes}")
        size = next(iter(sizes.values()))
        if not 1 <= size <= self.max_batch:
            raise InputError(f"a request's batch is {size}; this engine takes 1..{self.max_batch} per call")
        signature = tuple((name, tuple(t.shape[1:]), t.dtype) for name, t in sorted(tensors.items()))
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        return _Request(tensors, size, signature, deadline)

    def _work(self, context) -> None:
        on_cpu = self.engine.device.type == "cpu"
        while True:
            batch = self._gather()
            if batch is None:
                return
            if on_cpu:  # every CPU batch of the process on one thread (`cpu_thread`)
                on_cpu_thread(self._run, context, batch)
            else:
                self._run(context, batch)

    def _gather(self) -> list[_Request] | None:
        """The next batch: the oldest request and the compatible ones after it (None: closing, queue empty)."""
        with self._lock:
            while True:
                while not self._queue:
                    if self._closing:
                        return None
                    self._lock.wait()
                first = self._queue[0]  # read again after every wait: another worker may have taken it
                compatible = [r for r in self._queue if r.signature == first.signature]
                total = sum(r.size for r in compatible)
                waited = time.perf_counter() - first.queued_at
                if total >= self.max_batch or total in self.preferred or self._closing or waited >= self.max_delay_s:
                    break
                self._lock.wait(self.max_delay_s - waited)
            batch, size = [], 0
            for request in compatible:
                if size + request.size > self.max_batch:
                    break
                batch.append(request)
                size += request.size
            for request in batch:
                self._queue.remove(request)
            return batch

    def _run(self, context, batch: list[_Request]) -> None:
        now = time.perf_counter()
        live = []
        for request in batch:
            if request.deadline is not None and now > request.deadline:
                self.stats.timed_out += 1
                request.future.set_exception(TimeoutError("the request waited past its timeout before it could run"))
            else:
                live.append(request)
        if not live:
            return
        total = sum(r.size for r in live)
        padding = max(self.min_batch - total, 0)  # rows repeated to reach the engine's smallest batch
        feeds = {
            name: torch.cat([r.inputs[name] for r in live] + [live[0].inputs[name][:1].expand(padding, *t.shape[1:])])
            for name, t in live[0].inputs.items()
        }
        try:
            outputs = context.run(feeds)
            arrays = {name: outputs[name].cpu().numpy() for name in self._outputs}
            for name, array in arrays.items():
                if array.ndim == 0 or array.shape[0] != total + padding:
                    raise InputError(
                        f"output {name!r} has shape {list(array.shape)}: its first axis is not the batch, so a "
                        "merged batch cannot be split back; serve this model without dynamic batching"
                    )
        except Exception as err:  # one batch failing must not take the worker down
            for request in live:
                self.stats.failed += 1
                request.future.set_exception(err)
            return
        self.stats.batches += 1
        self.stats.batch_sizes[total] += 1
        if self.on_batch is not None:
            self.on_batch(total)
        start = 0
        for request in live:
            rows = slice(start, start + request.size)
            request.future.set_result({name: array[rows] for name, array in arrays.items()})
            start += request.size
            self.stats.completed += 1


def _batch_range(engine: Engine) -> tuple[int, int]:
    """The first-axis sizes a merged call may have: from the smallest any profile accepts for every input to
    the largest (a batch below the smallest is padded)."""
    lows, highs = [], []
    for plan in engine.plans:
        ranges = list(plan.profile.ranges.values())
        if not ranges or any(len(r.max) == 0 for r in ranges):
            raise InputError("the engine has an input without a batch axis (rank 0); it cannot be batched")
        lows.append(max(r.min[0] for r in ranges))
        highs.append(min(r.max[0] for r in ranges))
    return min(lows), max(highs)
