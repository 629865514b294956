"""The autotuner: time every supported candidate of a layer on real inputs and pick the fastest correct one.

A candidate is a tactic × one of its configs × a variant (precision and layout, `variant.py`). Each first
runs once and is compared with the reference tactic's float32 output on the same inputs (max-norm relative
error within the tolerance of its precision, below); a wrong or failing candidate scores inf. Correct ones
are timed with `timing.measure` on the inputs as the producers deliver them, so a cast or a memory-format
change a variant needs is part of its time. Results are kept in a `TimingCache` under the layer's signature,
so a rebuild with the cache re-times nothing.

A quantized output (a QuantizedConv / QuantizedGemm or a LayerNormalization with `y_scale`,
`passes.quant_chain`) is checked against the float values it rounds (the node with a float output): the
candidate's value must lie between the quantizations of the reference value minus and plus its precision's
tolerance (max norm, as for float outputs). Quantization is monotone, so this is exactly "a correct rounding of
a value within tolerance", never looser: a kernel may round a value within the tolerance of a rounding tie
either way, and no other.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import TuningError
from ..ir import DType, Node, qualified_op
from ..kernels.quantize import KINDS
from ..ops.fused import DOMAIN, is_quantized_tensor
from ..ops.math_flags import full_float32
from . import (  # noqa: F401 - registers the tactic families
    concat,
    cpu_family,
    cpu_quantized,
    cuda_family,
    fallback,
    gluon_gemm,
    gluon_stem,
    sparse,
    triton_conv,
    triton_family,
    triton_gemm,
    triton_pointwise,
    triton_squeeze_excite,
    vendor,
)
from .base import Tactic, tactics_for
from .fallback import output_quantization, with_float_output
from .timing import ContextLost, TimingBudget, context_lost, first_line, measure, measure_interleaved
from .timing_cache import TimingCache, describe, device_key, signature, software_versions
from .variant import (
    PRECISION_DTYPE,
    ConstantCache,
    LayerKernel,
    Variant,
    constant_inputs,
    convert,
    prepare_constants,
    variants,
)

# Largest max-norm relative error a candidate may have against the float32 reference, by its precision;
# outputs the graph declares in another float type (float64, float16) are held to that type's bound.
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 5e-3, "bf16": 3e-2}
DTYPE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
# A layer of E4M3 products: Hopper's fp8 matrix instructions add their products with about 14 bits aligned to the
# largest (DeepSeek-V3 report, §3.3.2; measured 1.7e-4 over 64 products on an H200). Promoting each K step's sum
# into the float32 accumulator (`max_num_imprecise_acc`) keeps the error that of one K step's sum whatever K is
# (1.5-2.8e-4 on an H100); left to the tensor cores over the whole K it grows with K (1.6e-3 at K = 768, 3.1e-3 at
# 3072, 5.4e-3 at 4608: `bench/fp8_accumulation.py`). The bound is an eighth of what the operands' own rounding to
# E4M3 costs such a product (3.6-4.1e-2, same bench), which no kernel avoids, and fp16's: a candidate that leaves
# its sums to the tensor cores (`GemmConfig.promote` off; Transformer Engine's forward products do so) passes
# up to K of about 4000 whatever its epilogue's precision (at 1e-3, only an fp16-output layer's did).
FP8_PRODUCTS_TOLERANCE = 5e-3
_REFERENCE_VARIANT = Variant("fp32", "NCHW")
_QUANTIZED_LAYERS = (f"{DOMAIN}::QuantizedConv", f"{DOMAIN}::QuantizedGemm")
# Below effort 2, a (tactic, precision, layout) whose first configuration runs slower than this many times the
# best first configuration is not tuned further: it is a slow kernel family or precision for the layer.
CONTENDER_RATIO = 2.0
# On the CPU the fastest few candidates timed by a search are timed again against one another in interleaved
# rounds (`_Search.confirm`).
CONFIRM_TOP, CONFIRM_ROUNDS = 3, 3
CONFIRM_PASSES = 3  # at most, while a candidate left out of the rounds times faster than those in them
_REFERENCE_LOCK = threading.Lock()


@contextlib.contextmanager
def on_device(device: torch.device) -> Iterator[None]:
    """Work on `device` from any thread: on CUDA, the device current and its primary context current in this
    thread. A fresh worker thread has no current context until a runtime call makes one current, and Triton's
    launcher encodes TMA descriptors through the driver first: a candidate that ran first in its thread failed
    with "invalid device context"."""
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        torch.cuda.current_stream(device).query()  # a runtime call: binds the primary context to this thread
        yield


@dataclass
class Candidate:
    """One candidate of a layer and its score (inf: unsupported, failed or wrong; `note` says which)."""

    tactic: str
    config: dict[str, Any]
    median_ms: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        time = self.median_ms if math.isfinite(self.median_ms) else None
        return {"tactic": self.tactic, "config": self.config, "median_ms": time, "note": self.note}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        time = data["median_ms"]
        return cls(data["tactic"], dict(data["config"]), math.inf if time is None else float(time), data["note"])


@dataclass
class Choice:
    tactic: str
    config: dict[str, Any]
    median_ms: float
    candidates: list[Candidate] = field(default_factory=list)
    from_cache: bool = False
    skipped: int = 0  # configurations not tried: their tactic and variant were slow in its first one
    prepare_s: float = 0.0  # wall time building, compiling and checking candidates
    timing_s: float = 0.0  # wall time timing them
    candidate_s: float = 0.0  # the candidates' own preparation times, summed (over prepare_s: the overlap won)
    first_run_s: float = 0.0  # of which their first runs, where kernels compile

    def table(self, layer: str) -> str:
        """The build-log table: each candidate's time and % of the best, the winner marked."""
        lines = [f"{layer}: {self.tactic} {self.median_ms:.4f} ms" + (" (timing cache)" if self.from_cache else "")]
        for c in sorted(self.candidates, key=lambda c: c.median_ms):
            share = f"{100 * c.median_ms / self.median_ms:7.1f}%" if math.isfinite(c.median_ms) else "    inf"
            mark = "*" if (c.tactic, c.config) == (self.tactic, self.config) else " "
            time = f"{c.median_ms:9.4f} ms" if math.isfinite(c.median_ms) else "      inf"
            lines.append(f"  {mark} {c.tactic:<24} {time} {share}  {c.note}".rstrip())
        if self.skipped:
            lines.append(f"  ({self.skipped} configurations of slower tactics not tried; effort 2 tries them all)")
        return "\n".join(lines)


