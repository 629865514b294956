"""`tensorforge inspect` and `tensorforge run`."""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer
from rich.table import Table

from ..errors import InputError, TensorforgeError
from ..feeds import build_feeds, parse_assignments, parse_shape
from ..frontend import load_onnx
from ..ops import Executor
from ..runtime.engine import Engine
from ..runtime.engine_file import is_engine_file
from ..summary import summarize_model
from ..tensors import to_numpy
from . import bench_command, build_command, profile_command, serve_command  # noqa: F401 - register the commands
from .common import app, choose_device, fail, out
from .compare_command import compare_command  # noqa: F401 - registers `tensorforge compare`
from .inspect_engine import inspect_engine

ModelOrEngineArg = Annotated[Path, typer.Argument(help="an engine file or an ONNX model", show_default=False)]


@app.command()
def inspect(
    model_path: ModelOrEngineArg,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    optimize: Annotated[
        bool, typer.Option("--optimize", help="run the graph optimizer and say what it fused, where, and why not")
    ] = False,
    candidates: Annotated[
        str | None,
        typer.Option("--candidates", help="an engine: every candidate timed for the layers whose name contains this"),
    ] = None,
) -> None:
    """An ONNX model: inputs and outputs, op histogram, parameters, opsets, and what is unsupported. An engine:
    every layer with the original nodes it fused, its tactic, precision, layout, outputs, time and runner-up,
    and the build report (the engine need not be built for this machine)."""
    try:
        if is_engine_file(model_path):
            if optimize:
                raise InputError("--optimize is for ONNX models: an engine's graph is already optimized")
            inspect_engine(model_path, as_json, candidates)
            return
        if candidates is not None:
            raise InputError("--candidates is for engines: an ONNX model has no timed candidates")
        model = load_onnx(model_path)
        summary = summarize_model(model)
        report = _optimize(model)[1] if optimize else None
    except TensorforgeError as error:
        fail(error)
    if as_json:
        if report is not None:
            summary["optimization"] = report.to_dict()
        print(json.dumps(summary, indent=2))
        return
    out.print(f"{model_path}  graph {summary['graph']!r}, producer {summary['producer'] or '?'}", style="bold")
    opsets = ", ".join(f"{d} {v}" for d, v in summary["opsets"].items())
    out.print(f"IR version {summary['ir_version']}, opsets: {opsets}")
    params = summary["parameters"]
    out.print(f"{summary['nodes']} nodes, {params:,} parameters ({summary['parameter_bytes'] / 2**20:.2f} MiB)")
    io_table = Table("", "name", "type", box=None)
    for kind in ("inputs", "outputs"):
        for item in summary[kind]:
            io_table.add_row(kind[:-1], item["name"], f"{item['dtype']}{item['text']}")
    out.print(io_table)
    ops_table = Table("op", "count", box=None)
    for op, count in summary["ops"].items():
        ops_table.add_row(op, str(count))
    out.print(ops_table)
    for key, value in summary["metadata"].items():
        out.print(f"metadata {key}: {value!r}")
    if summary["unsupported"]:
        count = sum(len(item["nodes"]) for item in summary["unsupported"])
        out.print(f"{count} unsupported node(s):", style="bold red")
        for item in summary["unsupported"]:
            nodes = item["nodes"]
            names = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
            op = f"{item['domain']}::{item['op_type']} (opset {item['opset']})"
            out.print(f"  {op} {item['reason']}: {len(nodes)} node(s): {names}")
    else:
        out.print("every op is supported", style="green")
    if report is not None:
        _print_optimization(report)


def _optimize(model):
    """The optimized model (a pass that failed was rolled back, so use this one) and the report."""
    from ..passes.pipeline import optimize

    return optimize(model)


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _print_optimization(report) -> None:
    """Per pass: nodes removed, each rule that fired with its count and where; then declines and op counts."""
    out.print(f"optimization: {report.nodes_before} -> {report.nodes_after} nodes", style="bold")
    passes: dict[str, list] = {}
    for run in report.runs:
        passes.setdefault(run.name, []).append(run)
    for name, runs in passes.items():
        change = sum(run.nodes_after - run.nodes_before for run in runs)
        events = [e for e in report.events if e.pass_name == name]
        fired: dict[str, list[str]] = {}
        for event in events:
            if event.status == "fired":
                fired.setdefault(event.rule, []).append(event.node)
        failures = [e.detail for e in events if e.status == "failed"]
        if not fired and not failures:
            continue
        out.print(f"  {name}: {change:+d} nodes")
        for rule, nodes in fired.items():
            out.print(f"    {rule}: {len(nodes)}x at {_names(nodes)}")
        for detail in failures:
            out.print(f"    FAILED and rolled back: {detail}", style="red")
    declined: dict[tuple[str, str], dict[str, None]] = {}  # a node declined again in a later iteration counts once
    for event in report.declined():
        declined.setdefault((event.rule, event.detail), {})[event.node] = None
    if declined:
        out.print("  declined:")
        for (rule, reason), nodes in sorted(declined.items(), key=lambda item: -len(item[1])):
            out.print(f"    {rule}: {reason} ({len(nodes)}x at {_names(list(nodes), 3)})")
    table = Table("op", "before", "after", box=None)
    for op in dict.fromkeys([*report.ops_before, *report.ops_after]):
        table.add_row(op, str(report.ops_before.get(op, 0)), str(report.ops_after.get(op, 0)))
    out.print(table)


