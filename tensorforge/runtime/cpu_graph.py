"""CPU graphs: a run recorded as the calls that did the work, replayed without the Python that worked them out.

On the CPU nothing like a CUDA graph exists, and a batch-1 run of a small network spends a tenth of its time in
the Python around its kernels (argument checks, shape arithmetic, allocations, weight lookups): about 14 µs a
layer, against a microsecond or two to call a C++ kernel. `capture(fn)` runs `fn` once and records, in order,
every call that computes: our C++ kernels (intercepted where they are called, `kernels.cpu.extension`) and the
torch ops in between (a `TorchDispatchMode`), with what each read and wrote.

Tensors come in two kinds. Memory the run allocated (`torch.empty` and the like; our kernels' outputs) is kept
by the graph: a replay writes the same memory again, so it allocates nothing. A tensor an op returned (a oneDNN
convolution's output, a concatenation) is a value of the replay: each replay makes it anew and hands it to the
calls that read it, and drops it after its last reader, as a run does. Views of kept memory are that memory;
views of values are made again. The Python is not replayed, so a run can be recorded only if it does the same
on any input of these shapes; a run that reads a tensor's values on the host (`item`, `tolist`, an op whose
output shape depends on values) may not and is refused with `NotReplayable`. Every capture is checked: the
memory it kept is poisoned and a replay on the recorded inputs must give the recorded outputs exactly.

A call that reads only constants (no value, no kept memory, no input) is not replayed at all where its result is
small (`FOLDED_BYTES`): the graph keeps that result as a constant, whose values may then be read on the host. That
is a dynamic-shape model's shape arithmetic (Shape, Gather, Unsqueeze, Concat on int64 shapes), the same on every
run of these shapes, down to the Reshape that reads its target as numbers: before, such a run could not be recorded,
and ViT-S/16 and BERT-base exported with a dynamic batch ran every layer from Python. Should a later call write into
such a constant in place, the graph puts its recorded value back at the start of each replay.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from ..build.memory import TensorLife, plan_memory
from ..kernels.cpu.extension import intercepted
from ..ops.math_flags import full_float32

aten = torch.ops.aten
# Ops whose result is new memory and nothing else: the recorded tensor keeps its memory, nothing to replay.
ALLOCATIONS = frozenset(
    {aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default, aten.new_empty_strided.default,
     aten.empty_like.default}
)  # fmt: skip
# Ops through which a tensor's values reach Python (`tolist` and `numpy` resolve conjugation first).
HOST_READS = frozenset({aten.item.default, aten._local_scalar_dense.default, aten.resolve_conj.default,
                        aten.resolve_neg.default})  # fmt: skip
HOST_TAGS = frozenset({torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape})
# In-place ops that change no values (`torch.tensor(...)` detaches the tensor it makes): nothing to replay.
METADATA_ONLY = frozenset({aten.detach_.default})
KEPT_ALIGNMENT = 64  # bytes: a cache line (and an AVX-512 vector)
# A call that reads nothing of the run (only constants: the shapes' arithmetic of a dynamic-shape model, Shape →
# Gather → Unsqueeze → Concat) gives the same result on every replay: its result is kept as a constant of the graph
# and the call is not replayed, where the result takes at most this many bytes (a larger one is made again each
# replay, as before, rather than held for the graph's life).
FOLDED_BYTES = 4096


class NotReplayable(RuntimeError):
    """A run that a CPU graph cannot redo (its Python depends on tensor values), or one whose replay differed."""


class CpuGraph:
    """The recorded calls of one run; `replay()` makes them again, in order, and returns the run's result."""

    __slots__ = ("_calls", "_kept", "_result", "_slots", "kept_bytes")

    def __init__(
        self,
        calls: Sequence[_Call],
        slots: int,
        result: tuple[list[Any], list[int], Any],
        kept: list[_KeptArgument],
        kept_bytes: int,
    ) -> None:
        self._calls = tuple(calls)
        self._slots = slots
        self._result = result  # the result's leaves, the value slot of each (-1: kept memory), its structure
        self._kept = kept  # the arguments (and result leaves) in kept memory, placed in it by `bind`
        self.kept_bytes = kept_bytes  # the memory the graph keeps (the run's allocations, planned by liveness)

    def bind(self, buffer: torch.Tensor) -> None:
        """Place the kept memory in `buffer` (uint8, at least `kept_bytes`): every argument and result there
        becomes a view of it. A graph is replayable once bound; rebinding moves it (`KeptMemory`)."""
        if buffer.dtype != torch.uint8 or buffer.numel() < self.kept_bytes:
            raise ValueError(f"a CPU graph needs a uint8 buffer of {self.kept_bytes} bytes for its kept memory")
        typed: dict[torch.dtype, torch.Tensor] = {}
        leaves = self._result[0]
        for kept in self._kept:
            whole = typed.get(kept.dtype)
            if whole is None:
                usable = buffer.numel() // kept.dtype.itemsize * kept.dtype.itemsize
                whole = typed[kept.dtype] = buffer[:usable].view(kept.dtype)
            view = whole.as_strided(kept.shape, kept.stride, kept.offset)
            if kept.call < 0:
                leaves[kept.position] = view
            else:
                self._calls[kept.call].flat[kept.position] = view

    def __len__(self) -> int:
        return len(self._calls)

    def replay(self) -> Any:
        env: list[Any] = [None] * self._slots
        with torch.inference_mode(), full_float32():
            for call in self._calls:
                call.run(env)
        return self._outputs(env)

    def timed_replay(self) -> tuple[Any, list[tuple[Any, int, int]]]:
        """`replay()`, and each call's tag (what `capture`'s `tag` said when it was recorded) with its start and
        end on `time.perf_counter_ns`."""
        env: list[Any] = [None] * self._slots
        marks = []
        clock = time.perf_counter_ns
        with torch.inference_mode(), full_float32():
            for call in self._calls:
                start = clock()
                call.run(env)
                marks.append((call.tag, start, clock()))
        return self._outputs(env), marks

    def _outputs(self, env: list[Any]) -> Any:
        leaves, slots, spec = self._result
        return tree_unflatten([env[s] if s >= 0 else leaf for leaf, s in zip(leaves, slots, strict=True)], spec)


