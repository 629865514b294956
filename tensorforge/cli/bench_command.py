"""`tensorforge bench`: throughput and latency of an engine (or of the reference executor), like trtexec."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from ..build.builder import build_engine
from ..build.config import BuildConfig, Profile
from ..errors import InputError, TensorforgeError
from ..feeds import build_feeds, parse_assignments, parse_shape
from ..frontend import load_onnx
from ..ir import Model
from ..onnxruntime_session import open_session, providers_for
from ..runtime.bench import (
    BenchOptions,
    BenchResult,
    bench_engine,
    bench_executor,
    bench_onnxruntime,
    engine_shapes,
    model_shapes,
)
from ..runtime.engine import Engine
from ..runtime.engine_file import is_engine_file
from .common import app, choose_device, err, fail, out

Shapes = dict[str, tuple[int, ...]]
InputsOption = Annotated[
    list[str] | None, typer.Option("--input", "-i", help="NAME=file.npy (repeatable)", show_default=False)
]
PeersOption = Annotated[
    list[str] | None,
    typer.Option(
        "--peer",
        help="also time ONNX Runtime on the same model and inputs, side by side: ort (on the device's provider "
        "where it has one, else the CPU's), ort:cpu, ort:cuda, ort:tensorrt or ort:PROVIDER (repeatable)",
        show_default=False,
    ),
]
ShapesOption = Annotated[
    list[str] | None,
    typer.Option("--shape", "-s", help="NAME=1x3x224x224 for the random inputs (repeatable)", show_default=False),
]


@app.command()
def bench(
    model_path: Annotated[Path, typer.Argument(help="an engine file or an ONNX model", show_default=False)],
    inputs: InputsOption = None,
    shapes: ShapesOption = None,
    batch: Annotated[
        int | None,
        typer.Option("--batch", "-b", min=1, help="set every input's leading dim (must fit the engine's profiles)"),
    ] = None,
    streams: Annotated[
        int, typer.Option(min=1, help="execution contexts, each on its own stream, run from as many threads")
    ] = 1,
    warmup: Annotated[float, typer.Option(help="seconds of untimed inferences first")] = 0.2,
    duration: Annotated[float, typer.Option(help="seconds of timed inferences")] = 3.0,
    cuda_graph: Annotated[
        bool | None,
        typer.Option("--cuda-graph/--no-cuda-graph", help="replay CUDA graphs (default: on with CUDA)"),
    ] = None,
    cpu_graph: Annotated[
        bool | None,
        typer.Option(
            "--cpu-graph/--no-cpu-graph", help="replay recorded kernel calls on the CPU (default: on with the CPU)"
        ),
    ] = None,
    executor: Annotated[
        bool, typer.Option("--executor", help="time the reference executor on an ONNX model instead of an engine")
    ] = False,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (an engine: where it was built)")] = "auto",
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    peers: PeersOption = None,
    onnx_path: Annotated[
        Path | None,
        typer.Option("--onnx", help="the ONNX model an engine was built from, for --peer", show_default=False),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Throughput (inferences/s, samples/s), latency percentiles, host-to-device, GPU compute and
    device-to-host times. An ONNX model is built into an engine with default settings first. With --peer,
    ONNX Runtime runs the same model on the same inputs after it, timed alike, and a table sets them side by side."""
    try:
        options = BenchOptions(warmup_s=warmup, duration_s=duration, streams=streams)
        peer_providers = [parse_peer(text) for text in peers or []]
        if is_engine_file(model_path):
            if executor:
                raise InputError("--executor times the reference executor on an ONNX model; this is an engine file")
            if peer_providers and onnx_path is None:
                raise InputError("--peer on an engine file needs the ONNX model it was built from: give it with --onnx")
            engine = Engine.load(model_path, device=None if device == "auto" else choose_device(device))
            feeds = feeds_for(engine.model, lambda given: engine_shapes(engine, given, batch), inputs, shapes, seed)
            result, built = bench_engine(engine, feeds, options, cuda_graphs=cuda_graph, cpu_graphs=cpu_graph), False
        else:
            if onnx_path is not None:
                raise InputError("--onnx names the model of an engine file; this is an ONNX model already")
            model = load_onnx(model_path)
            feeds = feeds_for(model, lambda given: model_shapes(model, given, batch), inputs, shapes, seed)
            if executor:
                if cuda_graph or cpu_graph:
                    flag = "--cuda-graph" if cuda_graph else "--cpu-graph"
                    raise InputError(f"{flag} is for engines: the reference executor runs eagerly")
                result, built = bench_executor(model, feeds, options, choose_device(device)), False
            else:
                engine = _build(model_path, model, feeds, choose_device(device))
                result, built = bench_engine(engine, feeds, options, cuda_graphs=cuda_graph, cpu_graphs=cpu_graph), True
            onnx_path = model_path
        peer_results = [bench_peer(provider, onnx_path, feeds, options, result.device) for provider in peer_providers]
    except TensorforgeError as error:
        fail(error)
    if as_json:
        report = {"model": str(model_path), "built": built, **result.to_dict()}
        if peer_results:
            report["peers"] = [peer.to_dict(result) for peer in peer_results]
        print(json.dumps(report, indent=2))
        return
    print_bench(model_path, result)
    if peer_results:
        print_side_by_side(result, peer_results)


