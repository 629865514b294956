"""A plan compiled to kernels: the engine's nodes in order, each a `LayerKernel` reading and writing value slots.

Values live in a list indexed by slot (graph inputs first), so a run does no name lookups; each step frees
the slots whose last reader it is. Graph outputs are returned in the dtypes and the (contiguous) memory
format the graph declares, whatever precision and layout their producers ran in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import OpError, TensorforgeError, UnsupportedError
from ..ir import DType, Model, Node, Value
from ..ops.math_flags import full_float32
from ..tactics.autotune import build_layer_kernel
from ..tactics.base import tactic_by_key
from ..tactics.variant import ConstantCache, LayerKernel
from .plan import Layer

Observer = Callable[[Value, Any], None]
Around = Callable[[Layer], AbstractContextManager[Any]]


@dataclass(slots=True)
class _Step:
    layer: Layer
    kernel: LayerKernel
    args: tuple[int, ...]  # slots of the non-constant inputs, in input order
    outputs: tuple[int, ...]  # slot per output (-1: an unused optional output)
    release: tuple[int, ...]


class Schedule:
    """The layers of one plan on `device`, with their kernels built; `constants` shares converted weights."""

    def __init__(
        self,
        model: Model,
        layers: Sequence[Layer],
        device: torch.device,
        constants: ConstantCache,
    ) -> None:
        graph = model.graph
        nodes = graph.nodes
        self.model = model
        self.device = device
        self._slot: dict[Value, int] = {}
        for value in graph.inputs:
            if value.name not in graph.initializers:
                self._slot_of(value)
        readers: dict[Value, int] = {}
        for layer in layers:
            for value in nodes[layer.node].inputs:
                if value is not None and not value.is_const:
                    readers[value] = layer.node
        kept = set(graph.outputs)
        self._steps = []
        for layer in layers:
            node = nodes[layer.node]
            kernel = _kernel(model, node, layer, device, constants)
            args = tuple(self._slot_of(v) for v in node.inputs if v is not None and not v.is_const)
            outputs = tuple(self._slot_of(v) if v.name else -1 for v in node.outputs)
            read = dict.fromkeys(v for v in node.inputs if v is not None and not v.is_const)
            unread = [v for v in node.outputs if v.name and v not in readers and v not in kept]
            release = tuple(self._slot[v] for v in read if readers.get(v) == layer.node and v not in kept)
            release += tuple(self._slot[v] for v in unread)
            self._steps.append(_Step(layer, kernel, args, outputs, release))
        self._inputs = [(v.name, self._slot[v]) for v in graph.inputs if v.name not in graph.initializers]
        self._outputs = [self._output_source(v, device) for v in graph.outputs]
        self.slots = len(self._slot)

    def _slot_of(self, value: Value) -> int:
        return self._slot.setdefault(value, len(self._slot))

    def _output_source(self, value: Value, device: torch.device) -> tuple[str, Any, DType]:
        if value.is_const:
            const = value.const
            return ("const", const.to(device) if isinstance(const, torch.Tensor) else const, value.dtype)
        return ("slot", self._slot_of(value), value.dtype)

    @property
    def layers(self) -> list[Layer]:
        return [step.layer for step in self._steps]

    def execute(
        self, inputs: Mapping[str, Any], observe: Observer | None = None, around: Around | None = None
    ) -> list[Any]:
        """Run every layer on `inputs` (tensors on the device, by input name); return the graph outputs.

        `observe(value, tensor)` sees every value a layer writes (layerwise comparison, shape recording);
        `around(layer)` is a context manager entered around each layer's kernel (per-layer timing).
        """
        env: list[Any] = [None] * self.slots
        for name, slot in self._inputs:
            env[slot] = inputs[name]
        nodes = self.model.graph.nodes if observe is not None else None
        with torch.inference_mode(), full_float32():
            for step in self._steps:
                try:
                    if around is None:
                        results = step.kernel([env[slot] for slot in step.args])
                    else:
                        with around(step.layer):
                            results = step.kernel([env[slot] for slot in step.args])
                except TensorforgeError:
                    raise
                except Exception as err:
                    node = step.kernel.node
                    raise OpError(
                        f"{node.label} failed in tactic {step.layer.tactic} {step.layer.config}: {err}"
                    ) from err
                for slot, result in zip(step.outputs, results, strict=False):
                    if slot >= 0:
                        env[slot] = result
                if nodes is not None:
                    for value, result in zip(nodes[step.layer.node].outputs, results, strict=False):
                        observe(value, result)
                for slot in step.release:
                    env[slot] = None
            return [
                _as_declared(env[source] if kind == "slot" else source, dtype) for kind, source, dtype in self._outputs
            ]


def _kernel(model: Model, node: Node, layer: Layer, device: torch.device, constants) -> LayerKernel:
    tactic = tactic_by_key(layer.tactic)
    if tactic is None:
        raise UnsupportedError(
            f"{node.label}: the engine uses tactic {layer.tactic!r}, which this tensorforge does not have; "
            "rebuild the engine with this version"
        )
    return build_layer_kernel(tactic, node, model.opset(node.domain), device, dict(layer.config), constants)


def _as_declared(result: Any, dtype: DType) -> Any:
    if not isinstance(result, torch.Tensor):
        return result
    if dtype.has_torch and result.dtype != dtype.torch and result.is_floating_point():
        result = result.to(dtype.torch)
    return result if result.is_contiguous() else result.contiguous()
