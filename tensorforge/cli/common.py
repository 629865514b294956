"""What every `tensorforge` command shares: the typer app, the consoles, error exit, device choice."""

from __future__ import annotations

import re

import torch
import typer
from rich.console import Console

from ..errors import InputError

app = typer.Typer(
    name="tensorforge",
    help="Inference optimizer and runtime for ONNX models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Markup off: model, tensor and file names often contain brackets that rich would take for tags.
out = Console(markup=False, highlight=False, soft_wrap=True)
err = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def fail(error: Exception) -> None:
    err.print(f"error: {error}", style="red")
    raise typer.Exit(1)


def choose_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {name!r} was asked for but CUDA is not available here; use --device cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise InputError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto")
    return name