@app.command()
def run(
    model_path: ModelOrEngineArg,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="NAME=file.npy (repeatable)", show_default=False)
    ] = None,
    shapes: Annotated[
        list[str] | None,
        typer.Option("--shape", "-s", help="NAME=1x3x224x224 for random inputs with dynamic dims", show_default=False),
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="write each output as DIR/<name>.npy")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto")] = "auto",
    runs: Annotated[int, typer.Option(min=1, help="timed runs (the median is reported)")] = 1,
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    force: Annotated[bool, typer.Option(help="overwrite existing output files")] = False,
    optimized: Annotated[
        bool, typer.Option("--optimize", help="run the graph after the default optimization passes")
    ] = False,
) -> None:
    """Run an engine file or an ONNX model on given or random inputs; print output shapes and timing."""
    try:
        engine = _load_engine(model_path, None if device == "auto" else choose_device(device))
        device = choose_device(device)
        model = engine.model if engine is not None else load_onnx(model_path)
        given = {k: parse_shape(v) for k, v in parse_assignments(shapes or [], "--shape").items()}
        if engine is not None:
            given = {**{n: r.opt for n, r in engine.plans[0].profile.ranges.items()}, **given}
        feeds = build_feeds(model, parse_assignments(inputs or [], "--input"), given, seed=seed)
        if optimized and engine is None:
            model, report = _optimize(model)
            out.print(f"optimized: {report.nodes_before} -> {report.nodes_after} nodes")
        runner = engine.create_context() if engine is not None else Executor(model, device)
        paths = _output_paths(model, output_dir, force)
        times, results = [], {}
        for _ in range(runs):
            start = time.perf_counter()
            results = runner.run(feeds)
            if runner.device.type == "cuda":
                torch.cuda.synchronize(runner.device)
            times.append(time.perf_counter() - start)
    except TensorforgeError as error:
        fail(error)
    table = Table("output", "type", "shape", "mean", "min", "max", box=None)
    by_name = {v.name: v for v in model.graph.outputs}
    for name, result in results.items():
        array = to_numpy(result, by_name[name].dtype) if not isinstance(result, list) else None
        if array is None:
            table.add_row(name, "sequence", f"[{len(result)}]", "", "", "")
            continue
        stats = ("", "", "")
        if array.size and array.dtype.kind in "fiub":
            as_float = array.astype(np.float64)
            stats = (f"{as_float.mean():.6g}", f"{as_float.min():.6g}", f"{as_float.max():.6g}")
        table.add_row(name, str(by_name[name].dtype), str(list(array.shape)), *stats)
        if paths:
            np.save(paths[name], array, allow_pickle=False)
    out.print(table)
    median = statistics.median(times) * 1e3
    what = (
        "engine" + (f" ({runner.device.type.upper()} graphs)" if getattr(runner, "graphs", False) else "")
        if engine
        else "reference executor"
    )
    out.print(f"{runner.device} {what}: median {median:.3f} ms over {runs} run(s)")
    if paths:
        out.print(f"wrote {len(paths)} output(s) to {output_dir}")


def _load_engine(path: Path, device: str | None) -> Engine | None:
    """The engine in `path` if it is an engine file (by its magic bytes), else None (an ONNX model); with no
    `device`, on the device it was built for."""
    return Engine.load(path, device=device) if is_engine_file(path) else None


def _output_paths(model, output_dir: Path | None, force: bool) -> dict[str, Path]:
    """`DIR/<output name>.npy` for each output (unsafe characters in names become `_`)."""
    if output_dir is None:
        return {}
    paths = {v.name: output_dir / (re.sub(r"[^\w.\-]", "_", v.name) + ".npy") for v in model.graph.outputs}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not force:
        raise InputError(f"output files already exist: {existing}; pass --force to overwrite them")
    output_dir.mkdir(parents=True, exist_ok=True)
    return paths


if __name__ == "__main__":
    app()
