"""The trtexec-like benchmark: shapes it runs at, the numbers it reports, streams, the CUDA phases."""

import json
import threading

import numpy as np
import pytest
import torch

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.errors import InputError
from tensorforge.frontend import import_model
from tensorforge.runtime.bench import (
    BenchOptions,
    bench_engine,
    bench_executor,
    bench_onnxruntime,
    engine_shapes,
    model_shapes,
    summarize,
    with_batch,
)
from tensorforge.runtime.context import ExecutionContext
from tests.helpers import make_model, tensor_info

SHORT = BenchOptions(warmup_s=0.02, duration_s=0.2)
STATS = ("min", "mean", "median", "p90", "p99")


def _engine(device: str):
    profile = Profile().add("input", (1, 64, 16, 16), (2, 64, 16, 16), (4, 64, 16, 16))
    config = BuildConfig(device=device, effort=0, profiles=(profile,))
    return build_engine(import_model(zoo.export("inception")), config)


@pytest.fixture(scope="module")
def engine():
    return _engine("cpu")


def _feeds(batch: int = 2):
    return {"input": np.random.default_rng(5).standard_normal((batch, 64, 16, 16)).astype(np.float32)}


def _relu_model():
    from onnx import helper

    node = helper.make_node("Relu", ["x"], ["y"])
    return import_model(make_model([node], [tensor_info("x", ["N", 8])], [tensor_info("y", ["N", 8])]))


def _check_stats(stats: dict[str, float]) -> None:
    assert set(stats) == set(STATS)
    assert 0 < stats["min"] <= stats["median"] <= stats["p90"] <= stats["p99"]
    assert stats["min"] <= stats["mean"]


def test_engine_on_the_cpu_reports_sane_numbers(engine):
    result = bench_engine(engine, _feeds(), SHORT)
    assert result.runner == "engine" and result.device == "cpu" and result.graphs
    assert result.iterations >= 1 and result.batch == 2 and result.streams == 1
    assert result.wall_s >= SHORT.duration_s
    assert result.inferences_per_s == pytest.approx(result.iterations / result.wall_s)
    assert result.samples_per_s == pytest.approx(2 * result.inferences_per_s)
    _check_stats(result.latency_ms)
    assert result.compute_ms == result.latency_ms  # one synchronous call per inference
    assert result.h2d_ms is None and result.d2h_ms is None and result.enqueue_ms is None
    busy_s = result.latency_ms["mean"] * result.iterations / 1e3
    assert 0.5 * result.wall_s < busy_s <= result.wall_s  # one worker: inferences back to back


def test_json_has_every_field(engine):
    data = json.loads(json.dumps(bench_engine(engine, _feeds(), SHORT).to_dict()))
    expected = {"runner", "device", "graphs", "streams", "batch", "shapes", "warmup_s", "duration_s"}
    expected |= {"iterations", "wall_s", "throughput", "latency_ms", "compute_ms", "h2d_ms", "d2h_ms", "notes"}
    assert expected <= set(data)
    assert set(data["throughput"]) == {"inferences_per_s", "samples_per_s"}
    assert data["shapes"] == {"input": [2, 64, 16, 16]}


def test_several_streams_run_at_once(engine):
    result = bench_engine(engine, _feeds(), BenchOptions(warmup_s=0.02, duration_s=0.2, streams=2))
    assert result.streams == 2 and result.iterations >= 2
    busy_s = result.latency_ms["mean"] * result.iterations / 1e3
    assert busy_s <= 2 * result.wall_s  # two workers, each busy at most the whole wall time


def test_reference_executor(engine):
    result = bench_executor(import_model(zoo.export("inception")), _feeds(1), SHORT, "cpu")
    assert result.runner == "executor" and result.iterations >= 1 and result.batch == 1
    _check_stats(result.latency_ms)


class _Session:
    """An ONNX Runtime session's surface: its inputs, and a run that records its thread and what it was given."""

    def __init__(self, names):
        self.names = names
        self.threads, self.seen = set(), []

    def get_inputs(self):
        return [type("Input", (), {"name": name})() for name in self.names]

    def run(self, outputs, feeds):
        self.threads.add(threading.get_ident())
        self.seen.append(feeds)
        return [feeds["input"] * 2]


def test_onnxruntime_is_timed_on_host_arrays_from_the_calling_thread():
    session = _Session(["input"])
    feeds = _feeds()
    result = bench_onnxruntime(session, feeds, SHORT, "cuda:1")
    assert result.runner == "onnxruntime" and result.device == "cuda:1" and not result.graphs
    assert result.iterations >= 1 and result.batch == 2 and result.shapes == {"input": (2, 64, 16, 16)}
    _check_stats(result.latency_ms)
    assert result.h2d_ms is None and result.compute_ms == result.latency_ms  # session.run copies inside its time
    assert session.threads == {threading.get_ident()}  # one stream: the caller's thread (the module docstring)
    assert all(np.array_equal(seen["input"], feeds["input"]) for seen in session.seen)
    missing = _Session(["input", "mask"])
    with pytest.raises(InputError, match=r"inputs \['mask'\] that the engine's have not"):
        bench_onnxruntime(missing, feeds, SHORT, "cpu")


