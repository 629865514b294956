"""tensorforge: an inference optimizer and runtime for ONNX models, on NVIDIA GPUs and the CPU."""

from .errors import (
    GraphError,
    InputError,
    ModelLoadError,
    OpError,
    TensorforgeError,
    UnsupportedError,
)
from .frontend import from_torch, load_onnx
from .ops.executor import Executor

__version__ = "0.1.0"

__all__ = [
    "Executor",
    "GraphError",
    "InputError",
    "ModelLoadError",
    "OpError",
    "TensorforgeError",
    "UnsupportedError",
    "__version__",
    "from_torch",
    "load_onnx",
]
