"""The dynamic batcher: merged batches give every request its own answer, back-pressure, timeouts, shutdown."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tensorforge import InputError, zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.frontend import import_model
from tensorforge.runtime.batcher import Busy, DynamicBatcher, ShuttingDown
from tensorforge.runtime.context import ExecutionContext


def _engine(low=1, opt=4, high=8):
    profile = Profile().add("input", (low, 64, 16, 16), (opt, 64, 16, 16), (high, 64, 16, 16))
    return build_engine(import_model(zoo.export("inception")), BuildConfig(effort=0, profiles=(profile,)))


@pytest.fixture(scope="module")
def engine():
    return _engine()


def _request(batch, seed):
    return {"input": np.random.default_rng(seed).standard_normal((batch, 64, 16, 16)).astype(np.float32)}


def _direct(engine, feeds):
    return engine.create_context().run(feeds)["output"].numpy()


def test_concurrent_requests_are_merged_and_each_gets_its_own_rows(engine):
    batcher = DynamicBatcher(engine, max_delay_ms=20, contexts=2)
    requests = [_request(1 + i % 3, i) for i in range(24)]
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(batcher.infer, requests))
    batcher.close()
    for feeds, result in zip(requests, results, strict=True):
        want = _direct(engine, feeds)
        assert result["output"].shape == want.shape
        assert np.abs(result["output"] - want).max() <= 1e-5 * np.abs(want).max()
    stats = batcher.stats
    assert stats.completed == stats.requests == 24 and stats.failed == 0
    assert stats.batches < 24 and max(stats.batch_sizes) > 1 and max(stats.batch_sizes) <= 8


def test_every_cpu_batcher_runs_its_batches_on_the_one_cpu_thread(engine, monkeypatch):
    threads = []
    run = ExecutionContext.run

    def recording(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(ExecutionContext, "run", recording)
    batchers = [DynamicBatcher(engine, max_delay_ms=1, contexts=2) for _ in range(2)]
    requests = [(batchers[i % 2], _request(1, i)) for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda item: item[0].infer(item[1]), requests))
    for batcher in batchers:
        batcher.close()
    assert len(set(threads)) == 1 and threads[0].startswith("tensorforge-cpu")  # not the four workers
    for (_, feeds), result in zip(requests, results, strict=True):
        want = _direct(engine, feeds)
        assert np.abs(result["output"] - want).max() <= 1e-5 * np.abs(want).max()


class _Gate:
    """An engine stand-in whose contexts block until released, to hold the worker busy."""

    def __init__(self, engine):
        self.engine, self.open = engine, threading.Event()
        self.model, self.plans, self.device = engine.model, engine.plans, engine.device

    def create_context(self):
        context = self.engine.create_context()
        gate = self.open

        class Blocking:
            def run(self, feeds):
                gate.wait(10)
                return context.run(feeds)

        return Blocking()


def test_a_full_queue_answers_busy_and_late_requests_time_out(engine):
    gate = _Gate(engine)
    batcher = DynamicBatcher(gate, max_delay_ms=0, max_queue=2)
    first = batcher.submit(_request(1, 0))  # taken by the worker, which then blocks
    time.sleep(0.2)
    late = batcher.submit(_request(1, 1), timeout_s=0.01)
    batcher.submit(_request(1, 2))
    with pytest.raises(Busy, match="queue is full"):
        batcher.submit(_request(1, 3))
    time.sleep(0.05)
    gate.open.set()
    assert first.result(10)["output"].shape == (1, 96, 16, 16)
    with pytest.raises(TimeoutError):
        late.result(10)
    batcher.close()
    assert batcher.stats.rejected_busy == 1 and batcher.stats.timed_out == 1


def test_close_finishes_queued_requests_and_refuses_new_ones(engine):
    gate = _Gate(engine)
    batcher = DynamicBatcher(gate, max_delay_ms=0)
    futures = [batcher.submit(_request(1, i)) for i in range(3)]
    closer = threading.Thread(target=batcher.close)
    closer.start()
    time.sleep(0.05)
    with pytest.raises(ShuttingDown):
        batcher.submit(_request(1, 9))
    gate.open.set()
    closer.join(10)
    assert all(f.result(0)["output"].shape == (1, 96, 16, 16) for f in futures)


def test_a_preferred_size_runs_without_waiting_for_the_delay(engine):
    batcher = DynamicBatcher(engine, max_delay_ms=5000, preferred_batch_sizes=[2])
    start = time.perf_counter()
    futures = [batcher.submit(_request(1, i)) for i in range(2)]
    for future in futures:
        future.result(10)
    assert time.perf_counter() - start < 2.5
    batcher.close()
    assert batcher.stats.batch_sizes[2] == 1


def test_batches_below_the_engines_smallest_are_padded():
    engine = _engine(4, 4, 4)
    batcher = DynamicBatcher(engine, max_delay_ms=0)
    feeds = _request(1, 5)
    got = batcher.infer(feeds)["output"]
    batcher.close()
    padded = {"input": np.repeat(feeds["input"], 4, axis=0)}
    want = _direct(engine, padded)[:1]
    assert got.shape == (1, 96, 16, 16) and np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_requests_that_cannot_be_batched_are_refused_clearly(engine):
    batcher = DynamicBatcher(engine)
    with pytest.raises(InputError, match="unknown"):
        batcher.submit({"x": np.zeros((1, 64, 16, 16), np.float32)})
    with pytest.raises(InputError, match="takes 1..8"):
        batcher.submit(_request(9, 0))
    with pytest.raises(InputError, match="preferred batch sizes"):
        DynamicBatcher(engine, preferred_batch_sizes=[16])
    bad = batcher.submit({"input": torch.randn(1, 64, 8, 8)})  # a shape outside the profile fails its batch only
    with pytest.raises(InputError, match="profile"):
        bad.result(10)
    assert batcher.infer(_request(1, 0))["output"].shape == (1, 96, 16, 16)
    batcher.close()