def layer_signature(node: Node, inputs: Sequence[torch.Tensor | None], device: torch.device) -> tuple[str, str]:
    """The timing-cache key of `node` on `inputs` (shapes, dtypes and memory formats), and its description."""
    shapes = [None if t is None else list(t.shape) for t in inputs]
    dtypes = [None if t is None else t.dtype for t in inputs]
    layout = (
        "NHWC" if any(_channels_last(t) for t in inputs) else "strided" if any(_strided(t) for t in inputs) else "NCHW"
    )
    op = qualified_op(node)
    key = signature(device_key(device), software_versions(), op, shapes, dtypes, layout, dict(node.attributes))
    return key, describe(op, shapes, dtypes, layout)


def layer_key(node: Node, inputs: Sequence[torch.Tensor | None], device: torch.device) -> str:
    """The timing-cache key `autotune` files `node`'s candidates under, for its inputs as the producers deliver
    them (None for constants: the graph's give their shapes and types where they are)."""
    return layer_signature(node, _with_constants(node, inputs, torch.device("cpu")), device)[0]


def _strided(tensor: torch.Tensor | None) -> bool:
    """A view whose strides are not the contiguous ones (a transposed or reshaped channels_last map): the
    kernels' speed depends on them, so its timings are kept apart from a contiguous tensor's."""
    return isinstance(tensor, torch.Tensor) and not tensor.is_contiguous()


def _channels_last(tensor: torch.Tensor | None) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.dim() == 4
        and tensor.is_contiguous(memory_format=torch.channels_last)
        and not tensor.is_contiguous()
    )


