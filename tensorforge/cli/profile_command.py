"""`tensorforge profile`: every layer's median time in an engine, sorted, with a trace and a chart on request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ..errors import InputError, TensorforgeError
from ..runtime.bench import engine_shapes
from ..runtime.engine import Engine
from ..runtime.engine_file import is_engine_file
from ..runtime.profiler import LayerProfile, profile_engine
from ..tactics.sparse import SPARSE_FAMILY
from .bench_command import InputsOption, ShapesOption, feeds_for
from .common import app, choose_device, fail, out


@app.command()
def profile(
    engine_path: Annotated[Path, typer.Argument(help="an engine file", show_default=False)],
    inputs: InputsOption = None,
    shapes: ShapesOption = None,
    runs: Annotated[int, typer.Option(min=1, help="timed runs (each layer's median is reported)")] = 20,
    warmup: Annotated[int, typer.Option(min=0, help="untimed runs first")] = 3,
    trace: Annotated[
        Path | None, typer.Option(help="write a Chrome trace (JSON, for Perfetto) of one run", show_default=False)
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="write a bar chart (PNG) of the slowest layers", show_default=False)
    ] = None,
    top: Annotated[int | None, typer.Option(min=1, help="show only the K slowest layers", show_default=False)] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (where it was built)")] = "auto",
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    force: Annotated[bool, typer.Option(help="overwrite existing trace and plot files")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Time each layer of an engine (on the CPU in a replay of its CPU graph; on CUDA eagerly, no CUDA graph, so
    the sum exceeds a graph replay, which `bench` measures) and print them slowest first with their share."""
    try:
        existing = [str(path) for path in (trace, plot) if path is not None and path.exists()]
        if existing and not force:
            raise InputError(f"{existing} already exist; pass --force to overwrite them")
        if engine_path.is_file() and not is_engine_file(engine_path):
            raise InputError(
                f"{str(engine_path)!r} is not an engine file: build one first with "
                f"`tensorforge build {engine_path} -o model.engine`, then profile that"
            )
        engine = Engine.load(engine_path, device=None if device == "auto" else choose_device(device))
        feeds = feeds_for(engine.model, lambda given: engine_shapes(engine, given), inputs, shapes, seed)
        result = profile_engine(engine, feeds, runs=runs, warmup=warmup)
        _write(trace, plot, result, top)
    except TensorforgeError as error:
        fail(error)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    print_profile(engine_path, result, top)
    for path in (trace, plot):
        if path is not None:
            out.print(f"wrote {path}")


def _write(trace: Path | None, plot: Path | None, result: LayerProfile, top: int | None) -> None:
    for path, write in ((trace, result.write_trace), (plot, lambda p: result.plot(p, top or 20))):
        if path is None:
            continue
        try:
            write(path)
        except OSError as error:
            raise InputError(f"cannot write {str(path)!r}: {error.strerror or error}") from None


def print_profile(path: Path, result: LayerProfile, top: int | None = None) -> None:
    """The layers slowest first, with share and cumulative share of the sum, then the totals."""
    shapes = ", ".join(f"{name} {list(shape)}" for name, shape in result.shapes.items())
    out.print(f"{path}: plan {result.plan} on {result.device}: {shapes}", style="bold")
    table = Table("#", "layer", "op", "tactic", "precision", "layout", "ms", "share", "cumulative", box=None)
    cumulative = 0.0
    shown = result.slowest(top)
    for layer in shown:
        cumulative += layer.share
        table.add_row(
            str(layer.node), layer.name, layer.op, layer.tactic, layer.precision, layer.layout,
            f"{layer.median_ms:.4f}", f"{layer.share:.1%}", f"{cumulative:.1%}",
        )  # fmt: skip
    _print_wide(table)
    hidden = len(result.layers) - len(shown)
    if hidden:
        out.print(f"... and {hidden} more layer(s), {1 - cumulative:.1%} of the total")
    out.print(
        f"sum of {len(result.layers)} layer medians {result.total_ms:.3f} ms; whole timed runs median "
        f"{result.run_ms:.3f} ms ({result.runs} runs after {result.warmup} warm-up)"
    )
    if result.mode == "cpu graph":
        out.print("per-layer timing replays the engine's CPU graph, as an execution context runs it")
    elif result.device.startswith("cuda"):
        out.print("per-layer timing runs eagerly, without a CUDA graph: `tensorforge bench` times the whole engine")
        if any(layer.tactic.split(".")[0] == SPARSE_FAMILY for layer in result.layers):
            out.print(
                "layers on sparse kernels (sparse.*) include cuSPARSELt's host-side setup, which a graph replay "
                "skips: up to hundreds of ms a call eagerly, far less in an engine's replay"
            )
    else:
        out.print(f"per-layer timing runs eagerly: the schedule could not be recorded as a CPU graph ({result.note})")


def _print_wide(table: Table) -> None:
    """`table` at its natural width: layer names cut to fit 80 columns (a pipe) would be useless, and a
    terminal wraps long lines."""
    width = Measurement.get(out, out.options.update(max_width=1000), table).maximum
    if width <= out.width:
        out.print(table)
        return
    Console(file=out.file, width=width, markup=False, highlight=False, soft_wrap=True).print(table)
