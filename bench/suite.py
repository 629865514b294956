"""Side-by-side benchmark suite: tensorforge engines against PyTorch eager, eager + CUDA graph, torch.compile and
ONNX Runtime, for each zoo model × batch size × precision, all measured in one process.

Systems (`--systems`):
- `tensorforge`: an engine built for the fixed batch with `fp32` plus the precision asked for (fp16, bf16,
  tf32), run through `ExecutionContext.run` (CUDA graph replays on CUDA, CPU graph replays on the CPU), fed
  float32 as the model declares;
- `tensorforge-eager`: the same engine through a context that replays no graph (every layer's Python each call);
- `eager`: the PyTorch module in the precision (channels_last on CUDA; tf32 turns on TF32 matmul and cuDNN
  convolutions, fp32 turns both off);
- `eager+graph`: that module captured in one CUDA graph and replayed (CUDA only);
- `compile`, `compile-ro`, `compile-max`: `torch.compile` in mode "default", "reduce-overhead" (CUDA graphs) or
  "max-autotune" (minutes per model on a GPU);
- `ort`: ONNX Runtime's CPU execution provider on the exported model (fp32 only).

Each time is the median of `--runs` synchronized calls after `--warmup` calls; build/compile/session time is
recorded, and the accuracy as max|y − y₆₄| / max|y₆₄| against the module in float64. tf32, fp16, bf16 and fp8
run on CUDA only (bf16 also on a CPU with bf16 dot products); int8 and fp8 engines are tensorforge's only. A system
that fails records its error and the suite goes on. `--interleave` times every (system, precision) pair of a model
and batch in rounds of a few calls each (`interleaved_ms`), in a new random order each round, rather than one after
another: on a shared machine whose speed drifts, every system then sees the same drift, and their ratios hold (all
of them are held in memory at once). A round begins with an untimed call: alternating call by call instead left
every call with weights the other systems had evicted, and doubled every time on a 2-core CPU with MobileNetV3.
Each row keeps its median of every round (`round_ms`), and the markdown adds tensorforge's time over each peer's
paired round by round (`paired_ratios`): on a 2-core VM whose speed swung within runs, the ratio of medians read
0.99× and 1.19× for the same BERT-base engine an hour apart.

    python bench/suite.py --models resnet50 bert_base --batch 1 --batch 64 --precision fp16 --out DIR
    python bench/suite.py --models yolo --batch 8 --systems compile-max --merge --out DIR   # adds to DIR
    python bench/suite.py --models mobilenetv3 --device cpu --systems tensorforge ort --interleave --out DIR
    python bench/suite.py report DIR                                                          # md + png again

Writes `results.json` (the invocations with device, versions, date, command line; one row per model, batch,
system, precision), `results.md` (a table per model: systems × batch sizes) and `results.png`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tensorforge import __version__, zoo
from tensorforge.build.builder import Builder
from tensorforge.build.config import BuildConfig, Profile, QuantizationConfig
from tensorforge.frontend import import_model
from tensorforge.onnxruntime_session import open_session, providers_for
from tensorforge.ops.math_flags import cpu_native_precisions
from tensorforge.runtime.engine import Engine
from tensorforge.tactics.autotune import relative_error

SYSTEMS = ("tensorforge", "tensorforge-eager", "eager", "eager+graph", "compile", "compile-ro", "compile-max", "ort")
DEFAULT_SYSTEMS = ("tensorforge", "eager", "eager+graph", "compile", "ort")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8")
# tensorforge only: engines with quantized layers and, elsewhere, the device's fast float type (fp16 on CUDA, bf16
# on a CPU that multiplies it in hardware, else fp32), as one would build them with `--int8 --fp16`
QUANTIZED = ("int8", "fp8")
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Image side or sequence length each model is benchmarked at (others: the zoo's default size).
BENCH_SIZES = {
    "resnet50": 224,
    "mobilenetv3": 224,
    "mobilenetv3_relu6": 224,
    "efficientnet_b0": 224,
    "convnext_tiny": 224,
    "vit_s16": 224,
    "yolo": 640,
    "bert_base": 128,
}
RESULTS_JSON, RESULTS_MD, RESULTS_PNG = "results.json", "results.md", "results.png"

Feeds = dict[str, torch.Tensor]


# -- timing helpers ----------------------------------------------------------------------------------------


def synchronizer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def median_ms(fn: Callable[[], Any], device: torch.device, runs: int, warmup: int) -> float:
    """Median wall time in ms of `runs` calls of `fn`, each followed by a device synchronization, after
    `warmup` calls (a latency: one call is one request)."""
    sync = synchronizer(device)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


SETTLE_S = 0.1  # a pause before each system's round: the thread pools of the one before stop spinning
PROGRESS_EVERY = 50  # a build prints each 50th layer tuned (every attempt of a quantized build tunes its layers anew)


def interleaved_ms(
    calls: Mapping[str, Callable[[], Any]],
    device: torch.device,
    runs: int,
    warmup: int,
    block: int = 5,
    seed: int = 0,
    settle_s: float = SETTLE_S,
    rounds: dict[Any, list[float]] | None = None,
) -> dict[str, float | Exception]:
    """Per key, the median wall time in ms of `runs` calls of its function, after `warmup` calls of each, timed in
    rounds: each round every function in turn (a new random order each round, `seed`) waits `settle_s`, makes one
    untimed call, which brings its weights back into the caches the others used, then up to `block` timed calls, each
    followed by a device synchronization. A function that raises gets its exception and leaves the rounds. `rounds`,
    where given, gets each key's median of every round, in order (`paired_ratios` compares them round by round).

    The wait: ONNX Runtime's threads keep spinning for milliseconds after its calls, and on a 2-core machine they
    took the cores from the next system's threads: tensorforge's MobileNetV3 timed 7.7-9.2 ms right after ONNX
    Runtime's rounds against 4.7-5.5 ms after a 50 ms pause (5 ms was not enough)."""
    sync = synchronizer(device)
    results: dict[str, float | Exception] = {}
    times: dict[str, list[float]] = {key: [] for key in calls}
    for key, fn in calls.items():
        try:
            for _ in range(warmup):
                fn()
            sync()
        except Exception as error:  # the caller records it in the row
            results[key] = error
    order = random.Random(seed)
    for first in range(0, runs, block):
        keys = [key for key in calls if key not in results]
        order.shuffle(keys)
        for key in keys:
            try:
                time.sleep(settle_s)
                calls[key]()
                sync()
                samples = []
                for _ in range(min(block, runs - first)):
                    start = time.perf_counter()
                    calls[key]()
                    sync()
                    samples.append(time.perf_counter() - start)
                times[key] += samples
                if rounds is not None:
                    rounds.setdefault(key, []).append(1e3 * statistics.median(samples))
            except Exception as error:  # the caller records it in the row
                results[key] = error
    for key, samples in times.items():
        if key not in results:
            results[key] = 1e3 * statistics.median(samples)
    return results


