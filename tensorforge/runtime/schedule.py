"""A plan compiled to kernels: the engine's nodes in order, each a `LayerKernel` reading and writing value slots.

Values live in a list indexed by slot (graph inputs first), so a run does no name lookups; each step frees
the slots whose last reader it is. Graph outputs are returned in the dtypes and the (contiguous) memory
format the graph declares, whatever precision and layout their producers ran in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from ..build.memory import MemoryPlan
from ..errors import OpError, TensorforgeError, UnsupportedError
from ..ir import DType, Model, Node, Value
from ..kernels.triton.copy import relayout, tiled
from ..ops.math_flags import full_float32
from ..ops.registry import HOST_INPUTS
from ..passes.fold import RANDOM_OPS
from ..tactics.autotune import build_layer_kernel
from ..tactics.base import tactic_by_key
from ..tactics.variant import ConstantCache, LayerKernel
from . import cpu_graph
from .plan import Layer

Observer = Callable[[Value, Any], None]
SHAPE_OPS = frozenset({"Shape", "Size"})  # ops whose result is their input's shape, whatever its values


def _from_shapes(value: Value, known: dict[int, bool]) -> bool:
    """Whether `value` is computed from constants and the shapes of tensors alone (never their values, never a random
    draw); `known` memoizes by value."""
    if value.is_const:
        return True
    if id(value) not in known:
        producer = value.producer()
        known[id(value)] = producer is not None and (
            producer.op_type in SHAPE_OPS
            or (
                producer.op_type not in RANDOM_OPS
                and any(v is not None for v in producer.inputs)
                and all(v is None or _from_shapes(v, known) for v in producer.inputs)
            )
        )
    return known[id(value)]


Around = Callable[[Layer], AbstractContextManager[Any]]


@dataclass(slots=True)
class _Step:
    layer: Layer
    kernel: LayerKernel
    args: tuple[int, ...]  # slots of the non-constant inputs, in input order
    outputs: tuple[int, ...]  # slot per output (-1: an unused optional output)
    release: tuple[int, ...]
    arena: tuple[tuple[int, int] | None, ...] | None  # (offset, bytes) per output placed in the arena


class Schedule:
    """The layers of one plan on `device`, with their kernels built; `constants` shares converted weights."""

    def __init__(
        self,
        model: Model,
        layers: Sequence[Layer],
        device: torch.device,
        constants: ConstantCache,
        memory: MemoryPlan | None = None,
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
        channels = {v.name: v.shape[1] for n in nodes for v in n.outputs if v.shape and len(v.shape) == 4}
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
            arena = _arena_slots(node, kernel, memory, channels)
            self._steps.append(_Step(layer, kernel, args, outputs, release, arena))
        self._inputs = [(v.name, self._slot[v]) for v in graph.inputs if v.name not in graph.initializers]
        self._outputs = [self._output_source(v, device) for v in graph.outputs]
        self.slots = len(self._slot)
        self.arena_bytes = memory.arena_bytes if memory is not None and self.binds_arena else 0

    @property
    def binds_arena(self) -> bool:
        """Whether some layer writes its outputs into the arena of the memory plan."""
        return any(step.arena is not None for step in self._steps)

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

    def record(
        self,
        inputs: Mapping[str, Any],
        arena: torch.Tensor | None = None,
        around: Around | None = None,
        tag: Callable[[], Any] | None = None,
        memory: cpu_graph.KeptMemory | None = None,
    ) -> tuple[cpu_graph.CpuGraph, Any]:
        """A run on `inputs` (the tensors a replay reads) recorded as a CPU graph (`cpu_graph.capture`, its `tag`
        and `memory`): the graph and its outputs. Raises `NotReplayable` where the run cannot be recorded."""
        problem = self.replay_problem
        if problem:
            raise cpu_graph.NotReplayable(problem)
        return cpu_graph.capture(
            lambda: self.execute(inputs, around=around, arena=arena),
            list(inputs.values()),
            () if arena is None else (arena,),
            tag=tag,
            memory=memory,
        )

    @property
    def replay_problem(self) -> str | None:
        """Why a run of this schedule cannot be recorded as a CPU graph whatever its kernels do, or None: a layer
        that reads a computed tensor's values as numbers (a count), which a replay would not read again. Numbers
        computed from the inputs' shapes alone (a dynamic-shape model's Reshape targets: Shape → Gather → Concat)
        are the same on every run of these shapes: the recording folds them into constants (`cpu_graph`)."""
        shaped: dict[int, bool] = {}
        for step in self._steps:
            node = step.kernel.node
            host = HOST_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
            for index in host:
                value = node.inputs[index] if index < len(node.inputs) else None
                if value is not None and not _from_shapes(value, shaped):
                    return f"{node.label} reads the values of {value.name!r}, computed at run time, as numbers"
        return None

    def execute(
        self,
        inputs: Mapping[str, Any],
        observe: Observer | None = None,
        around: Around | None = None,
        arena: torch.Tensor | None = None,
    ) -> list[Any]:
        """Run every layer on `inputs` (tensors on the device, by input name); return the graph outputs.

        `observe(value, tensor)` sees every value a layer writes (layerwise comparison, shape recording);
        `around(layer)` is a context manager entered around each layer's kernel (per-layer timing). With
        `arena` (uint8, at least `arena_bytes`; one per execution context) the layers that can write into
        given buffers put their outputs at the memory plan's offsets; an observer sees fresh tensors instead,
        as it may keep them past the arena slot's lifetime.
        """
        if arena is not None and arena.numel() < self.arena_bytes:
            raise ValueError(f"the arena has {arena.numel()} bytes, the memory plan needs {self.arena_bytes}")
        if observe is not None:
            arena = None
        env: list[Any] = [None] * self.slots
        for name, slot in self._inputs:
            env[slot] = inputs[name]
        nodes = self.model.graph.nodes if observe is not None else None
        with torch.inference_mode(), full_float32():
            for step in self._steps:
                alloc = _ArenaAlloc(arena, step.arena, self.device) if arena is not None and step.arena else None
                try:
                    if around is None:
                        results = step.kernel([env[slot] for slot in step.args], alloc)
                    else:
                        with around(step.layer):
                            results = step.kernel([env[slot] for slot in step.args], alloc)
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


def _arena_slots(node: Node, kernel: LayerKernel, memory: MemoryPlan | None, channels: Mapping[str, Any]):
    """An `_ArenaSlot` per output of `node` that the plan placed in the arena, if its kernel can write there.
    Tensors in an in-place chain are left out: only elementwise kernels may share an input's storage. A tensor
    planned inside its concatenation gets that concatenation's storage and its channel range."""
    if memory is None or not kernel.writes_into:
        return None
    chained = set(memory.inplace) | set(memory.inplace.values())
    slots = []
    for v in node.outputs:
        if v.name not in memory.offsets or v.name in chained:
            slots.append(None)
        elif v.name in memory.views:
            host, first = memory.views[v.name]
            slots.append(_ArenaSlot(memory.offsets[host], memory.sizes[host], channels.get(host), first))
        else:
            slots.append(_ArenaSlot(memory.offsets[v.name], memory.sizes[v.name]))
    return tuple(slots) if any(slots) else None