@dataclass(frozen=True)
class PeerResult:
    """A peer's measurement beside the engine's: what it was asked as, the provider it ran on, why not another."""

    peer: str
    provider: str
    note: str | None
    result: BenchResult

    def to_dict(self, ours: BenchResult) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "provider": self.provider,
            "note": self.note,
            **self.result.to_dict(),
            "speedup": speedups(ours, self.result),
        }


def parse_peer(text: str) -> str | None:
    """The provider a `--peer` text asks ONNX Runtime for: None for ort, PROVIDER for ort:PROVIDER."""
    name, colon, provider = text.partition(":")
    if name.lower() not in ("ort", "onnxruntime"):
        raise InputError(f"unknown peer {text!r}: --peer takes ort or ort:PROVIDER (cpu, cuda, tensorrt, or a name)")
    if colon and not provider:
        raise InputError(f"--peer {text!r} names no provider after the colon")
    return provider or None


def bench_peer(
    provider: str | None, onnx_path: Path, feeds: Mapping[str, Any], options: BenchOptions, device: str
) -> PeerResult:
    """ONNX Runtime timed on `onnx_path` with the engine's inputs, on `provider` (None: the engine's device's)."""
    providers = providers_for(device, provider)
    if providers.note:
        err.print(f"note: {providers.note}", style="yellow")
    err.print(f"timing ONNX Runtime on {providers.first}")
    session = open_session(onnx_path, providers)
    result = bench_onnxruntime(session, feeds, options, providers.device)
    peer = "ort" if provider is None else f"ort:{provider}"
    return PeerResult(peer, providers.first, providers.note, result)


def speedups(ours: BenchResult, peer: BenchResult) -> dict[str, float]:
    """How many times the engine is faster than `peer`: in median latency and in throughput."""
    return {
        "median_latency": peer.latency_ms["median"] / ours.latency_ms["median"],
        "throughput": ours.samples_per_s / peer.samples_per_s,
    }


def feeds_for(
    model: Model,
    resolve: Callable[[Shapes], Shapes],
    inputs: list[str] | None,
    shapes: list[str] | None,
    seed: int,
) -> dict[str, Any]:
    """Feeds from `--input` files and random data at the shapes `resolve` makes of the given ones (`--shape`,
    and the files' own shapes); a file whose shape is not the resolved one (say, after `--batch`) is an error."""
    files = parse_assignments(inputs or [], "--input")
    given = {name: parse_shape(text) for name, text in parse_assignments(shapes or [], "--shape").items()}
    for name, path in files.items():
        shape = _peek_shape(path)
        if shape is not None:
            given.setdefault(name, shape)
    resolved = resolve(given)
    feeds = build_feeds(model, files, resolved, seed=seed)
    for name in files:
        actual, wanted = tuple(feeds[name].shape), resolved.get(name)
        if wanted is not None and actual != tuple(wanted):
            raise InputError(
                f"input file {files[name]!r} for {name!r} has shape {list(actual)}, but the run is for "
                f"{list(wanted)} (from --shape or --batch)"
            )
    return feeds


