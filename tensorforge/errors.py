"""The errors tensorforge raises: each names the file, node, op or tensor at fault and what to do."""

from __future__ import annotations


class TensorforgeError(Exception):
    """Base class of every error tensorforge raises on purpose."""


class ModelLoadError(TensorforgeError):
    """The file is missing, is not ONNX, or is truncated or corrupt."""


class GraphError(TensorforgeError):
    """The graph is malformed: a cycle, a dangling input, a value defined twice, a type clash."""


class UnsupportedError(TensorforgeError):
    """The model uses ops, opsets, attributes or types that tensorforge does not implement."""


class InputError(TensorforgeError):
    """Inputs given at run time do not match the graph: missing, extra, misnamed, wrong shape or dtype."""


class OpError(TensorforgeError):
    """An op failed while running; the message names the node."""


class TuningError(TensorforgeError):
    """No candidate kernel of a layer ran correctly; the message names the layer and what each candidate did."""


class DeviceError(TensorforgeError):
    """The GPU failed in a way this process cannot recover from (a sticky CUDA error); the message says what ran."""