def test_one_stream_runs_on_the_calling_thread_several_on_their_own(engine):
    threads = set()
    context_enqueue = ExecutionContext.enqueue

    def recording(self, *args, **kwargs):
        threads.add(threading.get_ident())
        return context_enqueue(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExecutionContext, "enqueue", recording)
        bench_engine(engine, _feeds(), SHORT)
        assert threads == {threading.get_ident()}
        threads.clear()
        bench_engine(engine, _feeds(), BenchOptions(warmup_s=0.02, duration_s=0.2, streams=2))
        assert len(threads - {threading.get_ident()}) == 2


def test_engine_shapes_pick_the_profile_that_fits():
    model = _relu_model()
    small = Profile().add("x", (1, 8), (2, 8), (4, 8))
    large = Profile().add("x", (5, 8), (16, 8), (32, 8))
    engine = build_engine(model, BuildConfig(effort=0, profiles=(small, large)))
    assert engine_shapes(engine, {}) == {"x": (2, 8)}
    assert engine_shapes(engine, {}, batch=3) == {"x": (3, 8)}
    assert engine_shapes(engine, {}, batch=20) == {"x": (20, 8)}
    assert engine_shapes(engine, {"x": (6, 8)}) == {"x": (6, 8)}
    with pytest.raises(InputError, match="(?s)--batch 64: no optimization profile.*max \\[32, 8\\]"):
        engine_shapes(engine, {}, batch=64)


def test_model_shapes_fill_the_batch_dim():
    model = _relu_model()
    assert model_shapes(model, {}) == {"x": (1, 8)}
    assert model_shapes(model, {}, batch=8) == {"x": (8, 8)}
    assert model_shapes(model, {"x": (3, 8)}, batch=5) == {"x": (5, 8)}
    fixed = import_model(zoo.export("inception", dynamic_batch=False))
    with pytest.raises(InputError, match="fixed leading dim of 1"):
        model_shapes(fixed, {}, batch=2)


def test_bad_options_are_refused():
    with pytest.raises(InputError, match="duration"):
        BenchOptions(duration_s=0)
    with pytest.raises(InputError, match="warm-up"):
        BenchOptions(warmup_s=-1)
    with pytest.raises(InputError, match="streams"):
        BenchOptions(streams=0)
    with pytest.raises(InputError, match="scalars"):
        with_batch({"x": (), "y": (2, 3)}, 4)
    with pytest.raises(InputError, match="at least 1"):
        with_batch({"x": (2,)}, 0)


def test_bench_refuses_cuda_graphs_on_the_cpu(engine):
    with pytest.raises(InputError, match="CUDA graphs need"):
        bench_engine(engine, _feeds(), SHORT, cuda_graphs=True)


def test_summarize():
    stats = summarize([float(v) for v in range(1, 101)])
    assert stats == pytest.approx({"min": 1, "mean": 50.5, "median": 50.5, "p90": 90.1, "p99": 99.01})


@pytest.fixture(scope="module")
def cuda_engine():
    return _engine("cuda")


@pytest.mark.gpu
def test_cuda_phases_are_timed_separately(cuda_engine):
    result = bench_engine(cuda_engine, _feeds(4), BenchOptions(warmup_s=0.1, duration_s=0.5))
    assert result.device.startswith("cuda") and result.graphs and not result.notes
    for stats in (result.latency_ms, result.compute_ms, result.h2d_ms, result.d2h_ms, result.enqueue_ms):
        _check_stats(stats)
    # each inference's latency spans its copies and its compute
    assert result.latency_ms["median"] >= result.compute_ms["median"]
    assert result.latency_ms["min"] >= result.h2d_ms["min"] + result.d2h_ms["min"]
    assert result.samples_per_s == pytest.approx(4 * result.inferences_per_s)


@pytest.mark.gpu
def test_cuda_without_graphs_and_with_streams(cuda_engine):
    eager = bench_engine(cuda_engine, _feeds(), BenchOptions(warmup_s=0.1, duration_s=0.3), cuda_graphs=False)
    assert not eager.graphs and eager.iterations >= 1
    streams = bench_engine(cuda_engine, _feeds(), BenchOptions(warmup_s=0.1, duration_s=0.5, streams=3))
    assert streams.streams == 3 and streams.graphs and streams.iterations >= 3
    _check_stats(streams.latency_ms)


@pytest.mark.gpu
def test_cuda_executor_runs_on_its_streams():
    result = bench_executor(import_model(zoo.export("inception")), _feeds(1), BenchOptions(0.05, 0.3, 2), "cuda")
    assert result.runner == "executor" and not result.graphs and result.iterations >= 2
    _check_stats(result.h2d_ms)
    torch.cuda.synchronize()