def autotune(
    node: Node,
    opset: int,
    inputs: Sequence[torch.Tensor | None],
    device: torch.device | str,
    *,
    effort: int = 1,
    precisions: Sequence[str] = ("fp32",),
    families: Sequence[str] | None = None,
    cache: TimingCache | None = None,
    constants: ConstantCache | None = None,
    exhaustive: bool = False,
    workers: int | None = None,
) -> Choice:
    """The fastest correct candidate for `node` on `inputs` (on `device`), with every candidate's score.

    `inputs` are the layer's inputs as its producers deliver them (a constant input may be passed as None:
    the node's value is used). `precisions` are the ones the build allows; `constants` caches the converted
    weights across layers and calls.

    The search runs in two rounds: first every (tactic, precision, layout) in the first configuration of its
    tuning space, then the rest of the space of those whose first time is within `CONTENDER_RATIO` of the
    best or failed (all of them at effort 2 or when `exhaustive`); a promoted E4M3 configuration of the second
    round waits for a third, which takes it only where its unpromoted twin failed (`unpromoted_twin`; all of them
    when `exhaustive`). In each round the candidates are built, compiled and checked by `workers` threads at once
    (compiling is most of a GPU build; default `compile_workers`), then timed one after another. On the CPU the
    fastest few are then timed again against one another (`_Search.confirm`).
    """
    device = torch.device(device)
    constants = {} if constants is None else constants
    workers = compile_workers(device) if workers is None else workers
    inputs = _with_constants(node, inputs, device)
    key, description = layer_signature(node, inputs, device)
    quantized = output_quantization(node)
    reference = _reference_outputs(with_float_output(node) if quantized else node, opset, inputs, device)
    budget = TimingBudget.for_effort(effort)
    from_cache = cache is not None and key in cache
    search = _Search(node, opset, device, inputs, reference, budget, constants, cache, key, description, workers)
    search.quantized = quantized
    groups = []
    for tactic, reason, configs in candidate_groups(node, opset, device, effort, precisions, families):
        if reason:
            search.candidates.append(Candidate(tactic.key, {}, math.inf, f"unsupported: {reason}"))
        else:
            groups.append((tactic, configs))
    first = search.score([(tactic, configs[0]) for tactic, configs in groups])
    best_first = min((c.median_ms for c in first), default=math.inf)
    rest, promoted, skipped = [], [], 0
    for (tactic, configs), head in zip(groups, first, strict=True):
        # A first configuration that failed says nothing of the others: they are tried.
        contender = head.median_ms <= CONTENDER_RATIO * best_first or math.isinf(head.median_ms)
        if exhaustive or effort >= 2 or contender:
            for config in configs[1:]:
                twin = not exhaustive and unpromoted_twin(config, configs)
                (promoted if twin else rest).append((tactic, config))
        else:
            skipped += len(configs) - 1
    search.score(rest)
    passed = [(c.tactic, c.config) for c in search.candidates if math.isfinite(c.median_ms)]
    needed = [(t, c) for t, c in promoted if (t.key, {**c, "promote": False}) not in passed]
    skipped += len(promoted) - len(needed)
    search.score(needed)
    if device.type == "cpu":
        search.confirm()
    candidates = search.candidates
    best = min(candidates, key=lambda c: c.median_ms)
    if not math.isfinite(best.median_ms):
        notes = "; ".join(f"{c.tactic} {_short(c.config)}: {c.note}" for c in candidates)
        raise TuningError(f"{node.label}: no tactic ran correctly ({notes})")
    return Choice(
        best.tactic, best.config, best.median_ms, candidates, from_cache,
        skipped=skipped, prepare_s=search.prepare_s, timing_s=search.timing_s, candidate_s=search.candidate_s,
        first_run_s=search.first_run_s,
    )  # fmt: skip


