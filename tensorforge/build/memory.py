"""The memory planner: one arena for a linear schedule, offsets by greedy-by-size best fit.

A tensor lives from the step that writes it to the last step that reads it (both inclusive). Two tensors
whose lifetimes overlap must not overlap in memory; all others may share bytes. Tensors are placed from
the largest down, each into the smallest gap left between the already placed tensors that it meets in
time, or above them all when no gap is wide enough (the "greedy by size" planner of TFLite and ONNX
Runtime). A tensor marked `inplace_of` an input that dies at its first step takes over that input's
storage: the chain of such tensors is planned as one block.

Sizes are rounded up to the alignment before planning, so every offset is aligned; the naive sum and the
lower bound count those rounded sizes too, and the bound counts an in-place chain once.

A concatenation's inputs can live inside its output (`plan_graph`'s `views`): a tensor named a view of a
concatenated tensor from channel c takes no storage of its own; its producer writes straight into channels
[c, c + its channels) of the concatenation's (channels_last) storage, which lives from the first such write to
the last read of either, and the concatenation has nothing left to copy for it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import GraphError
from ..ir import DType, Graph, Value
from ..ops.fused import DOMAIN as FUSED_DOMAIN

DEFAULT_ALIGNMENT = 256

ELEMENTWISE_UNARY = frozenset(
    {
        "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Cast", "Ceil", "Celu", "Clip",
        "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity",
        "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid",
        "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Swish", "Tan", "Tanh", "ThresholdedRelu",
    }
)  # fmt: skip
ELEMENTWISE_BINARY = frozenset(  # with the variadic Sum/Max/Min/Mean and Where
    {
        "Add", "And", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Max", "Mean", "Min", "Mod",
        "Mul", "Or", "Pow", "PRelu", "Sub", "Sum", "Where", "Xor",
    }
)  # fmt: skip
# (domain, op type) of the ops whose single output may overwrite an input of the same shape and dtype:
# each output element depends only on the input elements at the same index.
INPLACE_OPS = frozenset(
    {("", op) for op in ELEMENTWISE_UNARY | ELEMENTWISE_BINARY}
    | {(FUSED_DOMAIN, "FusedPointwise"), (FUSED_DOMAIN, "Gelu")}
)

# (domain, op type) of the ops whose outputs may be views of their first input (torch returns views for
# them): while such a view is alive, the storage it looks into is too.
VIEW_OPS = frozenset(
    ("", op)
    for op in ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Split", "Expand")
)


@dataclass(frozen=True)
class TensorLife:
    """One tensor of the schedule: its size and the steps that first write and last read it (inclusive).

    `inplace_of` names a tensor whose storage this one may take over: it must die at this tensor's first
    step and be at least as large.
    """

    name: str
    size_bytes: int
    first_step: int
    last_step: int
    inplace_of: str | None = None


@dataclass(frozen=True)
class MemoryPlan:
    """Where each tensor lives in the arena, and how the arena compares with no reuse and with the bound."""

    offsets: dict[str, int]
    sizes: dict[str, int]
    arena_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    alignment: int
    inplace: dict[str, str] = field(default_factory=dict)  # tensor -> the tensor whose storage it took
    outside: dict[str, int] = field(default_factory=dict)  # tensors their kernels allocate: name -> bytes at most
    views: dict[str, tuple[str, int]] = field(default_factory=dict)  # tensor -> (concatenation, first channel)

    def report(self) -> str:
        """Arena size against the naive sum and the liveness lower bound, in MiB and as ratios."""
        return "\n".join(
            [
                f"memory plan: {len(self.offsets)} tensors, {len(self.inplace)} in place, "
                f"{len(self.views)} written into their concatenation, alignment {self.alignment} B",
                f"  arena        {_mib(self.arena_bytes)}",
                f"  naive sum    {_mib(self.naive_bytes)}   arena/naive {_ratio(self.arena_bytes, self.naive_bytes)}",
                f"  lower bound  {_mib(self.lower_bound_bytes)}   "
                f"arena/bound {_ratio(self.arena_bytes, self.lower_bound_bytes)}",
            ]
            + (
                [
                    f"  outside      {_mib(sum(self.outside.values()))}   {len(self.outside)} tensors whose kernels "
                    "allocate their own outputs (torch's caching allocator reuses that memory)"
                ]
                if self.outside
                else []
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for the engine header."""
        return {
            "alignment": self.alignment,
            "arena_bytes": self.arena_bytes,
            "naive_bytes": self.naive_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "tensors": {name: [self.offsets[name], self.sizes[name]] for name in self.offsets},
            "inplace": dict(self.inplace),
            "outside": dict(self.outside),
            "views": {name: [host, channel] for name, (host, channel) in self.views.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryPlan:
        try:
            tensors = data["tensors"]
            return cls(
                offsets={name: int(entry[0]) for name, entry in tensors.items()},
                sizes={name: int(entry[1]) for name, entry in tensors.items()},
                arena_bytes=int(data["arena_bytes"]),
                naive_bytes=int(data["naive_bytes"]),
                lower_bound_bytes=int(data["lower_bound_bytes"]),
                alignment=int(data["alignment"]),
                inplace=dict(data.get("inplace", {})),
                outside={name: int(size) for name, size in data.get("outside", {}).items()},
                views={name: (str(host), int(channel)) for name, (host, channel) in data.get("views", {}).items()},
            )
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise ValueError(f"memory plan in the engine header is malformed ({error!r}); rebuild the engine") from None


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:10.3f} MiB"


def _ratio(num: int, den: int) -> str:
    return f"{num / den:.3f}" if den else "n/a"


def _align(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


@dataclass
class _Block:
    """The storage of one in-place chain: its root's size, the union of the members' lifetimes."""

    members: list[TensorLife]
    size: int
    first: int
    last: int
    offset: int = 0


def _check(lives: list[TensorLife], alignment: int) -> None:
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of two, got {alignment}")
    by_name: dict[str, TensorLife] = {}
    for life in lives:
        if life.name in by_name:
            raise ValueError(f"tensor {life.name!r} appears twice in the schedule")
        if life.size_bytes < 0:
            raise ValueError(f"tensor {life.name!r} has a negative size ({life.size_bytes} bytes)")
        if life.first_step < 0 or life.last_step < life.first_step:
            raise ValueError(
                f"tensor {life.name!r} has an invalid lifetime [{life.first_step}, {life.last_step}]: "
                "steps must be non-negative and last_step >= first_step"
            )
        by_name[life.name] = life
    taken: dict[str, str] = {}
    for life in lives:
        if life.inplace_of is None:
            continue
        target = by_name.get(life.inplace_of)
        where = f"tensor {life.name!r} is in place of {life.inplace_of!r}"
        if target is None or target is life:
            raise ValueError(f"{where}, which is not another tensor of the schedule")
        if target.last_step != life.first_step:
            raise ValueError(f"{where}, which dies at step {target.last_step}, not at step {life.first_step}")
        if target.size_bytes < life.size_bytes:
            raise ValueError(f"{where}, which is smaller ({target.size_bytes} < {life.size_bytes} bytes)")
        if target.name in taken:
            raise ValueError(f"{where}, but {taken[target.name]!r} already takes over its storage")
        taken[target.name] = life.name


def _blocks(lives: list[TensorLife], alignment: int) -> list[_Block]:
    """Group each in-place chain, from its root (a tensor in place of none) down; refuse a cycle."""
    successor = {life.inplace_of: life for life in lives if life.inplace_of is not None}
    blocks = []
    for root in lives:
        if root.inplace_of is not None:
            continue
        chain = [root]
        while chain[-1].name in successor:
            chain.append(successor[chain[-1].name])
        blocks.append(_Block(chain, _align(root.size_bytes, alignment), root.first_step, chain[-1].last_step))
    if sum(len(block.members) for block in blocks) < len(lives):
        planned = {life.name for block in blocks for life in block.members}
        cycle = sorted(life.name for life in lives if life.name not in planned)
        raise ValueError(f"tensors {cycle} are in place of one another in a cycle; one of them must own its storage")
    return blocks


def _best_fit(block: _Block, placed: list[_Block]) -> int:
    """The offset of the smallest gap among placed blocks that meet `block` in time, or the top of them."""
    neighbours = sorted(
        (other for other in placed if other.first <= block.last and block.first <= other.last),
        key=lambda other: other.offset,
    )
    best_offset, best_gap, top = None, math.inf, 0
    for other in neighbours:
        gap = other.offset - top
        if block.size <= gap < best_gap:
            best_offset, best_gap = top, gap
        top = max(top, other.offset + other.size)
    return top if best_offset is None else best_offset


def _lower_bound(blocks: list[_Block]) -> int:
    """The most bytes live at any one step: a sweep over block starts and ends."""
    events: dict[int, int] = {}
    for block in blocks:
        events[block.first] = events.get(block.first, 0) + block.size
        events[block.last + 1] = events.get(block.last + 1, 0) - block.size
    live = peak = 0
    for step in sorted(events):
        live += events[step]
        peak = max(peak, live)
    return peak


def plan_memory(lives: Iterable[TensorLife], alignment: int = DEFAULT_ALIGNMENT) -> MemoryPlan:
    """Assign every tensor an aligned offset in one arena, reusing the bytes of tensors that are dead."""
    lives = list(lives)
    _check(lives, alignment)
    blocks = _blocks(lives, alignment)
    placed: list[_Block] = []
    for block in sorted(blocks, key=lambda b: (-b.size, b.first, b.members[0].name)):
        block.offset = _best_fit(block, placed) if block.size else 0
        placed.append(block)
    offsets = {life.name: block.offset for block in blocks for life in block.members}
    return MemoryPlan(
        offsets={life.name: offsets[life.name] for life in lives},
        sizes={life.name: life.size_bytes for life in lives},
        arena_bytes=max((b.offset + b.size for b in blocks), default=0),
        naive_bytes=sum(_align(life.size_bytes, alignment) for life in lives),
        lower_bound_bytes=_lower_bound(blocks),
        alignment=alignment,
        inplace={life.name: life.inplace_of for life in lives if life.inplace_of is not None},
    )


# -- from an IR graph ---------------------------------------------------------------------------------------


def _size_bytes(
    value: Value, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, DType]
) -> tuple[tuple[int, ...], DType, int]:
    shape = shapes.get(value.name, value.shape)
    dtype = dtypes.get(value.name, value.dtype)
    if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        shown = "unknown" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"
        raise GraphError(
            f"cannot plan memory for value {value.name!r}: its shape is {shown}, not static; run shape "
            "inference for a fixed input shape or pass its shape in `shapes`"
        )
    if not dtype.has_torch:
        raise GraphError(f"cannot plan memory for value {value.name!r}: element type {dtype.name} has no size")
    return tuple(shape), dtype, -(-math.prod(shape) * dtype.bits // 8)


def plan_graph(
    graph: Graph,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    exclude_outputs: bool = True,
    *,
    dtypes: Mapping[str, DType] | None = None,
    exclude: Iterable[str] = (),
    outside: Iterable[str] = (),
    include_inputs: bool = False,
    alignment: int = DEFAULT_ALIGNMENT,
    views: Mapping[str, tuple[str, int]] | None = None,
    only_as_views: Iterable[str] = (),
) -> MemoryPlan:
    """Plan the arena for the node outputs of `graph`, one step per node in node order.

    `shapes` gives static shapes by value name and overrides the graph's own; `dtypes` does the same for
    element types (a layer built in fp16 writes its float32 values in half the bytes). Values named in
    `exclude` (sequences, strings: not tensors of fixed size) stay out of the arena, and so do those named in
    `outside` (tensors whose kernels allocate them; the plan lists their sizes). Constants never go in the
    arena; graph inputs only with `include_inputs`; graph outputs only with `exclude_outputs=False` (they
    then live to the last step). An output of an `INPLACE_OPS` node may take over the storage of an input
    with its shape and dtype that this node reads last. `views` names tensors to place inside a concatenation's
    storage, by (concatenation, first channel): each is kept where both tensors are planned and neither is in an
    in-place chain, and the concatenation then lives over both lifetimes. Tensors named in `only_as_views` go in
    the arena only as such views; those not placed so are outside (their kernels allocate them).
    """
    shapes = shapes or {}
    dtypes = dtypes or {}
    outside = set(outside)
    excluded = set(exclude)
    nodes = graph.nodes
    step_of = {}
    for step, node in enumerate(nodes):
        step_of[node] = step
        for sub in node.subgraphs():
            step_of.update(dict.fromkeys(sub.all_nodes(), step))  # an outer value read inside a subgraph
    outputs = {value.name for value in graph.outputs}

    def planned(value: Value) -> bool:
        """Whether `value` is a tensor the plan accounts for (in the arena, or outside it when so named)."""
        if value.is_const or value.name in graph.initializers or not value.name or value.name in excluded:
            return False
        if value.name in outputs and exclude_outputs:
            return False
        producer = value.producer()
        if producer is None:
            return include_inputs and value in graph.inputs
        return producer in step_of and not (producer.op_type == "Constant" and producer.domain == "")

    candidates = list(graph.inputs) + [value for node in nodes for value in node.outputs]
    lives: dict[str, TensorLife] = {}
    typed: dict[str, tuple[tuple[int, ...], Any]] = {}
    for value in candidates:
        if value.name in lives or value.name in outside or not planned(value):
            continue
        shape, dtype, size = _size_bytes(value, shapes, dtypes)
        producer = value.producer()
        first = 0 if producer is None else step_of[producer]
        last = max([first] + [step_of[user] for user, _ in value.uses() if user in step_of])
        view_last, viewed_outside = _view_reach(value, step_of, outputs)
        if viewed_outside:  # a graph output may look into its storage: the kernel allocates it instead
            continue
        last = max(last, view_last)
        if value.name in outputs:
            last = max(last, len(nodes) - 1)
        lives[value.name] = TensorLife(value.name, size, first, last)
        typed[value.name] = (shape, dtype)

    outside_sizes = {
        value.name: _size_bytes(value, shapes, dtypes)[2]
        for value in candidates
        if value.name in outside and planned(value)
    }
    placed_views = _merge_views(lives, views or {})
    for name in set(only_as_views).difference(placed_views).intersection(lives):
        outside_sizes[name] = lives.pop(name).size_bytes
    # a concatenation and the tensors inside it keep their storage: no in-place chain takes it or extends it
    taken: set[str] = set(placed_views) | {host for host, _ in placed_views.values()}
    for step, node in enumerate(nodes):
        if (node.domain, node.op_type) not in INPLACE_OPS or len(node.outputs) != 1:
            continue
        out = node.outputs[0].name
        if out not in lives or out in taken:
            continue
        for value in node.inputs:
            name = value.name if value is not None else ""
            source = lives.get(name)
            if source and name not in taken and source.last_step == step and typed[name] == typed[out]:
                lives[out] = TensorLife(out, lives[out].size_bytes, step, lives[out].last_step, inplace_of=name)
                taken.add(name)
                break
    members = {name: lives.pop(name) for name in placed_views}
    plan = plan_memory(lives.values(), alignment)
    if members:
        offsets, sizes = dict(plan.offsets), dict(plan.sizes)
        for name, life in members.items():
            offsets[name], sizes[name] = offsets[placed_views[name][0]], life.size_bytes
        naive = plan.naive_bytes + sum(_align(life.size_bytes, alignment) for life in members.values())
        plan = dataclasses.replace(plan, offsets=offsets, sizes=sizes, naive_bytes=naive, views=placed_views)
    return dataclasses.replace(plan, outside=outside_sizes) if outside_sizes else plan


def _merge_views(lives: dict[str, TensorLife], views: Mapping[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """The `views` whose tensor and concatenation are both planned (a concatenation is never itself a view);
    each concatenation's lifetime in `lives` widened to cover its views'."""
    placed = {
        name: (host, channel)
        for name, (host, channel) in views.items()
        if name in lives and host in lives and host not in views and name != host
    }
    for name, (host, _) in placed.items():
        life, own = lives[name], lives[host]
        lives[host] = dataclasses.replace(
            own, first_step=min(own.first_step, life.first_step), last_step=max(own.last_step, life.last_step)
        )
    return placed


def _view_reach(value: Value, step_of: Mapping[Any, int], outputs: set[str]) -> tuple[int, bool]:
    """The last step reading a view of `value` (through chains of `VIEW_OPS`), and whether a view is a graph
    output."""
    last, reaches_output = -1, False
    pending = [value]
    while pending:
        current = pending.pop()
        for user, index in current.uses():
            if index != 0 or (user.domain, user.op_type) not in VIEW_OPS:
                continue
            for view in user.outputs:
                if view is None or not view.name:
                    continue
                reaches_output = reaches_output or view.name in outputs
                last = max([last] + [step_of[reader] for reader, _ in view.uses() if reader in step_of])
                pending.append(view)
    return last, reaches_output
