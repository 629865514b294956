"""Model importers: ONNX files and PyTorch modules (through `torch.onnx.export`)."""

from .onnx_import import import_model, load_onnx
from .torch_import import from_torch

__all__ = ["from_torch", "import_model", "load_onnx"]