def unpromoted_twin(config: dict[str, Any], configs: Sequence[dict[str, Any]]) -> bool:
    """Whether `config` promotes its E4M3 sums (`promote` True, the default) while its twin that leaves them to the
    tensor cores is among `configs`. The promotion only adds work to the same product, so the twin goes first and
    the promoted form is built, checked and timed only where the twin fails (its error past the bound for E4M3
    products, `FP8_PRODUCTS_TOLERANCE`); `precompile` leaves it to the tuning likewise."""
    return config.get("promote", True) and {**config, "promote": False} in configs


def candidate_groups(
    node: Node, opset: int, device: torch.device, effort: int, precisions: Sequence[str], families
) -> Iterator[tuple[Tactic, str, list[dict[str, Any]]]]:
    """What the tuning considers for `node`: per tactic of the allowed `families` (the reference always), either
    (tactic, why it cannot run the node, []) or, per variant, (tactic, "", that variant's configurations of the
    tactic's space at `effort`)."""
    for tactic in tactics_for(node, None):
        if families is not None and tactic.family not in families and tactic.family != "reference":
            continue
        reason = tactic.supports(node, opset, device)
        if reason is not None:
            yield tactic, reason, []
            continue
        space = tactic.space_for(node, effort)
        if not space:
            yield tactic, f"no configuration of its tuning space at effort {effort} fits this layer", []
            continue
        for variant in variants(tactic, node, precisions, device):
            yield tactic, "", [{"precision": variant.precision, "layout": variant.layout, **c} for c in space]


def compile_workers(device: torch.device) -> int:
    """Threads that build and check candidates at once: on CUDA, up to 8, so that compiles of different
    candidates can overlap (as far as Triton's and NVRTC's compilers let go of the GIL: `bench/parallel_compile.py`
    measures it); on the CPU one, as the candidates' first runs compete for the cores."""
    return min(8, os.cpu_count() or 1) if device.type == "cuda" else 1


def build_layer_kernel(
    tactic: Tactic,
    node: Node,
    opset: int,
    device: torch.device,
    config: dict[str, Any],
    constants: ConstantCache,
) -> LayerKernel:
    """`tactic`'s kernel for `node` in the config's variant, its weights converted once (shared via `constants`)."""
    variant = Variant.of(config)
    hidden = ("layout",) if tactic.sees_precision else ("precision", "layout")
    space_config = {k: v for k, v in config.items() if k not in hidden}
    kernel = tactic.build(node, opset, device, space_config)
    constants = prepare_constants(node, variant, device, constants)
    return LayerKernel(
        node,
        kernel,
        variant,
        constants,
        writes_into=tactic.writes_into,
        converts_on_load=tactic.converts_on_load,
        strided_inputs=tactic.strided_inputs,
    )


def _call_key(tactic: str, config: dict[str, Any]) -> tuple[str, str]:
    return tactic, repr(sorted(config.items()))


def _short(config: dict[str, Any]) -> str:
    return "/".join(str(v) for v in config.values())


def _with_constants(node: Node, inputs: Sequence[torch.Tensor | None], device: torch.device) -> list[Any]:
    """`inputs` padded to the node's arity, each constant input taken from the graph (on `device`). A tensor
    given where the node has a constant must have the constant's shape (inputs shifted by a missing None
    would otherwise run as weights)."""
    full = list(inputs) + [None] * (len(node.inputs) - len(inputs))
    for index, value in constant_inputs(node).items():
        const = value.const
        if full[index] is None:
            full[index] = const.to(device) if isinstance(const, torch.Tensor) else const
        elif isinstance(const, torch.Tensor) and tuple(full[index].shape) != tuple(const.shape):
            raise ValueError(
                f"{node.label}: input {index} is the constant {value.name} of shape {list(const.shape)}, got a "
                f"tensor of shape {list(full[index].shape)}: pass None for constant inputs"
            )
    return full


def _quantizes_float_input(node: Node) -> bool:
    """Whether `node` is a quantized layer that quantizes a float input itself."""
    x = node.inputs[0] if node.inputs else None
    return qualified_op(node) in _QUANTIZED_LAYERS and x is not None and x.dtype.is_float


