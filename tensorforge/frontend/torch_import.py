"""PyTorch module → ONNX → IR."""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import torch

from ..ir import Model
from .onnx_import import import_model

DEFAULT_OPSET = 17


def export_onnx(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    opset: int = DEFAULT_OPSET,
    keep_batchnorm: bool = False,
) -> onnx.ModelProto:
    """Export `module` in eval mode to an ONNX `ModelProto` with the TorchScript exporter.

    That exporter needs no extra package and reproduces what most deployed models were made with. It folds
    each BatchNormalization into the Conv before it; `keep_batchnorm=True` keeps them as separate nodes
    (inference-mode BN, as models from other frameworks have them).
    """
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    names = list(input_names) if input_names else [f"input{i}" if len(args) > 1 else "input" for i in range(len(args))]
    buffer = io.BytesIO()
    was_training = module.training
    module.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs: dict[str, Any] = {"dynamo": False} if "dynamo" in _export_params() else {}
            if keep_batchnorm:  # the exporter's Conv+BN folding runs only in TrainingMode.EVAL
                kwargs["training"] = torch.onnx.TrainingMode.PRESERVE
            torch.onnx.export(
                module,
                args,
                buffer,
                input_names=names,
                output_names=list(output_names) if output_names else None,
                dynamic_axes=dict(dynamic_axes) if dynamic_axes else None,
                opset_version=opset,
                do_constant_folding=True,
                **kwargs,
            )
    finally:
        module.train(was_training)
    return onnx.load_from_string(buffer.getvalue())


def from_torch(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    **export_options: Any,
) -> Model:
    """Import a PyTorch module by exporting it to ONNX first (see `export_onnx` for the options)."""
    return import_model(export_onnx(module, example_inputs, **export_options))


def _export_params() -> set[str]:
    import inspect

    return set(inspect.signature(torch.onnx.export).parameters)