class _Call:
    """One recorded call: `function` on its recorded arguments (`flat`, rebuilt by `spec` where it has
    containers or keywords) with the values of the replay at `reads` (argument position, slot) put in, its
    results stored at `writes` (-1: none), the values in `release` dropped after it."""

    __slots__ = ("flat", "function", "reads", "release", "spec", "tag", "writes")

    def __init__(self, function, flat: list[Any], spec, reads, writes, tag: Any = None) -> None:
        self.function = function
        self.flat = flat
        self.spec = spec
        self.reads = reads
        self.writes = writes
        self.tag = tag
        self.release: tuple[int, ...] = ()

    def run(self, env: list[Any]) -> None:
        flat = self.flat
        if self.reads:
            flat = flat.copy()
            for position, slot in self.reads:
                flat[position] = env[slot]
        if self.spec is None:
            result = self.function(*flat)
        else:
            args, kwargs = tree_unflatten(flat, self.spec)
            result = self.function(*args, **kwargs)
        writes = self.writes
        if writes:
            values = (result,) if isinstance(result, torch.Tensor) else tree_leaves(result)
            for slot, value in zip(writes, values, strict=True):
                if slot >= 0:
                    env[slot] = value
        for slot in self.release:
            env[slot] = None


class _KeptArgument(NamedTuple):
    """A tensor in kept memory: where it is used (call index and flat position; call -1: a leaf of the result)
    and where it lies (its dtype's elements from the start of the kept memory)."""

    call: int
    position: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class KeptMemory:
    """The kept memory of the CPU graphs of one execution context: one buffer, as large as the largest graph
    needs, in which every graph replays (a context replays one graph at a time, and the context copies each
    replay's outputs before the next). A graph that needs more grows it, and every graph is moved into the new
    buffer, so a context that records many shapes keeps one graph's worth, not their sum."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self._graphs: list[CpuGraph] = []

    def adopt(self, graph: CpuGraph) -> None:
        if graph.kept_bytes > self.buffer.numel():
            self.buffer = torch.empty(graph.kept_bytes, dtype=torch.uint8)
            for other in self._graphs:
                other.bind(self.buffer)
        graph.bind(self.buffer)
        self._graphs.append(graph)


def capture(
    fn: Callable[[], Any],
    inputs: Sequence[torch.Tensor] = (),
    scratch: Sequence[torch.Tensor] = (),
    tag: Callable[[], Any] | None = None,
    memory: KeptMemory | None = None,
) -> tuple[CpuGraph, Any]:
    """`fn()` run once and recorded: the graph and the result of its checking replay (what `fn` returned, in the
    graph's memory). `inputs` are the tensors whose values a replay is for, `scratch` memory allocated before the
    run that it writes into (an arena): reading either's values on the host is refused, as is reading the values
    of what the run computed (constants may be read).
    Checked before it is returned: the memory the run allocated and `scratch` are filled with NaN, then a replay
    must give `fn`'s results again exactly. Raises `NotReplayable` with the reason where the run cannot be
    recorded or the check fails. `tag()`, asked as each call is recorded, labels it (`CpuGraph.timed_replay`).
    The graph's kept memory goes into `memory` (shared with the graphs already there), or a buffer of its own."""
    recorder = _Recorder([*inputs, *scratch], tag)
    with torch.inference_mode(), recorder, intercepted(recorder.extension_call):
        result = fn()
    expected = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in tree_leaves(result)]
    graph = recorder.graph(result)
    memory = memory or KeptMemory()
    memory.adopt(graph)
    with torch.inference_mode():
        for tensor in (memory.buffer, *scratch):
            _poison(tensor)
    replayed = graph.replay()
    for index, (got, want) in enumerate(zip(tree_leaves(replayed), expected, strict=True)):
        if isinstance(want, torch.Tensor) and not _same(got, want):
            raise NotReplayable(f"the replayed run's output {index} differs from the recorded run's")
    return graph, replayed