def _is_float_tensor(t: Any) -> bool:
    """A tensor of real values (a float8 tensor holds quantized ones)."""
    return isinstance(t, torch.Tensor) and not is_quantized_tensor(t)


def _activations(node: Node, inputs: Sequence[Any]) -> list[Any]:
    """The call arguments of a `LayerKernel`: the non-constant present inputs, in order."""
    consts = constant_inputs(node)
    return [t for i, (t, v) in enumerate(zip(inputs, node.inputs, strict=True)) if v is not None and i not in consts]


def _reference_outputs(node, opset, inputs, device) -> tuple[torch.Tensor, ...]:
    from .vendor import ReferenceTactic

    declared = [v.dtype if v is not None else DType.UNDEFINED for v in node.inputs]
    plain = [convert(t, d, _REFERENCE_VARIANT) for t, d in zip(inputs, declared, strict=True)]
    with torch.inference_mode(), full_float32():
        return ReferenceTactic().build(node, opset, device, {})(plain)


class _Search:
    """One layer's candidates as they are scored: from the timing cache where it has them; else built, run once
    and checked against the reference by worker threads (that is where kernels compile), then timed in turn
    (timing needs the GPU to itself)."""

    def __init__(self, node, opset, device, inputs, reference, budget, constants, cache, key, description, workers):
        self.node, self.opset, self.device = node, opset, device
        self.args = _activations(node, inputs)
        self.inputs = inputs
        self.reference, self.budget, self.constants = reference, budget, constants
        self._references: dict[str, tuple[torch.Tensor, ...]] = {}  # by tactic key
        self.cache, self.key, self.description = cache, key, description
        self.workers = workers
        self.quantized: dict[int, tuple[float, str]] = {}  # outputs written quantized: (scale, type)
        self.fp8_products = qualified_op(node) in _QUANTIZED_LAYERS and node.attributes.get("quant") == "fp8e4m3"
        self.candidates: list[Candidate] = []
        self.calls: dict[tuple[str, str], Any] = {}  # the timed call of each candidate timed by this search
        self.trials = 0
        self.prepare_s = 0.0
        self.timing_s = 0.0
        self.candidate_s = 0.0
        self.first_run_s = 0.0
        self.fastest_ms = math.inf  # the fastest candidate scored so far (the budget's give-up ratio refers to it)
        self._clock = threading.Lock()  # worker threads add their candidates' times

    def score(self, items: Sequence[tuple[Tactic, dict[str, Any]]]) -> list[Candidate]:
        """The candidates of `items`, in order; they are also added to `candidates`."""
        results: list[Candidate | None] = [None] * len(items)
        pending = []
        for index, (tactic, config) in enumerate(items):
            cached = self.cache.get(self.key, tactic.key, config) if self.cache is not None else None
            if cached is None or (cached.error and context_lost(cached.error)):
                # (a failure filed after another candidate had lost the context says nothing of this one)
                pending.append(index)
                continue
            note = f"cached failure: {cached.error}" if cached.error else "cached"
            results[index] = Candidate(tactic.key, config, cached.median_ms, note)
            self.fastest_ms = min(self.fastest_ms, cached.median_ms)
        started = time.perf_counter()
        prepared = self._prepare([items[index] for index in pending])
        self.prepare_s += time.perf_counter() - started
        started = time.perf_counter()
        for index, (kernel, problem) in zip(pending, prepared, strict=True):
            results[index] = self._time(*items[index], kernel, problem)
        self.timing_s += time.perf_counter() - started
        self.trials += len(pending)
        self.candidates.extend(results)
        return results

    def confirm(self) -> None:
        """Time the fastest few candidates this search timed (up to `CONFIRM_TOP`, within `CONTENDER_RATIO` of
        the best) again, against one another in `CONFIRM_ROUNDS` interleaved rounds, and keep those times (the
        pooled samples, which the timing cache prefers to the first ones). Timed one after another, candidates
        of a layer on a shared CPU see its load change between them; a pick made on such noise has cost a layer
        four times its time. Where the confirmed times came out slower than a candidate left out (the machine's
        load rose), the rounds run again with it and the last rounds' candidates, up to `CONFIRM_PASSES` times, so
        that the winner is one timed against its rivals."""
        rivals: list[int] = []  # the last rounds' candidates (indices into self.candidates)
        for _ in range(CONFIRM_PASSES):
            timed = [
                (index, c)
                for index, c in enumerate(self.candidates)
                if math.isfinite(c.median_ms) and _call_key(c.tactic, c.config) in self.calls
            ]
            timed.sort(key=lambda item: item[1].median_ms)
            if not rivals:
                best = timed[0][1].median_ms if timed else math.inf
                top = [index for index, c in timed[:CONFIRM_TOP] if c.median_ms <= CONTENDER_RATIO * best]
            elif timed[0][0] in rivals:
                return
            else:  # one left out timed faster than the rounds did (the load rose): again, with it
                top = [timed[0][0], *(i for i in rivals if math.isfinite(self.candidates[i].median_ms))][:CONFIRM_TOP]
            if len(top) < 2:
                return
            started = time.perf_counter()
            calls = [self.calls[_call_key(self.candidates[i].tactic, self.candidates[i].config)] for i in top]
            timings = measure_interleaved(calls, device=self.device, rounds=CONFIRM_ROUNDS, **self.budget.as_kwargs())
            self.timing_s += time.perf_counter() - started
            for index, timing in zip(top, timings, strict=True):
                candidate = self.candidates[index]
                if self.cache is not None:
                    self.cache.record(
                        self.key, candidate.tactic, candidate.config, timing, description=self.description
                    )
                note = f"confirmed in {CONFIRM_ROUNDS} interleaved rounds" if timing.ok else f"failed: {timing.error}"
                self.candidates[index] = Candidate(candidate.tactic, candidate.config, timing.median, note)
            rivals = top

    def _prepare(self, items) -> list[tuple[LayerKernel | None, str]]:
        """Each item built and checked, in parallel where it can be. TF32 candidates go one by one afterwards:
        TF32 is a process-wide switch, which would also reach float32 candidates running beside them."""
        prepared: list[tuple[LayerKernel | None, str] | None] = [None] * len(items)
        together = [index for index, (_, config) in enumerate(items) if config["precision"] != "tf32"]
        if self.workers > 1 and len(together) > 1:
            with ThreadPoolExecutor(min(self.workers, len(together)), thread_name_prefix="tensorforge-tune") as pool:
                done = pool.map(lambda index: self._prepare_one(*items[index]), together)
                for index, result in zip(together, done, strict=True):
                    prepared[index] = result
        for index, item in enumerate(items):
            if prepared[index] is None:
                prepared[index] = self._prepare_one(*item)
        return prepared

    def _prepare_one(self, tactic: Tactic, config: dict[str, Any]) -> tuple[LayerKernel | None, str]:
        """The candidate's kernel and "" when it runs correctly; else None or the kernel, and what went wrong."""
        variant = Variant.of(config)
        started = time.perf_counter()
        first_run = 0.0
        try:
            with on_device(self.device):
                kernel = build_layer_kernel(tactic, self.node, self.opset, self.device, config, self.constants)
                with torch.inference_mode(), full_float32():
                    run_started = time.perf_counter()
                    outputs = kernel(self.args)
                    first_run = time.perf_counter() - run_started
                    if tactic.family == "reference" and variant.precision == "fp32":
                        return kernel, ""
                    reference = self._reference_of(tactic, variant.precision)
                    problem = _mismatch(
                        outputs, reference, kernel.out_dtypes, variant, self.quantized, self.fp8_products
                    )
        except Exception as err:  # a failing candidate scores inf; the build goes on, unless nothing more can run
            if context_lost(err):
                raise lost_context_error(self.node, tactic, config, err) from err
            return None, f"failed: {type(err).__name__}: {err}"
        finally:
            with self._clock:
                self.candidate_s += time.perf_counter() - started
                self.first_run_s += first_run
        return kernel, f"wrong result: {problem}" if problem else ""

    def _reference_of(self, tactic: Tactic, precision: str) -> tuple[torch.Tensor, ...]:
        """The reference outputs `tactic`'s kernels in `precision` must match: the layer's, or those of its
        `semantics` node (computed once per tactic, not per configuration).

        A quantized layer that quantizes a float input is the exception: its 16-bit variants read that input
        rounded to 16 bits, and a rounding that carries `x / x_scale` across a boundary of the quantized grid
        moves the element by a whole step (an eighth of its value for E4M3), which no float tolerance bounds;
        their reference quantizes the same 16-bit input."""
        rounded = precision if precision in ("fp16", "bf16") and _quantizes_float_input(self.node) else ""
        key = f"{tactic.key}@{rounded}"
        with _REFERENCE_LOCK:
            if key not in self._references:
                twin = tactic.semantics(self.node)
                if twin is not None:
                    given = zip(tactic.semantic_inputs(self.node, list(self.inputs))[: len(twin.inputs)], twin.inputs,
                                strict=True)  # fmt: skip
                    inputs = [t if v is not None and not v.is_const else None for t, v in given]
                    twin_inputs = _with_constants(twin, inputs, self.device)
                    self._references[key] = _reference_outputs(twin, self.opset, twin_inputs, self.device)
                elif rounded:
                    node = with_float_output(self.node) if self.quantized else self.node
                    consts, dtype = constant_inputs(self.node), PRECISION_DTYPE[rounded]
                    inputs = [
                        t.to(dtype).float() if i not in consts and _is_float_tensor(t) else t
                        for i, t in enumerate(self.inputs)
                    ]
                    self._references[key] = _reference_outputs(node, self.opset, inputs, self.device)
                else:
                    self._references[key] = self.reference
            return self._references[key]

    def _time(self, tactic: Tactic, config, kernel: LayerKernel | None, problem: str) -> Candidate:
        if kernel is None or problem:
            return Candidate(tactic.key, config, math.inf, problem)
        args = self.args

        def call():
            with torch.inference_mode(), full_float32():
                kernel(args)

        give_up_ms = self.budget.give_up_ratio * self.fastest_ms
        try:
            timing = measure(call, device=self.device, give_up_ms=give_up_ms, **self.budget.as_kwargs())
        except ContextLost as err:
            raise lost_context_error(self.node, tactic, config, err) from err
        self.calls[_call_key(tactic.key, config)] = call
        if self.cache is not None:
            self.cache.record(self.key, tactic.key, config, timing, description=self.description)
        if not timing.ok:
            note = f"failed while timed: {timing.error}"
        elif len(timing.samples) == 1 and timing.median > give_up_ms:
            note = f"timed once: over {self.budget.give_up_ratio:g}x the fastest so far"
        else:
            note = ""
        self.fastest_ms = min(self.fastest_ms, timing.median)
        return Candidate(tactic.key, config, timing.median, note)