def _peek_shape(path: str) -> tuple[int, ...] | None:
    """The shape of the `.npy` array at `path` without reading it; None if it cannot be read (build_feeds
    then says why)."""
    try:
        return tuple(np.load(path, mmap_mode="r", allow_pickle=False).shape)
    except (OSError, ValueError):
        return None


def _build(path: Path, model: Model, feeds: Mapping[str, Any], device: str) -> Engine:
    shapes = {name: tuple(data.shape) for name, data in feeds.items()}
    profile = Profile()
    for name, shape in shapes.items():
        profile = profile.add(name, shape, shape, shape)
    given = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    err.print(
        f"{path} is an ONNX model: building an engine for {device} with default settings at {given} "
        "(use `tensorforge build` for other settings, or --executor to time the reference executor)"
    )
    return build_engine(model, BuildConfig(device=device, profiles=(profile,)))


def print_side_by_side(ours: BenchResult, peers: list[PeerResult]) -> None:
    """The engine and each peer in one table: median and p99 latency, throughput, and the engine's speedup."""
    table = Table(
        "system", "device", "median ms", "p99 ms", "samples/s", "tensorforge ×", box=None, title="side by side"
    )
    graphs = " (CUDA graphs)" if ours.graphs and ours.device.startswith("cuda") else ""
    rows = [(f"tensorforge {ours.runner}{graphs}", ours, None)] + [
        (f"ONNX Runtime {peer.provider.removesuffix('ExecutionProvider')}", peer.result, speedups(ours, peer.result))
        for peer in peers
    ]
    for label, result, speedup in rows:
        table.add_row(
            label,
            result.device,
            f"{result.latency_ms['median']:.4f}",
            f"{result.latency_ms['p99']:.4f}",
            f"{result.samples_per_s:.1f}",
            "-" if speedup is None else f"{speedup['throughput']:.2f}",
        )
    out.print(table)
    out.print("tensorforge ×: the engine's throughput over the peer's (above 1: the engine is faster)")


def print_bench(path: Path, result: BenchResult) -> None:
    """trtexec's summary: what ran, throughput, then the time statistics in milliseconds."""
    what = "reference executor" if result.runner == "executor" else "engine"
    if result.graphs:
        what += " (CUDA graphs)" if result.device.startswith("cuda") else " (CPU graphs)"
    shapes = ", ".join(f"{name} {list(shape)}" for name, shape in result.shapes.items())
    out.print(f"{path}: {what} on {result.device}, {result.streams} stream(s), batch {result.batch}: {shapes}")
    for note in result.notes:
        out.print(f"note: {note}", style="yellow")
    out.print(
        f"{result.iterations} inferences in {result.wall_s:.3f} s: {result.inferences_per_s:.1f} inferences/s, "
        f"{result.samples_per_s:.1f} samples/s",
        style="bold",
    )
    table = Table("ms", "min", "mean", "median", "p90", "p99", box=None)
    on_cuda = result.h2d_ms is not None
    rows = [  # on the CPU an inference is one call: latency, compute and enqueue are the same time
        ("latency" + (" (H2D + compute + D2H)" if on_cuda else ""), result.latency_ms),
        ("host-to-device", result.h2d_ms),
        ("GPU compute", result.compute_ms if on_cuda else None),
        ("device-to-host", result.d2h_ms),
        ("enqueue (host)", result.enqueue_ms),
    ]
    for label, stats in rows:
        if stats is not None:
            table.add_row(label, *(f"{stats[key]:.4f}" for key in ("min", "mean", "median", "p90", "p99")))
    out.print(table)
