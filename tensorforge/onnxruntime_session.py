"""ONNX Runtime beside the engine: the reference `compare` runs and the peer `bench --peer` times.

`providers_for(device, provider)` chooses the execution providers: a named one (`cpu`, `cuda`, `tensorrt`, or
ONNX Runtime's own name) must be in this build of ONNX Runtime; left unnamed, the device's own (CUDA on a CUDA
device, with its index) where this build has it, else the CPU's, with a note that says so. Every choice other
than the CPU's keeps the CPU provider last, for the nodes the first one does not take, as ONNX Runtime expects.
`open_session(model, providers)` opens an InferenceSession on a model file or an in-memory ModelProto, with
errors that say what to install or which file it could not read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import onnx
import torch

from .errors import ModelLoadError, UnsupportedError

CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
PROVIDER_NAMES = {"cpu": CPU, "cuda": CUDA, "tensorrt": TENSORRT}
_ON_A_GPU = (CUDA, TENSORRT)  # providers that take a device index


@dataclass(frozen=True)
class Providers:
    """What a session runs on: the provider list handed to ONNX Runtime, and why it is not what was asked."""

    chosen: tuple[tuple[str, dict[str, Any]], ...]
    note: str | None = None

    @property
    def first(self) -> str:
        return self.chosen[0][0]

    @property
    def device(self) -> str:
        """Where the first provider runs: cuda:N or cpu."""
        name, options = self.chosen[0]
        return f"cuda:{options['device_id']}" if name in _ON_A_GPU else "cpu"


def runtime() -> Any:
    """The onnxruntime module, or an error that says how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise UnsupportedError(
            "ONNX Runtime is not installed: pip install onnxruntime (onnxruntime-gpu for its CUDA provider)"
        ) from None
    return onnxruntime


def providers_for(device: str | torch.device, provider: str | None = None) -> Providers:
    """The providers for a session beside an engine on `device` (see the module docstring)."""
    ort = runtime()
    available = ort.get_available_providers()
    device = torch.device(device)
    index = device.index if device.index is not None else 0
    if provider is None:
        wanted = CUDA if device.type == "cuda" else CPU
        if wanted not in available:
            note = (
                f"ONNX Runtime {ort.__version__} here has no {wanted} (it has {', '.join(available)}): it runs on "
                "the CPU (pip install onnxruntime-gpu for its CUDA provider)"
            )
            return Providers(((CPU, {}),), note)
    else:
        wanted = PROVIDER_NAMES.get(provider.lower(), provider)
        if wanted not in available:
            raise UnsupportedError(
                f"ONNX Runtime {ort.__version__} here has no {wanted} (it has {', '.join(available)}); choose one of "
                f"those, or {', '.join(PROVIDER_NAMES)}"
            )
    if wanted == CPU:
        return Providers(((CPU, {}),))
    return Providers(((wanted, {"device_id": index}), (CPU, {})))


def open_session(model: str | os.PathLike[str] | onnx.ModelProto, providers: Providers) -> Any:
    """An ONNX Runtime InferenceSession on `model` (a file, or a ModelProto handed over in memory)."""
    ort = runtime()
    if isinstance(model, onnx.ModelProto):
        try:
            source: Any = model.SerializeToString()
        except ValueError as err:  # protobuf's 2 GiB limit
            raise UnsupportedError(f"the model cannot be handed to ONNX Runtime in memory ({err})") from None
        what = "the model"
    else:
        source = os.fspath(model)
        if not os.path.isfile(source):
            raise ModelLoadError(f"ONNX model {source!r} does not exist")
        what = repr(source)
    names = [name for name, _ in providers.chosen]
    options = [options for _, options in providers.chosen]
    try:
        return ort.InferenceSession(source, providers=names, provider_options=options)
    except Exception as err:  # ORT raises its own exception types
        raise ModelLoadError(f"ONNX Runtime could not load {what} on {names[0]} ({err})") from None
