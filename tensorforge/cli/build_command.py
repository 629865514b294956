"""`tensorforge build`: optimize and tune a model for this machine's device, write the engine file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..build.builder import Builder
from ..build.config import BuildConfig, Profile, QuantizationConfig, parse_profile, parse_target
from ..errors import InputError, TensorforgeError
from ..feeds import parse_assignments, parse_shape
from ..ir import qualified_op
from ..runtime.engine import Engine
from ..runtime.inspect import build_time_line, plan_selection_line, quantization_lines, sparsity_lines
from .common import app, choose_device, err, fail, out


@app.command()
def build(
    model_path: Annotated[Path, typer.Argument(help="an ONNX model file", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="the engine file to write", show_default=False)],
    fp16: Annotated[bool, typer.Option("--fp16", help="allow float16 layers")] = False,
    bf16: Annotated[bool, typer.Option("--bf16", help="allow bfloat16 layers")] = False,
    tf32: Annotated[bool, typer.Option("--tf32", help="allow TF32 math in float32 convolutions and products")] = False,
    int8: Annotated[
        bool, typer.Option("--int8", help="quantize convolutions to int8 (needs --calib or --calib-cache)")
    ] = False,
    fp8: Annotated[
        bool, typer.Option("--fp8", help="quantize convolutions to fp8 E4M3 (Hopper; needs calibration)")
    ] = False,
    calib: Annotated[
        Path | None,
        typer.Option(
            "--calib", help="calibration batches: a .npy / .npz file or a directory of them", show_default=False
        ),
    ] = None,
    calib_method: Annotated[
        str,
        typer.Option("--calib-method", help="minmax, entropy, percentile, mse, or auto (the one that agrees best)"),
    ] = "entropy",
    percentile: Annotated[
        float | None,
        typer.Option(help="the percentile of --calib-method percentile (default 99.99)", show_default=False),
    ] = None,
    calib_cache: Annotated[
        Path | None,
        typer.Option("--calib-cache", help="calibration cache: read if it exists, else written", show_default=False),
    ] = None,
    accuracy_target: Annotated[
        str | None,
        typer.Option(
            "--accuracy-target",
            help="keep the most sensitive layers float until e.g. cosine=0.999 or top1=0.99 holds on --calib",
            show_default=False,
        ),
    ] = None,
    keep_float: Annotated[
        list[str] | None,
        typer.Option("--keep-float", help="a layer (node name) to keep float (repeatable)", show_default=False),
    ] = None,
    chain: Annotated[
        str,
        typer.Option(
            "--chain",
            help="quantized layers pass int8 (fp8) activations to each other: auto (when the chained plan times "
            "faster), always or off",
        ),
    ] = "auto",
    depthwise_channels: Annotated[
        bool,
        typer.Option(
            "--depthwise-channels/--depthwise-per-tensor",
            help="quantize a depthwise convolution's input with one scale per channel (free for the kernels), or "
            "per tensor as other activations",
        ),
    ] = True,
    profiles: Annotated[
        list[str] | None,
        typer.Option(
            "--profile",
            "-p",
            help="NAME=MIN:OPT:MAX shapes of a dynamic input, e.g. x=1x3x224x224:8x3x224x224:32x3x224x224 "
            "(repeatable; a single shape fixes it)",
            show_default=False,
        ),
    ] = None,
    shapes: Annotated[
        list[str] | None,
        typer.Option("--shape", "-s", help="NAME=1x3x224x224: build for this one shape", show_default=False),
    ] = None,
    timing_cache: Annotated[
        Path | None, typer.Option("--timing-cache", help="read and update this timing cache file", show_default=False)
    ] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto")] = "auto",
    effort: Annotated[int, typer.Option(min=0, max=2, help="tuning effort: 0 quick, 1 default, 2 careful")] = 1,
    families: Annotated[
        str | None,
        typer.Option(help="comma-separated tactic families to allow (reference is always kept)"),
    ] = None,
    precompile: Annotated[
        bool, typer.Option(help="on CUDA, compile every layer's candidates in one pool before tuning")
    ] = True,
    sparsity: Annotated[
        str,
        typer.Option(
            help="2:4 sparse kernels: auto (where a weight has the pattern), off, or force (prune every eligible "
            "weight to it first: changes the answers, for measuring the speed)"
        ),
    ] = "auto",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="print every layer's candidate table")] = False,
    force: Annotated[bool, typer.Option(help="overwrite an existing engine file")] = False,
) -> None:
    """Build an engine: optimize the graph, time every layer's candidates on the device, plan memory."""
    try:
        if output.exists() and not force:
            raise InputError(f"{str(output)!r} already exists; pass --force to overwrite it")
        flags = (("tf32", tf32), ("fp16", fp16), ("bf16", bf16), ("int8", int8), ("fp8", fp8))
        precisions = ("fp32", *(p for p, on in flags if on))
        quantization = None
        if int8 or fp8:
            quantization = QuantizationConfig(
                data=str(calib) if calib else None,
                method=calib_method,
                percentile=percentile,
                cache=str(calib_cache) if calib_cache else None,
                target=parse_target(accuracy_target) if accuracy_target else None,
                keep_float=tuple(keep_float or ()),
                chain=chain,
                depthwise_channels=depthwise_channels,
            )
        elif calib or calib_cache or accuracy_target or keep_float:
            raise InputError("--calib, --calib-cache, --accuracy-target and --keep-float go with --int8 or --fp8")
        elif chain != "auto":  # a model quantized by its own Q/DQ
            quantization = QuantizationConfig(chain=chain)
        config = BuildConfig(
            device=choose_device(device),
            precisions=precisions,
            profiles=_profiles(profiles or [], shapes or []),
            effort=effort,
            timing_cache=str(timing_cache) if timing_cache else None,
            tactic_families=tuple(f.strip() for f in families.split(",")) if families else None,
            quantization=quantization,
            precompile=precompile,
            sparsity=sparsity,
        )
        columns = (TextColumn("tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, TextColumn("{task.fields[layer]}"), console=err, transient=True) as progress:
            task = progress.add_task("tuning", total=None, layer="")

            def on_layer(index, count, node, choice):
                progress.update(task, total=count, completed=index + 1, layer=node.name or node.op_type)
                if verbose:
                    progress.console.print(choice.table(node.label), markup=False, highlight=False)

            engine = Builder(config, on_layer=on_layer).build(model_path)
        engine.save(output, overwrite=force)
    except TensorforgeError as error:
        fail(error)
    print_build_report(engine)
    out.print(f"wrote {output} ({output.stat().st_size / 2**20:.2f} MiB)", style="bold")


def _profiles(profiles: list[str], shapes: list[str]) -> tuple[Profile, ...]:
    if profiles and shapes:
        raise InputError("give either --profile (ranges) or --shape (one shape per input), not both")
    if shapes:
        fixed = {name: parse_shape(text) for name, text in parse_assignments(shapes, "--shape").items()}
        profile = Profile()
        for name, shape in fixed.items():
            profile = profile.add(name, shape, shape, shape)
        return (profile,)
    return (parse_profile(profiles),) if profiles else ()


def print_build_report(engine: Engine) -> None:
    """The build log's summary: notes, fusion, per-layer winners, time, memory."""
    report = engine.report
    for note in report.get("notes", []):
        out.print(f"note: {note}", style="yellow")
    optimizer = report.get("optimizer", {})
    fired = ", ".join(f"{rule} {count}x" for rule, count in optimizer.get("fired", {}).items())
    before, after = optimizer.get("nodes_before"), optimizer.get("nodes_after")
    out.print(f"graph: {before} -> {after} nodes ({fired or 'no fusion'})")
    for line in quantization_lines(report):
        out.print(line)
    for line in sparsity_lines(report):
        out.print(line)
    nodes = engine.model.graph.nodes
    for index, plan in enumerate(engine.plans):
        ranges = ", ".join(
            f"{name} {list(r.min)}..{list(r.max)} (opt {list(r.opt)})" for name, r in plan.profile.ranges.items()
        )
        out.print(f"profile {index}: {ranges}", style="bold")
        table = Table("#", "layer", "op", "tactic", "precision", "layout", "ms", "vs next best", box=None)
        for layer in plan.layers:
            node = nodes[layer.node]
            times = sorted(c.median_ms for c in layer.candidates if math.isfinite(c.median_ms))
            margin = f"{times[1] / times[0]:.2f}x" if len(times) > 1 and times[0] > 0 else "only one"
            table.add_row(
                str(layer.node), node.name or "", qualified_op(node), layer.tactic, layer.precision, layer.layout,
                f"{layer.median_ms:.4f}", margin,
            )  # fmt: skip
        out.print(table)
        out.print(f"sum of layer times at opt: {plan.total_ms:.3f} ms")
        line = plan_selection_line(report, index)
        if line:
            out.print(line)
        out.print(plan.memory.report())
    out.print(build_time_line(report))