def lost_context_error(node: Node, tactic: Tactic, config: dict[str, Any], err: BaseException) -> ContextLost:
    """The build's error when candidate (`tactic`, `config`) of `node` has left the CUDA context unusable (`err`)."""
    error = str(err) if isinstance(err, ContextLost) else f"{type(err).__name__}: {first_line(err)}"
    return ContextLost(
        f"{node.label}: candidate {tactic.key} {_short(config)} left this process's CUDA context unusable "
        f"({error}); every later kernel would fail, so the build stops. Rebuild with the family "
        f"{tactic.family!r} left out of the tactic families (`tensorforge build --families`). CUDA reports such "
        "errors late: with CUDA_LAUNCH_BLOCKING=1 set, the candidate named is the one whose kernel faulted."
    )


def _mismatch(
    outputs: Sequence[torch.Tensor],
    reference: Sequence[torch.Tensor],
    expected_dtypes: Sequence[torch.dtype | None],
    variant: Variant,
    quantized: dict[int, tuple[float, str]] | None = None,
    fp8_products: bool = False,
) -> str:
    """What is wrong with `outputs` against `reference` ("" when nothing); `quantized`: the outputs written
    quantized, by index, whose reference is the float value they round (see the module docstring);
    `fp8_products`: the layer multiplies E4M3 values (its outputs are held to at least `FP8_PRODUCTS_TOLERANCE`)."""
    quantized = quantized or {}
    if any(want is not None for want in reference[len(outputs) :]):
        return f"{len(outputs)} outputs, expected {len(reference)}"
    for index, (got, want) in enumerate(zip(outputs, reference, strict=False)):
        if not isinstance(want, torch.Tensor):
            continue
        dtype = expected_dtypes[index] if index < len(expected_dtypes) and expected_dtypes[index] else want.dtype
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != dtype:
            shown = f"{DType.from_torch(got.dtype)}{list(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)
            return f"output {index} is {shown}, expected {DType.from_torch(dtype)}{list(want.shape)}"
        bound = TOLERANCE[variant.precision] if want.dtype == torch.float32 else DTYPE_TOLERANCE.get(want.dtype, 1e-4)
        if fp8_products:
            bound = max(bound, FP8_PRODUCTS_TOLERANCE)
        if index in quantized:
            problem = quantized_mismatch(got, want, *quantized[index], bound)
            if problem:
                return f"output {index} {problem}"
            continue
        if not want.is_floating_point():
            if not torch.equal(got, want):
                return f"output {index} differs"
            continue
        if want.element_size() == 1:  # E4M3 passed on as it is (a max pool's), not rounded here: exactly
            got, want, bound = got.float(), want.float(), 0.0
        error = relative_error(got, want)
        if not error <= bound:
            return f"output {index} relative error {error:.2e} > {bound:g}"
    return ""


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max|got − want| / max|want| over the finite elements of `want`; NaN and ±inf must match exactly
    (inf when they do not, so a half-precision overflow is an error)."""
    wide = torch.promote_types(torch.promote_types(got.dtype, want.dtype), torch.float32)
    got, want = got.to(wide), want.to(wide)  # (a float32 difference is exact to within its own rounding)
    finite = torch.isfinite(want)
    if not finite.all():  # (masked copies only then: this check runs on every candidate a build times)
        nan = torch.isnan(want)
        infinite = ~finite & ~nan
        if not torch.equal(torch.isnan(got), nan) or not torch.equal(got[infinite], want[infinite]):
            return math.inf
        if not finite.any():
            return 0.0
        got, want = got[finite], want[finite]
    elif torch.isnan(got).any():
        return math.inf
    if want.numel() == 0:
        return 0.0
    scale = want.abs().max().item()
    difference = (got - want).abs().max().item()
    if scale == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / scale


def quantized_mismatch(got: torch.Tensor, want: torch.Tensor, scale: float, quant: str, bound: float) -> str:
    """Why quantized `got` is not a rounding of `want / scale` within `bound` (max norm relative) onto the grid
    of `quant` ("" when it is): each element must lie between Q(v − bound·max|v|) and Q(v + bound·max|v|),
    v = want / scale, Q rounding and saturating as the reference does. Non-finite references are skipped."""
    dtype, qmax = KINDS[quant]
    real = want.double() / scale
    finite = torch.isfinite(real)
    if not finite.any():
        return ""
    slack = bound * real[finite].abs().max().item()

    def on_grid(values: torch.Tensor) -> torch.Tensor:
        values = values.clamp(-qmax, qmax) if dtype != torch.int8 else torch.round(values).clamp(-128, 127)
        return values.to(dtype).double() if dtype != torch.int8 else values

    low, high, value = on_grid(real - slack), on_grid(real + slack), got.double()
    wrong = finite & ((value < low) | (value > high))
    count = int(wrong.sum())
    if not count:
        return ""
    first = int(wrong.reshape(-1).nonzero()[0])
    shown = f"{value.reshape(-1)[first].item():g} for {real.reshape(-1)[first].item():.4f}"
    return f"has {count} of {got.numel()} values that are no rounding of the reference within {bound:g} (e.g. {shown})"