@dataclass(frozen=True, slots=True)
class _ArenaSlot:
    """Where an output goes: `bytes` at `offset`; inside a concatenation of `channels` (channels_last), from
    channel `first`."""

    offset: int
    bytes: int
    channels: int | None = None
    first: int = 0


class _ArenaAlloc:
    """A `writes_into` kernel's output buffers: views of the arena at the planned offsets (a new tensor for an
    output the plan did not place, or one larger than planned, or asked in another layout than its
    concatenation's)."""

    __slots__ = ("arena", "device", "slots")

    def __init__(self, arena: torch.Tensor, slots, device: torch.device) -> None:
        self.arena, self.slots, self.device = arena, slots, device

    def __call__(self, index, shape, dtype, memory_format) -> torch.Tensor:
        slot = self.slots[index] if index < len(self.slots) else None
        size = dtype.itemsize
        channels_last = memory_format == torch.channels_last and len(shape) == 4
        if slot is not None and slot.channels is not None:
            if not channels_last or not isinstance(slot.channels, int):
                slot = None
            else:
                n, c, h, w = shape
                total = slot.channels
                if n * h * w * total * size <= slot.bytes and slot.first + c <= total:
                    whole = self.arena[slot.offset : slot.offset + n * h * w * total * size].view(dtype)
                    return whole.as_strided(
                        tuple(shape), (h * w * total, 1, w * total, total), whole.storage_offset() + slot.first
                    )
                slot = None
        nbytes = math.prod(shape) * size
        if slot is None or nbytes > slot.bytes:
            return torch.empty(tuple(shape), dtype=dtype, device=self.device, memory_format=memory_format)
        flat = self.arena[slot.offset : slot.offset + nbytes].view(dtype)
        if channels_last:
            _, c, h, w = shape
            return flat.as_strided(tuple(shape), (h * w * c, 1, w * c, c))
        return flat.view(tuple(shape))


def _kernel(model: Model, node: Node, layer: Layer, device: torch.device, constants) -> LayerKernel:
    tactic = tactic_by_key(layer.tactic)
    if tactic is None:
        raise UnsupportedError(
            f"{node.label}: the engine uses tactic {layer.tactic!r}, which this tensorforge does not have; "
            "rebuild the engine with this version"
        )
    return build_layer_kernel(tactic, node, model.opset(node.domain), device, dict(layer.config), constants)


def _as_declared(result: Any, dtype: DType) -> Any:
    """A graph output in its declared float type and contiguous, converted in one copy (on CUDA the tiled one:
    an fp16 channels_last output becomes a float32 NCHW one in one pass)."""
    if not isinstance(result, torch.Tensor):
        return result
    target = dtype.torch if dtype.has_torch and result.is_floating_point() else result.dtype
    if target == result.dtype and result.is_contiguous():
        return result
    if tiled(result, target):
        return relayout(result, target, torch.contiguous_format)
    return torch.empty(result.shape, dtype=target, device=result.device).copy_(result)
