"""Compiling every layer's candidates in one pool before the layers are tuned (CUDA).

The autotuner prepares one layer's candidates at a time: its worker threads compile them together and the layer
waits for the slowest before it is timed, so a build costs about one slowest compile per layer and round. What a
kernel compiles to depends on its layer's shapes, types and strides, not on the values, so this pass walks the
graph once with the reference kernels (from the same random inputs the tuning starts from) and hands each layer's
compiling candidates (the Triton and NVRTC families, and the float fallback on their kernels: every variant,
every configuration of their spaces at the build's effort, but only the first in float32, and no promoted twin of
an E4M3 configuration) to one pool of threads, many layers at a time. The tuning that follows finds the kernels in
Triton's and NVRTC's caches and only runs, checks and times them. Nothing here decides anything: a candidate that
fails is left for the tuning to meet and report, and a layer the reference cannot run ends the pass early.
Candidates the build's timing cache already holds are left out: the tuning takes their times from it and builds
only the winner, so a rebuild with an earlier build's cache compiles one kernel a layer instead of every candidate
(before, it compiled them all: about half of a cold fp16 ResNet-50 build).

TF32 variants are left out: TF32 is a process-wide switch, which would reach the float32 candidates compiling and
running beside them (the tuning prepares them alone).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from ..ir import Model, Node, Value
from ..ir.walk import Walk
from ..kernels.quantize import KINDS
from ..ops.math_flags import full_float32
from .autotune import (
    build_layer_kernel,
    candidate_groups,
    layer_key,
    lost_context_error,
    on_device,
    unpromoted_twin,
)
from .base import Tactic, tactic_by_key
from .timing import ContextLost, context_lost
from .timing_cache import TimingCache
from .variant import PRECISION_DTYPE, ConstantCache

COMPILING_FAMILIES = ("triton", "gluon", "cuda")
_LAYERS_IN_FLIGHT = 24  # layers whose candidates may be queued at once (they hold their inputs until compiled)
# the activation type each precision a build allows may hand a layer (the timing cache keys its inputs' types)
_ACTIVATION_TYPES = {**PRECISION_DTYPE, "int8": KINDS["int8"][0], "fp8": KINDS["fp8e4m3"][0]}


@dataclass(frozen=True)
class Precompiled:
    """What the pass did: its wall time, the candidates it compiled, and where it stopped early ("" if not)."""

    seconds: float
    submitted: int
    stopped: str = ""


def precompile(
    model: Model,
    env: dict[Value, Any],
    device: torch.device,
    *,
    effort: int,
    precisions: Sequence[str],
    families: Sequence[str] | None,
    constants: ConstantCache,
    workers: int,
    cache: TimingCache | None = None,
) -> Precompiled:
    """Compile the compiling candidates of every layer of `model` (its graph inputs in `env`, which this pass
    consumes), but those `cache` already holds timings of (`_likely_keys`): the tuning takes those from the cache
    and builds only the layer's winner, so a rebuild with the cache of an earlier build compiles a kernel a layer,
    not every candidate."""
    started = time.perf_counter()
    nodes = model.graph.nodes
    walk = Walk(nodes, env, set(model.graph.outputs))
    reference = tactic_by_key("reference.registry")
    layers: deque[list[Future]] = deque()
    submitted, stopped = 0, ""
    with ThreadPoolExecutor(workers, thread_name_prefix="tensorforge-precompile") as pool:
        for index, node in enumerate(nodes):
            opset = model.opset(node.domain)
            try:
                args = [env[v] for v in node.inputs if v is not None and not v.is_const]
                candidates = list(_compiling(node, opset, device, effort, precisions, families))
                if cache and candidates:  # a cache with timings in it
                    inputs = [None if v is None or v.is_const else env[v] for v in node.inputs]
                    keys = _likely_keys(node, inputs, device, precisions)
                    candidates = [(t, c) for t, c in candidates if all(cache.get(k, t.key, c) is None for k in keys)]
                if candidates:
                    if len(layers) >= _LAYERS_IN_FLIGHT:
                        _raise_lost_context(layers.popleft())
                    layers.append(
                        [pool.submit(_compile, t, node, opset, device, c, constants, args) for t, c in candidates]
                    )
                    submitted += len(candidates)
                kernel = build_layer_kernel(reference, node, opset, device, {"precision": "fp32"}, constants)
                with torch.inference_mode(), full_float32():
                    outputs = kernel(args)
            except ContextLost:
                raise
            except Exception as err:  # the tuning runs this layer its own way; the later layers compile there
                stopped = f"{node.label}: {type(err).__name__}: {err}"
                break
            walk.after(index, outputs)
    for futures in layers:  # (a stop may have come from a candidate's lost context: that is the error to raise)
        _raise_lost_context(futures)
    env.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the candidates' outputs: the tuning starts with the memory it had
    return Precompiled(time.perf_counter() - started, submitted, stopped)


def _raise_lost_context(futures: Sequence[Future]) -> None:
    """Wait for one layer's compilations; raise the `ContextLost` of one that left the CUDA context unusable."""
    wait(futures)
    for future in futures:
        if isinstance(future.exception(), ContextLost):
            raise future.exception()


