"""Tactics: interchangeable implementations of one layer, and the registry that lists them per op.

A tactic is a kernel family × a configuration. `supports` says why it cannot run a node (or None), `space`
lists its configurations for an effort level, `precisions` and `layouts` the variants it runs in (see
`variant.py`; the autotuner crosses them with `space`), and `build` returns a `Kernel`: a callable from the
layer's input tensors (constants first converted to the variant) to its output tensors. The autotuner
times every supported candidate; one that fails to build or run scores inf and never aborts the build.

A tactic with `writes_into` builds kernels that also take `alloc=`, an `Alloc`: they ask it for each output
buffer (`alloc(output index, shape, dtype, memory format)`) and write there, so an execution context can place
their outputs in its planned arena; without `alloc` they allocate as usual (`allocate`).

`build` gets the configuration without the variant (the kernel sees its inputs already converted), except for
a tactic with `sees_precision`, whose config keeps "precision": one that makes float operands of its own (the
float fallback dequantizing a quantized activation, an int8 kernel writing a float output of an int8 input) needs
the variant's float type.

A tactic with `converts_on_load` builds kernels that read their activation inputs in whatever float type and
memory format they come, converting as they load (a stem convolution reading the float32 NCHW network input for
an fp16 NHWC layer): the variant converts only the constants, and the kernels write the variant's type. A tactic
with `strided_inputs` reads 4-D inputs through their strides: an NHWC variant passes it a channel slice of a
channels_last tensor (a tensor written inside its concatenation, `build.concat_views`) as it is, not copied;
one with `strided_outputs` writes through the strides of the buffers `alloc` gives, so the memory plan may place
its outputs inside a concatenation. One with `arena_for_concatenations` too has only those outputs placed in the
arena; it allocates the others (our CPU kernels: on the CPU a fresh buffer is one just freed and still in cache,
and MobileNetV3 ran 2-5% slower with every output of theirs in the arena).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch

from ..ir import Node, qualified_op
from ..ops.fused import DOMAIN

Kernel = Callable[..., tuple[torch.Tensor, ...]]  # (inputs[, alloc=]) -> outputs
Alloc = Callable[[int, Sequence[int], torch.dtype, torch.memory_format], torch.Tensor]


def allocate(
    alloc: Alloc | None,
    index: int,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> torch.Tensor:
    """Output `index`'s buffer: from `alloc` when the caller gave one, else a new tensor."""
    if alloc is not None:
        return alloc(index, shape, dtype, memory_format)
    return torch.empty(tuple(shape), dtype=dtype, device=device, memory_format=memory_format)


def statistics_reason(node: Node, quantizes: bool = False) -> str | None:
    """Why a LayerNormalization kernel that writes Y alone, from float32 statistics (and, when it `quantizes`,
    Q(Y) for a `y_scale`, with Y beside it for the domain norm's second output), cannot run `node`, or None."""
    if node.attributes.get("y_scale", 0.0) and not quantizes:
        return "a quantized output (y_scale) only on triton.layernorm, cpu.layernorm and the reference"
    extra = [v for v in node.outputs[1:] if v.name]
    if extra and node.domain == DOMAIN and not (quantizes and node.attributes.get("y_scale", 0.0)):
        return "Y beside Q(Y) (a second output) only on triton.layernorm, cpu.layernorm and the reference"
    if extra and node.domain != DOMAIN:
        return "the Mean and InvStdDev outputs are computed only by the reference"
    if node.attributes.get("stash_type", 1) != 1:
        return "statistics in float32 only (stash_type=1)"
    return None


class PerWeight:
    """A tensor derived once from each weight a kernel is called with (packed, reordered, cast), kept beside that
    weight so its id is not reused while the entry lives. `derive(weight, *key)`: `key` (e.g. the dtype asked
    for) is part of the entry's identity."""

    __slots__ = ("_derive", "_entries")

    def __init__(self, derive: Callable[..., torch.Tensor]) -> None:
        self._derive = derive
        self._entries: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, weight: torch.Tensor, *key: Any) -> torch.Tensor:
        entry = self._entries.get((id(weight), *key))
        if entry is None:
            entry = self._entries[(id(weight), *key)] = (weight, self._derive(weight, *key))
        return entry[1]


class Tactic:
    family: ClassVar[str] = ""
    name: ClassVar[str] = ""
    op_types: ClassVar[tuple[str, ...]] = ()  # qualified op types; empty: any op
    precisions: ClassVar[tuple[str, ...]] = ("fp32", "tf32", "fp16", "bf16")
    layouts: ClassVar[tuple[str, ...]] = ("any",)  # "any": 4-D tensors in the memory format they come in
    writes_into: ClassVar[bool] = False  # its kernels take `alloc=` (see the module docstring)
    sees_precision: ClassVar[bool] = False  # `build`'s config keeps the variant's "precision"
    # float constants alone make the variant matter (the float fallback computes in its type even between quantized
    # activations); else a layer that reads and writes no float activation is timed in fp32 only
    precision_from_constants: ClassVar[bool] = False
    converts_on_load: ClassVar[bool] = False  # activations reach its kernels unconverted (module docstring)
    # a float layer's residual may reach its kernels quantized, added as Z · z_scale (a float fallback's twin)
    adds_quantized_residual: ClassVar[bool] = False
    strided_inputs: ClassVar[bool] = False  # channel slices of channels_last tensors reach it uncopied
    strided_outputs: ClassVar[bool] = False  # its kernels write through the strides of the buffers given
    arena_for_concatenations: ClassVar[bool] = False  # the plan puts only outputs inside concatenations there

    @property
    def key(self) -> str:
        return f"{self.family}.{self.name}"

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        """Why this tactic cannot run `node` on `device`, or None."""
        return None

    def semantics(self, node: Node) -> Node | None:
        """The node whose reference results this tactic's kernels compute for `node`, when they are not
        `node`'s own (a float fallback for a quantized layer); None: `node`'s."""
        return None

    def semantic_inputs(self, node: Node, inputs: list[Any]) -> list[Any]:
        """`node`'s activations (None for constants) as the `semantics` node reads them: the same, unless the
        tactic reads some of them as other values (a float fallback's quantized residual: its real values)."""
        return inputs

    def space(self, effort: int) -> list[dict[str, Any]]:
        """The configurations worth timing at `effort` (0 fastest build, 2 widest search)."""
        return [{}]

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        """The configurations worth timing for `node` at `effort`: `space(effort)`, unless the tactic fits its
        configurations to the node's shape."""
        return self.space(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        raise NotImplementedError


_TACTICS: list[Tactic] = []


def register_tactic(cls: type[Tactic]) -> type[Tactic]:
    if any(t.key == cls().key for t in _TACTICS):
        raise ValueError(f"tactic {cls.family}.{cls.name} is registered twice")
    _TACTICS.append(cls())
    return cls


def tactics_for(node: Node, families: Sequence[str] | None = None) -> Iterator[Tactic]:
    """Registered tactics that claim `node`'s op type, restricted to `families` when given."""
    op = qualified_op(node)
    for tactic in _TACTICS:
        if (not tactic.op_types or op in tactic.op_types) and (families is None or tactic.family in families):
            yield tactic


def all_tactics() -> tuple[Tactic, ...]:
    """Every registered tactic, in registration order."""
    return tuple(_TACTICS)


def tactic_by_key(key: str) -> Tactic | None:
    """The registered tactic named `key` ("family.name"), or None."""
    return next((tactic for tactic in _TACTICS if tactic.key == key), None)