def graphed(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    """`module(*inputs)` captured in one CUDA graph (after three warm-up calls on a side stream); the returned
    function copies `inputs` into the graph's static inputs, replays it and returns its static output."""
    static = [x.clone() for x in inputs]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(3):
            module(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        out = module(*static)

    def replay():
        for buffer, x in zip(static, inputs, strict=True):
            buffer.copy_(x)
        graph.replay()
        return out

    return replay


@contextlib.contextmanager
def math_mode(precision: str) -> Iterator[None]:
    """TF32 matmuls and cuDNN convolutions on for `tf32`, off otherwise; the previous flags restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def eager_inputs(feeds: Feeds, device: torch.device, precision: str) -> list[torch.Tensor]:
    """The feeds on `device`, floating ones in the precision's dtype, 4-d ones channels_last on CUDA."""
    out = []
    for x in feeds.values():
        x = x.to(device)
        if x.is_floating_point():
            x = x.to(DTYPES[precision])
        if device.type == "cuda" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        out.append(x)
    return out


def eager_module(name: str, size: int | None, device: torch.device, precision: str) -> torch.nn.Module:
    module = zoo.build(name, size=size).to(device=device, dtype=DTYPES[precision])
    return module.to(memory_format=torch.channels_last) if device.type == "cuda" else module


# -- one measurement per system ----------------------------------------------------------------------------


class Case:
    """One model at one batch size on one device: its feeds, its ONNX export, its float64 reference and the engines
    built for it."""

    def __init__(
        self,
        name: str,
        batch: int,
        size: int,
        device: torch.device,
        runs: int,
        warmup: int,
        effort: int,
        engines: Path | None = None,
        precompile: bool = True,
        families: tuple[str, ...] | None = None,
        timing_caches: Path | None = None,
    ):
        self.name, self.batch, self.size, self.device = name, batch, size, device
        self.runs, self.warmup, self.effort, self.engines = runs, warmup, effort, engines
        self.precompile, self.families, self.timing_caches = precompile, families, timing_caches
        self.built: dict[str, tuple[Engine, float]] = {}  # by precision: tensorforge and tensorforge-eager share one
        self.feeds = zoo.example_inputs(name, batch, size, seed=1)
        self.proto = zoo.export(name, batch=batch, size=size, dynamic_batch=False)
        reference = zoo.build(name, size=size).double().to(device)
        with torch.inference_mode():
            self.reference = reference(
                *[x.to(device).double() if x.is_floating_point() else x.to(device) for x in self.feeds.values()]
            )
        del reference

    def timing_cache_seed(self, precision: str) -> Path | None:
        """The earlier build's timing cache this build starts from (`--timing-caches`), where there is one."""
        if self.timing_caches is None:
            return None
        seed = self.timing_caches / f"{self.name}-b{self.batch}-{precision}.timing.json"
        return seed if seed.exists() else None

    def error(self, output: Any) -> float:
        output = torch.as_tensor(output).to(self.reference.device)
        return relative_error(output, self.reference)


Measurement = dict[str, Any]
# What a runner gives: the call to time (one request) and what it measured besides (build time, accuracy, ...).
Prepared = tuple[Callable[[], Any], Measurement]


def build_engine(case: Case, precision: str, chain: str = "auto") -> tuple[Engine, float]:
    """The case's engine in `precision` (quantized ones with `chain`, see QuantizationConfig) and its build
    time in seconds."""
    model = import_model(case.proto)
    profile = Profile()
    for input_name, x in case.feeds.items():
        profile = profile.add(input_name, tuple(x.shape), tuple(x.shape), tuple(x.shape))
    precisions = ("fp32",) if precision == "fp32" else ("fp32", precision)
    calibration = None
    if precision in QUANTIZED:  # scales from the benchmark's own random inputs: a speed measurement
        half = ("fp16",) if case.device.type == "cuda" else cpu_native_precisions()
        precisions = ("fp32", *half, precision)
        calibration = [{k: v.numpy() for k, v in case.feeds.items()}]
    with tempfile.TemporaryDirectory() as scratch:
        seed = case.timing_cache_seed(precision)
        if seed is not None:  # an earlier build's timings: only what they lack is compiled and timed
            shutil.copyfile(seed, Path(scratch) / "timing.json")
            print(f"{case.name} batch {case.batch} {precision}: timing cache seeded from {seed}", flush=True)
        config = BuildConfig(
            device=str(case.device),
            precisions=precisions,
            profiles=(profile,),
            effort=case.effort,
            timing_cache=str(Path(scratch) / "timing.json"),
            quantization=QuantizationConfig(method="minmax", chain=chain) if calibration else None,
            precompile=case.precompile,
            tactic_families=case.families,
        )
        started = time.perf_counter()

        def progress(index: int, count: int, node, choice) -> None:  # where a build cut off by a time limit was
            if index % PROGRESS_EVERY == 0 or index == count - 1:
                print(f"{case.name} batch {case.batch} {precision}: layer {index + 1}/{count} tuned at "
                      f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip

        engine = Builder(config, calibration_data=calibration, on_layer=progress).build(model)
        build_s = time.perf_counter() - started
        if case.engines is not None:  # every candidate's time: what a smaller tuning space would have lost
            case.engines.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(config.timing_cache, case.engines / f"{case.name}-b{case.batch}-{precision}.timing.json")
        return engine, build_s


def run_tensorforge(case: Case, precision: str, graphs: bool = True) -> Prepared:
    """The engine's context, replaying recorded graphs (CUDA or CPU graphs) unless `graphs` is False
    ("tensorforge-eager": the Python of every layer on every call, for what the graphs are worth)."""
    if precision not in case.built:  # one build for both rows: they time the very same engine
        case.built[precision] = build_engine(case, precision)
        if case.engines is not None:  # kept for a later profile or inspection of the very engine measured
            case.engines.mkdir(parents=True, exist_ok=True)
            engine = case.built[precision][0]
            engine.save(case.engines / f"{case.name}-b{case.batch}-{precision}.engine", overwrite=True)
    engine, build_s = case.built[precision]
    context = engine.create_context() if graphs else engine.create_context(cuda_graphs=False, cpu_graphs=False)
    feeds = {k: v.to(case.device) for k, v in case.feeds.items()}
    tactics: dict[str, int] = {}
    for layer in engine.plans[0].layers:
        key = f"{layer.tactic} {layer.config.get('precision', '')}".strip()
        tactics[key] = tactics.get(key, 0) + 1
    measured = {
        "build_s": build_s,
        "timing_cache_seeded": case.timing_cache_seed(precision) is not None,  # then not a cold build's time
        "error_vs_fp64": case.error(context.run(feeds)["output"]),
        "tuning": engine.report.get("tuning", {}),
        "tactics": dict(sorted(tactics.items(), key=lambda item: -item[1])),
    }
    if context.graphs:  # an engine that cannot replay a graph runs the Python of every layer each time
        measured["cuda_graph" if case.device.type == "cuda" else "cpu_graph"] = (
            "; ".join(context.eager_shapes.values()) or "captured"
        )
    chaining = engine.report.get("quantized_activations")
    if chaining:  # a quantized engine: whether its layers pass quantized activations, and the timings that decided
        measured["chaining"] = {
            "mode": chaining.get("mode"),
            "chained": len(chaining.get("chained", [])),
            "timed_slower": len(chaining.get("timed_slower", [])),
            "attempts": chaining.get("attempts", []),
        }
    restored = (engine.report.get("quantization") or {}).get("float_blocks")
    if restored:  # a quantized CPU engine: which quantized layers it runs as float again, and the timings that decided
        measured["restored"] = restored
    return (lambda: context.run(feeds)), measured


def run_eager(case: Case, precision: str, *, graph: bool = False, compile_mode: str | None = None) -> Prepared:
    module = eager_module(case.name, case.size, case.device, precision)
    inputs = eager_inputs(case.feeds, case.device, precision)
    build_s = 0.0
    with math_mode(precision), torch.inference_mode():
        if compile_mode is not None:
            module = torch.compile(module, mode=compile_mode)
            started = time.perf_counter()
            module(*inputs)
            synchronizer(case.device)()
            build_s = time.perf_counter() - started
        if graph:
            started = time.perf_counter()
            fn = graphed(module, inputs)
            build_s = time.perf_counter() - started
        else:

            def fn():
                return module(*inputs)

        output = fn().float()

    def call():
        with math_mode(precision), torch.inference_mode():
            return fn()

    return call, {"build_s": build_s, "error_vs_fp64": case.error(output)}


def run_ort(case: Case, precision: str) -> Prepared:
    """ONNX Runtime's CPU provider: its rows time host arrays in and out, so on a GPU they would hold copies that the
    other systems' rows do not (`tensorforge bench --peer ort:cuda` times it there, copies on both sides)."""
    started = time.perf_counter()
    session = open_session(case.proto, providers_for("cpu"))
    build_s = time.perf_counter() - started
    feeds = {k: v.numpy() for k, v in case.feeds.items()}
    return (lambda: session.run(None, feeds)), {
        "build_s": build_s,
        "error_vs_fp64": case.error(session.run(None, feeds)[0]),
    }


RUNNERS: dict[str, Callable[[Case, str], Prepared]] = {
    "tensorforge": run_tensorforge,
    "tensorforge-eager": lambda case, precision: run_tensorforge(case, precision, graphs=False),
    "eager": run_eager,
    "eager+graph": lambda case, precision: run_eager(case, precision, graph=True),
    "compile": lambda case, precision: run_eager(case, precision, compile_mode="default"),
    "compile-ro": lambda case, precision: run_eager(case, precision, compile_mode="reduce-overhead"),
    "compile-max": lambda case, precision: run_eager(case, precision, compile_mode="max-autotune"),
    "ort": run_ort,
}


def not_applicable(system: str, precision: str, device: torch.device) -> str | None:
    """Why `system` does not run at `precision` on `device` (None when it does)."""
    if precision in QUANTIZED and not system.startswith("tensorforge"):
        return f"{precision} engines are tensorforge's only"
    if precision == "fp8" and (device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)):
        return "fp8 runs on CUDA devices with E4M3 tensor cores (compute capability 8.9 or later)"
    if device.type == "cpu" and precision not in ("fp32", *QUANTIZED, *cpu_native_precisions()):
        return f"{precision} runs on CUDA only" if precision != "bf16" else "this CPU has no bf16 dot products"
    if system == "eager+graph" and device.type != "cuda":
        return "CUDA graphs need CUDA"
    if system == "ort" and precision != "fp32":
        return "ONNX Runtime's CPU provider runs fp32 only"
    return None


def prepare_system(case: Case, system: str, precision: str) -> tuple[dict[str, Any], Callable[[], Any] | None]:
    """One result row with what the system measured before timing, and the call to time (None when it failed:
    the row says how, status "error", the exception and its last frames)."""
    row: dict[str, Any] = {
        "model": case.name,
        "size": case.size,
        "batch": case.batch,
        "system": system,
        "precision": precision,
        "device": "cpu" if system == "ort" else str(case.device),
        "runs": case.runs,
        "warmup": case.warmup,
    }
    try:
        call, measured = RUNNERS[system](case, precision)
    except Exception as error:  # the suite goes on: the row says what broke
        _failed(row, error)
        return row, None
    row.update(measured)
    return row, call


def _failed(row: dict[str, Any], error: BaseException) -> None:
    row["status"] = "error"
    row["error"] = f"{type(error).__name__}: {error}"
    row["traceback"] = "".join(traceback.format_exception(error, limit=-4))


def _timed(case: Case, row: dict[str, Any], ms: float | BaseException) -> None:
    """`row` completed with its median (or the error its timing raised), then the CUDA cache emptied."""
    if isinstance(ms, BaseException):
        _failed(row, ms)
    else:
        row.update(ms=ms, status="ok", throughput=1e3 * case.batch / ms)
    if case.device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError as error:  # a kernel broke the CUDA context: nothing after it can run
            row["status"] = "error"
            row.setdefault("error", f"{type(error).__name__}: {error}")
            row["cuda_context_lost"] = True


def measure_system(case: Case, system: str, precision: str) -> dict[str, Any]:
    """One result row, the system timed alone; a failure is recorded in it and the suite goes on."""
    row, call = prepare_system(case, system, precision)
    if call is not None:
        try:
            ms: float | BaseException = median_ms(call, case.device, case.runs, case.warmup)
        except Exception as error:  # recorded in the row
            ms = error
        _timed(case, row, ms)
    return row


def measure_interleaved(case: Case, pairs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """One result row per (system, precision) pair, all of them timed together call by call (`interleaved_ms`):
    a quantized engine's row beside the float rows of the same rounds."""
    prepared = {pair: prepare_system(case, *pair) for pair in pairs}
    calls = {pair: call for pair, (_, call) in prepared.items() if call is not None}
    rounds: dict[Any, list[float]] = {}
    times = interleaved_ms(calls, case.device, case.runs, case.warmup, rounds=rounds)
    rows = []
    for pair, (row, call) in prepared.items():
        if call is not None:
            row["interleaved"] = True
            _timed(case, row, times[pair])
            if row["status"] == "ok":
                row["round_ms"] = rounds[pair]
        rows.append(row)
    return rows


def paired_ratios(rows: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], Mapping[str, Any], list[float]]]:
    """For each tensorforge row timed in rounds and each other system's row of the same model and batch timed in
    the same rounds: (ours, theirs, our time over theirs in each round). On a shared machine whose speed drifts
    within a run, the ratio of two systems timed seconds apart holds far better than the ratio of their medians."""
    timed = [r for r in rows if r.get("status") == "ok" and r.get("round_ms")]
    pairs = []
    for ours in (r for r in timed if r["system"] == "tensorforge"):
        for theirs in timed:
            same_case = (theirs["model"], theirs["batch"]) == (ours["model"], ours["batch"])
            if same_case and theirs["system"] != "tensorforge" and len(theirs["round_ms"]) == len(ours["round_ms"]):
                ratios = [a / b for a, b in zip(ours["round_ms"], theirs["round_ms"], strict=True)]
                pairs.append((ours, theirs, ratios))
    return pairs


# -- results: JSON, merge, markdown, plot ------------------------------------------------------------------


def row_key(row: Mapping[str, Any]) -> tuple:
    return row["model"], row["batch"], row["system"], row["precision"]


def invocation(device: torch.device, argv: Sequence[str]) -> dict[str, Any]:
    """Where and with what the results were measured."""
    versions: dict[str, str | None] = {"torch": torch.__version__, "tensorforge": __version__}
    for module in ("triton", "onnxruntime"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "CPU")
    return {
        "device": name,
        "device_type": device.type,
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        **versions,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", "bench/suite.py", *argv]),
    }


def merge_results(old: Mapping[str, Any] | None, meta: Mapping[str, Any], rows: Sequence[dict]) -> dict[str, Any]:
    """`old`'s invocations plus `meta` (which replaces an earlier one of the same command), and its rows with
    those of `rows` replacing any of the same key (model, batch, system, precision)."""
    merged = {row_key(row): row for row in (old or {}).get("results", [])}
    merged.update({row_key(row): row for row in rows})
    earlier = [i for i in (old or {}).get("invocations", []) if i.get("command") != meta.get("command")]
    return {"invocations": [*earlier, dict(meta)], "results": list(merged.values())}


def _reference_row(rows: Sequence[dict], row: Mapping[str, Any]) -> dict | None:
    """The eager row a row is compared with: same model and batch, same precision, else fp32."""
    eager = {row_key(r): r for r in rows if r["system"] == "eager" and r["status"] == "ok"}
    for precision in (row["precision"], "fp32"):
        found = eager.get((row["model"], row["batch"], "eager", precision))
        if found is not None:
            return found
    return None


def relative_to_eager(rows: Sequence[dict], row: Mapping[str, Any]) -> float | None:
    """Throughput of `row` over that of its eager row (> 1: faster than eager)."""
    reference = _reference_row(rows, row)
    if reference is None or row["status"] != "ok":
        return None
    return reference["ms"] / row["ms"]


def _ordered(rows: Sequence[dict]) -> list[tuple[str, str]]:
    series = {(r["system"], r["precision"]) for r in rows}
    return sorted(series, key=lambda s: (PRECISIONS.index(s[1]), SYSTEMS.index(s[0])))


def _cell(rows: Sequence[dict], row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] != "ok":
        return f"failed: {row['error'].splitlines()[0][:80].replace('|', '/')}"
    ratio = relative_to_eager(rows, row)
    vs = "-" if ratio is None else f"{ratio:.2f}×"
    return (
        f"{row['ms']:.3f} ms · {row['throughput']:,.0f}/s · {vs} · {row['error_vs_fp64']:.1e} · "
        f"build {row['build_s']:.1f} s" + (" (cached timings)" if row.get("timing_cache_seeded") else "")
    )


def markdown(data: Mapping[str, Any]) -> str:
    """One table per model: a row per system and precision, a column per batch size."""
    rows = data["results"]
    lines = ["# Benchmark suite", ""]
    for meta in data["invocations"]:
        versions = ", ".join(f"{k} {meta[k]}" for k in ("torch", "triton", "onnxruntime", "tensorforge"))
        lines.append(
            f"- {meta['date']}, {meta['device']} ({meta['cpu_threads']} CPU threads), {versions}: `{meta['command']}`"
        )
    lines += [
        "",
        "Each cell: median latency · samples (images or sequences) per second · throughput relative to eager "
        "in the same precision (fp32 eager for ONNX Runtime) · max-norm relative error against float64 eager · "
        "build, compile or session-creation time.",
    ]
    for model in sorted({r["model"] for r in rows}):
        model_rows = [r for r in rows if r["model"] == model]
        batches = sorted({r["batch"] for r in model_rows})
        sizes = sorted({r["size"] for r in model_rows})
        lines += ["", f"## {model} (size {', '.join(map(str, sizes))})", ""]
        lines.append("| system | precision | " + " | ".join(f"batch {b}" for b in batches) + " |")
        lines.append("|---|---|" + "---|" * len(batches))
        for system, precision in _ordered(model_rows):
            by_batch = {r["batch"]: r for r in model_rows if (r["system"], r["precision"]) == (system, precision)}
            cells = " | ".join(_cell(rows, by_batch.get(b)) for b in batches)
            lines.append(f"| {system} | {precision} | {cells} |")
        paired = paired_ratios(model_rows)
        if paired:
            lines += ["", "Paired by round (tensorforge's time over the peer's in each round of the interleaved "
                      "timing: median, and the range over the rounds):", ""]  # fmt: skip
            for ours, theirs, ratios in paired:
                lines.append(
                    f"- batch {ours['batch']}, tensorforge {ours['precision']} / {theirs['system']} "
                    f"{theirs['precision']}: {statistics.median(ratios):.3f}× ({min(ratios):.3f}-{max(ratios):.3f}, "
                    f"{len(ratios)} rounds)"
                )
    return "\n".join(lines) + "\n"


def plot(data: Mapping[str, Any], path: Path) -> None:
    """A panel per model and batch size: every system's throughput (samples/s), each bar labelled with its
    throughput relative to eager where the run has that eager row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["results"]
    models = sorted({r["model"] for r in rows})
    columns = max(len({r["batch"] for r in rows if r["model"] == model}) for model in models)
    figure, axes = plt.subplots(len(models), columns, figsize=(6 * columns, 3 * len(models)), squeeze=False)
    colors = {series: f"C{i % 10}" for i, series in enumerate(_ordered(rows))}  # a system's colour in every panel
    for line, model in zip(axes, models, strict=True):
        model_rows = [r for r in rows if r["model"] == model and r["status"] == "ok"]
        batches = sorted({r["batch"] for r in model_rows})
        for axis in line[len(batches) :]:
            axis.set_visible(False)
        for axis, batch in zip(line, batches, strict=False):
            shown = [r for r in model_rows if r["batch"] == batch]
            shown.sort(key=lambda r: (PRECISIONS.index(r["precision"]), SYSTEMS.index(r["system"])))
            names = [f"{r['system']} {r['precision']}" for r in shown]
            heights = [r["throughput"] for r in shown]
            bars = axis.bar(range(len(shown)), heights, color=[colors[(r["system"], r["precision"])] for r in shown])
            ratios = [relative_to_eager(rows, r) for r in shown]
            axis.bar_label(bars, ["" if x is None else f"{x:.2f}×" for x in ratios], fontsize=7, padding=1)
            axis.set_xticks(range(len(shown)), names, rotation=35, ha="right", fontsize=7)
            axis.set_ylabel("samples / s")
            axis.set_title(f"{model}, batch {batch}", fontsize=9)
            axis.margins(y=0.15)
    figure.suptitle("samples/s; labels: throughput relative to eager (as in results.md)", fontsize=9)
    figure.tight_layout(rect=(0, 0, 1, 0.985))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_reports(out: Path) -> None:
    """`results.md` and `results.png` (when something was measured) in `out`, from its `results.json`."""
    data = json.loads((out / RESULTS_JSON).read_text())
    (out / RESULTS_MD).write_text(markdown(data))
    if data["results"]:
        plot(data, out / RESULTS_PNG)


# -- command line ------------------------------------------------------------------------------------------


def parse_sizes(items: Sequence[str]) -> dict[str, int]:
    """`["yolo=320", "bert_base=64"]` → sizes by model; a bare number applies to every model."""
    sizes: dict[str, int] = {}
    for item in items:
        name, _, value = item.rpartition("=")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--size {item!r}: give MODEL=SIZE or SIZE, SIZE a positive integer")
        sizes[name or "*"] = int(value)
    return sizes


def _report(row: Mapping[str, Any]) -> None:
    summary = f"{row['ms']:.3f} ms" if row["status"] == "ok" else row["error"].splitlines()[0]
    if row.get("tuning"):
        summary += f", built in {row['build_s']:.1f} s {row['tuning']}, layers {row['tactics']}"
    if row.get("cuda_graph", "captured") != "captured":
        summary += f", CUDA graph {row['cuda_graph']}"
    print(f"{row['model']} batch {row['batch']} {row['system']} {row['precision']}: {summary}", flush=True)


def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu")
    unknown = sorted(set(args.models) - set(zoo.MODELS))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}: choose from {sorted(zoo.MODELS)}")
    sizes = parse_sizes(args.size or [])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / RESULTS_JSON
    old = json.loads(path.read_text()) if args.merge and path.exists() else None
    meta = invocation(device, argv)
    rows: list[dict[str, Any]] = []
    for name in args.models:
        size = sizes.get(name, sizes.get("*", BENCH_SIZES.get(name, zoo.MODELS[name].default_size)))
        for batch in args.batch or [1]:
            case = Case(
                name, batch, size, device, args.runs, args.warmup, args.effort, args.engines, args.precompile,
                tuple(args.families) if args.families else None, args.timing_caches,
            )  # fmt: skip
            pairs = []
            for precision in args.precision or ["fp32"]:
                for system in args.systems:
                    reason = not_applicable(system, precision, device)
                    if reason:
                        print(f"skip {name} batch {batch} {system} {precision}: {reason}", flush=True)
                    else:
                        pairs.append((system, precision))
            measured = (
                [measure_interleaved(case, pairs)] if args.interleave
                else ([measure_system(case, *pair)] for pair in pairs)
            )  # fmt: skip
            for group in measured:
                for row in group:
                    rows.append(row)
                    _report(row)
                    # Written after every row: a run cut short keeps what it measured.
                    path.write_text(json.dumps(merge_results(old, meta, rows), indent=2) + "\n")
                if any(row.get("cuda_context_lost") for row in group):
                    write_reports(args.out)
                    raise SystemExit(f"{name} batch {batch} broke the CUDA context")
            del case
    data = merge_results(old, meta, rows)
    path.write_text(json.dumps(data, indent=2) + "\n")
    write_reports(args.out)
    return data


def run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], prog="bench/suite.py")
    parser.add_argument("--models", nargs="+", default=["resnet50"], metavar="MODEL")
    parser.add_argument("--batch", type=int, action="append", help="repeatable (default 1)")
    parser.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--precision", action="append", choices=PRECISIONS, help="repeatable (default fp32)")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--effort", type=int, default=1, help="tensorforge build effort")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", action="append", metavar="[MODEL=]SIZE", help="image side / sequence length")
    parser.add_argument("--merge", action="store_true", help="add to DIR/results.json instead of overwriting it")
    parser.add_argument(
        "--interleave", action="store_true",
        help="time the systems and precisions of a model and batch in alternating rounds of a few calls (a shared "
        "machine's drift then reaches all alike)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench/results/suite"))
    parser.add_argument(
        "--no-precompile", dest="precompile", action="store_false",
        help="tensorforge builds tune without compiling every layer's candidates first (build-time comparisons)",
    )  # fmt: skip
    parser.add_argument(
        "--families", nargs="+", metavar="FAMILY",
        help="tensorforge builds try only these tactic families",
    )  # fmt: skip
    parser.add_argument(
        "--engines",
        type=Path,
        metavar="DIR",
        help="keep each engine as DIR/MODEL-bBATCH-PREC.engine and its build's timing cache as "
        "DIR/MODEL-bBATCH-PREC.timing.json",
    )
    parser.add_argument(
        "--timing-caches",
        type=Path,
        metavar="DIR",
        help="start each tensorforge build from DIR/MODEL-bBATCH-PREC.timing.json where it exists (an earlier "
        "--engines DIR): a rebuild on the same kind of device compiles and times only what the cache lacks; the "
        "table marks such builds' times",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        parser = argparse.ArgumentParser(prog="bench/suite.py report", description="results.md/png from JSON")
        parser.add_argument("out", type=Path)
        write_reports(parser.parse_args(argv[1:]).out)
        return
    args = run_parser().parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        raise SystemExit("--runs must be at least 1 and --warmup at least 0")
    data = run(args, argv)
    print(markdown(data))


if __name__ == "__main__":
    main()
