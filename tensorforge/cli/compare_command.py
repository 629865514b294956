"""`tensorforge compare`: an engine's outputs (and, with --layerwise, its intermediate values) against ONNX
Runtime on the same inputs; exit code 1 when an output exceeds its tolerance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..compare import Comparison, LayerRef, compare
from ..errors import TensorforgeError
from ..feeds import parse_assignments, parse_shape
from ..runtime.engine import Engine
from .common import app, fail, out


@app.command(name="compare")
def compare_command(
    model_path: Annotated[Path, typer.Argument(help="the ONNX model the engine was built from", show_default=False)],
    engine_path: Annotated[Path, typer.Argument(help="the engine file", show_default=False)],
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="NAME=file.npy (repeatable)", show_default=False)
    ] = None,
    shapes: Annotated[
        list[str] | None,
        typer.Option("--shape", "-s", help="NAME=1x3x224x224 for random inputs (default: the first profile's opt)"),
    ] = None,
    layerwise: Annotated[
        bool, typer.Option("--layerwise", help="also compare every intermediate value the ONNX model has")
    ] = False,
    rtol: Annotated[
        float | None,
        typer.Option(help="relative tolerance for every tensor (default: by precision, fp32 1e-4, fp16 5e-3...)"),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Compare an engine with ONNX Runtime (CPU): max abs error, relative error max|a-b|/max|b| and cosine
    similarity per tensor, and the first layer whose error exceeds the tolerance."""
    try:
        engine = Engine.load(engine_path)
        given = {name: parse_shape(text) for name, text in parse_assignments(shapes or [], "--shape").items()}
        files = parse_assignments(inputs or [], "--input")
        result = compare(model_path, engine, files=files, shapes=given, layerwise=layerwise, rtol=rtol, seed=seed)
    except TensorforgeError as error:
        fail(error)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print(result)
    if not result.ok:
        raise typer.Exit(1)


def _print(result: Comparison) -> None:
    shown = ", ".join(f"{name} {shape}" for name, shape in result.inputs.items())
    out.print(f"inputs: {shown} (profile {result.plan})")
    # Plain columns rather than a table: tensor names are long, and a table would squeeze them.
    out.print(f"{'layer':>5}  {'prec':<5} {'max abs':>9} {'rel':>9} {'cosine':>9} {'tol':>7}  {'':<7} tensor")
    for t in result.tensors:
        name = t.original + (" (output)" if t.is_output else "")
        if t.problem:
            out.print(f"{t.layer:>5}  {t.precision:<5} {t.problem}: {name}", style="red")
            continue
        status = "EXCEEDS" if t.exceeds else "ok"
        numbers = f"{t.max_abs:>9.3g} {t.rel:>9.3g} {t.cosine:>9.6f} {t.tolerance:>7.0e}"
        out.print(f"{t.layer:>5}  {t.precision:<5} {numbers}  {status:<7} {name}", style="red" if t.exceeds else None)
    if result.first_exceeding is None:
        out.print(f"all {len(result.tensors)} compared tensors are within tolerance", style="green")
    else:
        out.print(f"first layer to exceed the tolerance: {_layer(result.first_exceeding)}", style="bold red")
        for layer in result.unchecked_upstream:
            out.print(f"  it reads values without an ONNX counterpart from {_layer(layer)}", style="red")
    failed = [t.original for t in result.outputs if t.exceeds]
    if failed:
        out.print(f"{len(failed)} output(s) exceed the tolerance: {', '.join(failed)}", style="bold red")


def _layer(layer: LayerRef) -> str:
    fused = f", from {', '.join(layer.origins)}" if layer.origins and layer.origins != [layer.node] else ""
    return f"[{layer.position}] {layer.node} ({layer.op}{fused})"