def _likely_keys(
    node: Node, inputs: Sequence[torch.Tensor | None], device: torch.device, precisions: Sequence[str]
) -> set[str]:
    """The timing-cache keys the tuning may file `node` under. The key holds the types and memory format of the
    layer's inputs as the layers chosen before it deliver them, which this pass (reference outputs, float32) cannot
    know: every float input in each type the build's precisions give, all in one memory format, contiguous or
    channels_last. A miss only leaves a candidate to the tuning to compile."""
    keys = set()
    for dtype in {_ACTIVATION_TYPES[p] for p in precisions if p in _ACTIVATION_TYPES}:
        for channels_last in (False, True):
            shaped = [_shaped(t, dtype, channels_last) if isinstance(t, torch.Tensor) else t for t in inputs]
            keys.add(layer_key(node, shaped, device))
    return keys


def _shaped(tensor: torch.Tensor, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """A storage-free tensor of `tensor`'s shape: of `dtype` where `tensor` is float, channels_last if asked and
    4-D."""
    layout = torch.channels_last if channels_last and tensor.dim() == 4 else torch.contiguous_format
    dtype = dtype if tensor.is_floating_point() else tensor.dtype
    return torch.empty(tensor.shape, dtype=dtype, device="meta", memory_format=layout)


def _compiling(
    node: Node, opset: int, device: torch.device, effort: int, precisions: Sequence[str], families
) -> Iterator[tuple[Tactic, dict[str, Any]]]:
    """The (tactic, config) pairs the tuning will consider for `node` whose kernels compile (the compiling
    families), TF32 variants aside, and of a float32 variant only the first configuration (the tuning's first
    round runs it; on a GPU float32 is rarely within reach of 16 bits for its second round, and when it is, the
    tuning compiles the rest itself)."""
    for tactic, reason, configs in candidate_groups(node, opset, device, effort, precisions, families):
        if reason or configs[0]["precision"] == "tf32":
            continue
        configs = [config for config in configs if _compiles(tactic, config)]
        for config in configs[:1] if configs and configs[0]["precision"] == "fp32" else configs:
            if not unpromoted_twin(config, configs):  # (the tuning builds it where its twin fails)
                yield tactic, config


def _compiles(tactic: Tactic, config: dict[str, Any]) -> bool:
    """Whether the candidate's kernels compile: a compiling family's, or the float fallback's on an inner kernel of
    one (a quantized depthwise layer's fallback on our Triton or NVRTC depthwise kernel)."""
    inner = tactic_by_key(config["inner"]) if "inner" in config else None
    return (inner or tactic).family in COMPILING_FAMILIES


def _compile(tactic: Tactic, node: Node, opset: int, device: torch.device, config, constants, args) -> None:
    """Build and run one candidate once, which compiles its kernels into the caches; its failures are the
    tuning's to report, but for one that leaves the CUDA context unusable (`ContextLost`)."""
    try:
        with on_device(device), torch.inference_mode(), full_float32():
            build_layer_kernel(tactic, node, opset, device, config, constants)(args)
    except Exception as err:  # met again, and reported, when the layer is tuned, unless nothing more can run
        if context_lost(err):
            raise lost_context_error(node, tactic, config, err) from err
