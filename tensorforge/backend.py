"""An `onnx.backend.base.Backend` over the reference executor, for the ONNX backend test suite."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .frontend import import_model
from .ir import DType
from .ops import Executor
from .tensors import to_numpy


class TensorforgeRep(BackendRep):
    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        graph = self.executor.model.graph
        names = [v.name for v in graph.inputs if v.name not in graph.initializers]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            items = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = dict(zip(names, items, strict=False))
        results = self.executor.run(feeds)
        return tuple(_to_numpy(results[value.name], value.dtype) for value in graph.outputs)


class TensorforgeBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return True

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TensorforgeRep:
        super().prepare(model, device, **kwargs)
        return TensorforgeRep(Executor(import_model(model), _torch_device(device)))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() in ("CPU", "CUDA")


def _to_numpy(result: Any, dtype: DType) -> Any:
    if isinstance(result, list):
        return [_to_numpy(item, DType.UNDEFINED) for item in result]
    if result is None:
        return None
    return to_numpy(result, dtype if dtype != DType.UNDEFINED else None)


def _torch_device(device: str) -> str:
    return "cuda" if device.upper().startswith("CUDA") else "cpu"


prepare = TensorforgeBackend.prepare
run_model = TensorforgeBackend.run_model
supports_device = TensorforgeBackend.supports_device

__all__: Sequence[str] = ["TensorforgeBackend", "TensorforgeRep", "prepare", "run_model"]