class _Recorder(TorchDispatchMode):
    """Records the calls of a run: torch ops as they reach the dispatcher, C++ kernels through `extension_call`
    (the torch ops a kernel makes inside are its own business: they are not recorded)."""

    def __init__(self, watched: list[torch.Tensor], tag: Callable[[], Any] | None = None) -> None:
        super().__init__()
        self.calls: list[_Call] = []
        self._tag = tag
        self._watched = watched  # memory the run reads or writes that it did not allocate
        self.kept: list[torch.Tensor] = []  # memory the run allocated, which the graph keeps
        self._slot: dict[int, int] = {}  # id of a value (a tensor an op returned) → its slot
        self._values: list[torch.Tensor] = []  # the values, alive until the end so that their ids stay theirs
        self._folded: list[tuple[torch.Tensor, torch.Tensor]] = []  # constants made by calls not replayed, a copy
        self._restored: list[_Call] = []  # each puts a folded constant that a call writes into back (first in a replay)
        self._in_kernel = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self._in_kernel:
            return result
        outputs = tree_leaves(result)
        to_host = any(not isinstance(out, torch.Tensor) for out in outputs if out is not None)
        if to_host or func in HOST_READS or HOST_TAGS.intersection(func.tags):
            if self._reads_run_data(args):
                raise NotReplayable(f"{func} reads the values of a tensor of the run on the host")
            if to_host:  # a number from constants: the same on every run, nothing to record
                return result
        if func in ALLOCATIONS:
            self.kept.extend(outputs)
            return result
        if func in METADATA_ONLY:
            return result
        leaves = tree_leaves((args, kwargs))
        if not func._schema.is_mutable and outputs and all(any(o is leaf for leaf in leaves) for o in outputs):
            return result  # returns its argument (a cast to the type it has): nothing to make again
        reads_values = any(id(leaf) in self._slot for leaf in leaves)
        if func._schema.is_mutable:
            self._restore_folded(leaves)
        elif self._foldable(func, leaves, outputs):
            self._folded.extend((out, out.clone()) for out in outputs)
            return result  # a constant of the graph, the same on every replay
        if func._schema.is_mutable or reads_values:
            self._record(func, args, kwargs, outputs)  # in place or out=, or what reads a value: made again
        elif not all(out is None or _aliases(out, args) for out in outputs):
            self._record(func, args, kwargs, outputs)  # a new tensor: a value
        # (what remains is a view of kept memory: that memory, nothing to make again)
        return result

    def _foldable(self, func, leaves: list[Any], outputs: list[Any]) -> bool:
        """Whether a functional call's result is a constant of the graph: it reads no tensor of the run, draws no
        random numbers, and makes small new tensors (`FOLDED_BYTES` in all)."""
        if torch.Tag.nondeterministic_seeded in func.tags or not outputs:
            return False
        if not all(isinstance(out, torch.Tensor) and out.layout == torch.strided for out in outputs):
            return False
        if sum(out.numel() * out.element_size() for out in outputs) > FOLDED_BYTES:
            return False
        if any(_aliases(out, leaves) for out in outputs):
            return False  # a view of its argument: what that is, as before
        return not self._reads_run_data(tuple(leaves))

    def _restore_folded(self, leaves: list[Any]) -> None:
        """Before a call that may write into its arguments: every folded constant among them (or sharing memory
        with one) gets a call that copies its recorded value back, run first in each replay (tagged as that call:
        a profile counts it in that call's layer), and is the run's data from then on (what reads it is replayed)."""
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        for index, (constant, value) in enumerate(self._folded):
            if value is not None and any(_aliases(constant, [t]) for t in tensors):
                tag = None if self._tag is None else self._tag()
                self._restored.append(_Call(torch.Tensor.copy_, [constant, value], None, (), (-1,), tag))
                self._folded[index] = (constant, None)  # restored once a replay: before anything reads it
                self._watched.append(constant)

    def extension_call(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        self._in_kernel = True
        try:
            result = function(*args)
        finally:
            self._in_kernel = False
        outputs = [] if result is None else tree_leaves(result)
        if not all(isinstance(out, torch.Tensor) for out in outputs):
            raise NotReplayable(f"the C++ kernel {function.__name__} returns values to the host")
        self._restore_folded(tree_leaves(args))  # (a kernel writes into its out= arguments)
        self._record(function, args, {}, outputs)
        return result

    def _reads_run_data(self, args: tuple) -> bool:
        """Whether `args` hold a tensor of the run: a value, or memory that is kept, an input or scratch."""
        tensors = [leaf for leaf in tree_leaves(args) if isinstance(leaf, torch.Tensor) and leaf.numel()]
        return any(id(t) in self._slot or _aliases(t, (self.kept, self._watched)) for t in tensors)

    def _record(self, function, args: tuple, kwargs: dict, outputs: list[Any]) -> None:
        if kwargs or any(isinstance(arg, (list, tuple, dict)) for arg in args):
            flat, spec = tree_flatten((args, kwargs))
        else:
            flat, spec = list(args), None
        reads = tuple((i, self._slot[id(leaf)]) for i, leaf in enumerate(flat) if id(leaf) in self._slot)
        writes = []
        for out in outputs:
            if not isinstance(out, torch.Tensor):
                writes.append(-1)
            elif id(out) in self._slot:  # an in-place op's result: the value it was given
                writes.append(self._slot[id(out)])
            elif any(out is leaf for leaf in flat) or _aliases(out, [t for t in flat if id(t) not in self._slot]):
                writes.append(-1)  # kept memory written again
            else:
                writes.append(self._new_value(out))
        tag = None if self._tag is None else self._tag()
        kept = [None if id(x) in self._slot else x for x in flat]
        self.calls.append(_Call(function, kept, spec, reads, tuple(writes), tag))

    def _new_value(self, tensor: torch.Tensor) -> int:
        self._slot[id(tensor)] = slot = len(self._values)
        self._values.append(tensor)
        return slot

    def graph(self, result: Any) -> CpuGraph:
        """The graph of the calls recorded, returning `result` (its values made again), its kept memory planned
        by liveness (`_plan_kept`) and left to be bound to a buffer (`CpuGraph.bind`)."""
        self.calls[:0] = self._restored
        self._restored = []
        leaves, spec = tree_flatten(result)
        result_slots = [self._slot.get(id(leaf), -1) if isinstance(leaf, torch.Tensor) else -1 for leaf in leaves]
        last: dict[int, int] = {}
        for index, call in enumerate(self.calls):
            for slot in (*(s for _, s in call.reads), *(s for s in call.writes if s >= 0)):
                last[slot] = index
        for slot in result_slots:
            last.pop(slot, None)
        for slot, index in last.items():
            self.calls[index].release += (slot,)
        kept_leaves = [None if s >= 0 else leaf for leaf, s in zip(leaves, result_slots, strict=True)]
        kept, kept_bytes = self._plan_kept(kept_leaves)
        return CpuGraph(self.calls, len(self._values), (kept_leaves, result_slots, spec), kept, kept_bytes)

    def _plan_kept(self, result_leaves: list[Any]) -> tuple[list[_KeptArgument], int]:
        """Where each allocation of the run goes in the kept memory: at the offset a liveness plan gives it (from
        the first call that touches it to the last; the result's to the end), as a run's allocator would reuse
        it. Returns every argument and result leaf in kept memory (taken out of the calls: `CpuGraph.bind` puts
        views back) and the bytes the plan needs."""
        sizes = {_address(t): t.untyped_storage().nbytes() for t in self.kept if _address(t) is not None}
        places = [*((i, call.flat) for i, call in enumerate(self.calls)), (-1, result_leaves)]
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for order, (_, leaves) in enumerate(places):
            for leaf in leaves:
                address = _address(leaf) if isinstance(leaf, torch.Tensor) else None
                if address in sizes:
                    first.setdefault(address, order)
                    last[address] = order
        plan = plan_memory([TensorLife(str(a), sizes[a], first[a], last[a]) for a in first], KEPT_ALIGNMENT)
        kept = []
        for index, leaves in places:
            for position, leaf in enumerate(leaves):
                address = _address(leaf) if isinstance(leaf, torch.Tensor) else None
                if address in first:
                    start = plan.offsets[str(address)] // leaf.element_size() + leaf.storage_offset()
                    kept.append(_KeptArgument(index, position, leaf.dtype, leaf.shape, leaf.stride(), start))
                    leaves[position] = None
        return kept, _rounded(plan.arena_bytes, KEPT_ALIGNMENT)


def _aliases(tensor: torch.Tensor, others: Iterable[Any]) -> bool:
    """Whether `tensor` shares memory with a tensor among `others` (nested; opaque tensors share with none)."""
    if tensor.numel() == 0:
        return True
    address = _address(tensor)
    return address is not None and any(
        isinstance(other, torch.Tensor) and other.numel() and _address(other) == address
        for other in tree_leaves(others)
    )


def _rounded(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def _address(tensor: torch.Tensor) -> int | None:
    return tensor.untyped_storage().data_ptr() if tensor.layout == torch.strided else None


def _poison(tensor: torch.Tensor) -> None:
    if tensor.layout != torch.strided:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(math.nan)
    elif tensor.dtype == torch.bool:
        tensor.fill_(True)
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.is_floating_point():
        return bool(torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()))
    return torch.equal(got, want)
