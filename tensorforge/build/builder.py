"""The `Builder`: ONNX model → optimized graph → a tuned plan per optimization profile → `Engine`.

1. Profiles are completed: an input the config does not mention keeps its declared shape, a dynamic dim
   of it is fixed at 1 (said in the report). Dims equal in every profile become static in the graph, so
   constant folding can evaluate the shape arithmetic that depends on them.
2. The graph optimizer runs (`passes.pipeline.optimize`), then registry inference; an int8 / fp8 build then
   quantizes its calibrated layers (`quantize.py`). Quantized layers (calibrated or from the model's Q/DQ)
   may pass quantized activations to each other (`passes.quant_chain`): by default the chained graph is tuned
   too and kept only if its plan times faster end to end (an int8 kernel that reads int8 skips its quantize;
   one that must dequantize or quantize for a float neighbour can cost more than it saves).
3. Per profile, the layers are tuned in schedule order on random inputs of the profile's opt shapes: each
   layer's candidates (tactic × config × precision × layout) are timed on the real outputs of the layers
   already chosen, so a cast or a layout change a candidate needs is part of its measured cost (a greedy
   choice along the schedule). Timings go to the timing cache; a warm cache re-times nothing.
4. The memory plan is made at the profile's max shapes, with the dtypes the chosen layers write, over the
   outputs of the layers whose kernels can write into given buffers (`Tactic.writes_into`); an execution
   context places those in its arena. The others' kernels allocate their outputs, and the plan lists them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError, UnsupportedError
from ..feeds import random_tensor
from ..frontend import load_onnx
from ..ir import DType, Model, Node, Value, format_type
from ..ir.clone import clone_model
from ..ir.serialize import model_to_dict
from ..ir.walk import Walk
from ..kernels.cpu import compile_all as compile_cpu_kernels
from ..kernels.cpu import depthwise_pointwise, squeeze_excite
from ..kernels.cpu.extension import compiler_problem
from ..ops.cuda_graphs import capture
from ..ops.executor import check_supported
from ..ops.infer import infer_model
from ..ops.math_flags import cpu_native_precisions, full_float32
from ..passes.cpu_blocks import CpuKernels, FuseCpuBlocks, FuseCpuExpansions
from ..passes.pipeline import optimize
from ..passes.quant_chain import chain_quantized, chained_values, is_quantized_layer
from ..passes.sparsity import prune_graph_2to4, sparse_layers
from ..quant.lower import restore_float
from ..runtime.engine import Engine
from ..runtime.environment import Environment
from ..runtime.plan import Layer, Plan
from ..runtime.schedule import Schedule
from ..tactics.autotune import (
    CONFIRM_ROUNDS,
    CONFIRM_TOP,
    CONTENDER_RATIO,
    Choice,
    autotune,
    build_layer_kernel,
    compile_workers,
)
from ..tactics.base import all_tactics, tactic_by_key
from ..tactics.precompile import precompile
from ..tactics.sparse import SPARSE_FAMILY
from ..tactics.timing import Timing, TimingBudget, measure, measure_interleaved
from ..tactics.timing_cache import TimingCache, device_key, signature, software_versions
from ..tactics.variant import ConstantCache, has_float_activation, layout_free
from .concat_views import concat_views, prefer_concat_into
from .config import BuildConfig, Profile, QuantizationConfig
from .memory import MemoryPlan, plan_graph
from .quantize import quantize_model

LayerCallback = Callable[[int, int, Node, Choice], None]
SCOPES = ("timed_float", "everything", "faster_in_float")  # `Builder._restore_float_if_faster`'s attempts, in order
_SIDE_BY_SIDE_ROUNDS = 5  # alternating timings of the unchained and the chained plan (`_time_side_by_side`)
# A chained graph that rounds residuals (an approximation, `passes.quant_chain`) must beat the plans it is weighed
# against by this fraction: within the timings' noise it would trade accuracy for nothing (BERT-base int8 on a
# 2-core CPU: its norms' residual streams ran no faster in alternation than the exact chains and doubled the error).
_ROUNDING_MARGIN = 0.02


@dataclass
class _Observed:
    """Every value's shape and dtype (or that it is not a tensor) in one run of a schedule."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, DType] = field(default_factory=dict)
    others: set[str] = field(default_factory=set)  # values that are not tensors


class Builder:
    """Builds engines for one `BuildConfig`. `on_layer(index, count, node, choice)` is called as each layer is
    tuned (for progress bars and build logs)."""

    def __init__(
        self,
        config: BuildConfig,
        *,
        on_layer: LayerCallback | None = None,
        calibration_data: Iterable[Mapping[str, Any]] | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.on_layer = on_layer
        self.calibration_data = calibration_data  # int8 / fp8 builds: batches of feeds (else the config's files)
        self.families = build_families(config)

    def build(self, model: Model | str | os.PathLike[str]) -> Engine:
        """Optimize and tune `model` (an imported `Model` or an ONNX file, which is left untouched)."""
        started = time.perf_counter()
        environment = Environment.current(self.device)
        model = load_onnx(model) if isinstance(model, str | os.PathLike) else clone_model(model)
        check_supported(model)
        _refuse_control_flow(model)
        profiles, notes = complete_profiles(model, self.config.profiles)
        precisions = self.config.precisions
        dropped = [p for p in precisions if p in ("tf32", "fp16", "bf16") and p not in cpu_native_precisions()]
        if self.device.type == "cpu" and dropped:
            halves = [p for p in dropped if p != "tf32"]
            reasons = ["TF32 is a GPU mode"] if "tf32" in dropped else []
            if halves:
                reasons.append(f"this CPU has no {' or '.join(halves)} dot products (emulated, slower than fp32)")
            notes.append(f"{', '.join(dropped)} not tried on the CPU: {'; '.join(reasons)}; those layers are fp32")
            precisions = tuple(p for p in precisions if p not in dropped)
        _specialize(model, profiles)
        # `force` prunes the model as given, before any fusion: the same weights on every device
        pruned = prune_graph_2to4(model) if self.config.sparsity == "force" else []
        model, optimization = optimize(model, device=self.device.type, cpu_kernels=self._cpu_kernels())
        infer_model(model, check=False)
        sparsity = self._sparsity(model, pruned, notes)
        quantization = None
        if self.config.quantized_type is not None:
            quantization = quantize_model(model, self.config, self.device, self.calibration_data)
            infer_model(model, check=False)
        quantization_config = self.config.quantization or QuantizationConfig()
        chain = quantization_config.chain
        # Quantized residuals round values (the X chains are exact, see passes.quant_chain): with an accuracy
        # target, only when its search measured that rounding (it does unless chaining is off); without one, only
        # where the rounding was measured to cost little accuracy (`quant.ROUNDING_LOSS_FACTOR`).
        target = (quantization or {}).get("target")
        rounding = (quantization or {}).get("residual_rounding")
        residuals = target["residuals"] if target is not None else rounding is None or rounding["kept"]
        model, chaining = chain_quantized(model, enabled=chain == "always", residuals=residuals)
        model.graph.sort()
        cache = self._load_cache()
        cached_keys = len(cache)
        constants: ConstantCache = {}
        tuning_started = time.perf_counter()
        tuning = {"prepare_s": 0.0, "timing_s": 0.0, "skipped": 0, "candidate_s": 0.0, "first_run_s": 0.0}
        plans, selections = self._plan_profiles(model, profiles, precisions, cache, constants, tuning)
        unchained = model
        if chain == "auto" and chaining is not None:
            model, plans, selections, chaining = self._chain_if_faster(
                model, profiles, precisions, cache, constants, tuning, plans, selections, residuals
            )
        if chaining is not None:
            chaining["mode"] = chain
            if target is not None and chaining["enabled"]:
                chaining["residuals"] = (
                    "verified: the accuracy-target search rounded the residuals the chained engine adds quantized"
                    if residuals
                    else "float: the accuracy target was verified without quantized residuals"
                )
        if quantization is not None:
            quantization["timed_to_float"] = [_fallback_layers(model, plan) for plan in plans]
            model, plans, selections, blocks = self._restore_float_if_faster(
                model, unchained, profiles, precisions, cache, constants, tuning, plans, selections
            )
            if blocks is not None:
                quantization["float_blocks"] = blocks
            if chaining and chaining.get("chained"):  # a restored stretch no longer passes int8 between its layers
                kept = chained_values(model.graph)
                if kept != chaining["chained"]:
                    chaining["restored_to_float"] = [name for name in chaining["chained"] if name not in kept]
                    chaining["chained"] = kept
        tuning_seconds = time.perf_counter() - tuning_started
        if sparsity is not None:
            sparsity["sparse_kernels"] = [_sparse_kernels(plan) for plan in plans]
        if self.config.timing_cache:
            cache.save(self.config.timing_cache)
        report = {
            "notes": notes,
            "optimizer": {
                "nodes_before": optimization.nodes_before,
                "nodes_after": optimization.nodes_after,
                "fired": _count(event.rule for event in optimization.fired()),
            },
            "quantization": quantization,
            "quantized_activations": chaining,
            "sparsity": sparsity,
            "plan_selection": selections,
            "tuning_seconds": round(tuning_seconds, 3),
            "tuning": {key: round(value, 3) for key, value in tuning.items()},
            "timing_cache": {"path": self.config.timing_cache, "entries_before": cached_keys, "entries": len(cache)},
            "build_seconds": round(time.perf_counter() - started, 3),
        }
        return Engine(model, self.config, plans, environment, report, device=self.device)

    def _sparsity(self, model: Model, pruned: list[str], notes: list[str]) -> dict[str, Any] | None:
        """The report's sparsity section: the mode, the layers `force` pruned to 2:4 and the layers of the
        optimized `model` whose weights have the pattern; None when sparsity is off."""
        mode = self.config.sparsity
        if mode == "off":
            return None
        if pruned:
            notes.append(
                f"sparsity force: {len(pruned)} weights pruned to 2:4 by magnitude; the engine's answers are the "
                "pruned model's, not the original's"
            )
        layers = sparse_layers(model)
        if layers and self.device.type != "cuda":
            notes.append("2:4 sparse kernels run on CUDA (sparse tensor cores): these layers run dense here")
        return {"mode": mode, "pruned": pruned, "layers": layers}

    def _plan_profiles(self, model: Model, profiles, precisions, cache, constants, tuning) -> tuple[list, list]:
        """A tuned plan per profile (layers, memory plan) and each profile's whole-plan selection."""
        plans, selections = [], []
        for profile in profiles:
            greedy = self._tune(model, profile, precisions, cache, constants, tuning)
            layers, selection = self._select(model, profile, greedy, precisions, cache, constants)
            observed = self._observe(model, layers, {name: r.max for name, r in profile.ranges.items()}, constants)
            layers = prefer_concat_into(model, layers, observed.shapes, observed.dtypes)
            memory = _memory_plan(model, layers, observed)
            tuned = {name: r.opt for name, r in profile.ranges.items()}
            plans.append(Plan(profile, tuple(layers), memory, tuned))
            selections.append(selection)
        return plans, selections

    def _chain_if_faster(self, model, profiles, precisions, cache, constants, tuning, plans, selections, residuals):
        """The model and plans with quantized layers chained, when the chained plans time faster in total than
        the unchained ones; else the unchained ones. Returns (model, plans, selections, the report's section).

        Chainings are tried in turn: wherever the graph allows (an int8 kernel that reads int8 skips its quantize
        and can then beat the float original the unchained plan chose); where that rounds residuals, the same
        with residuals float (exact); and only when neither is faster, chaining between the layers every
        unchained plan runs quantized. Of the faster ones the fastest is kept, a chaining that rounds residuals
        counted `_ROUNDING_MARGIN` slower: it must win by more than the timings' noise to pay for its accuracy."""
        quantized = set.intersection(*[_runs_quantized(model, plan) for plan in plans])
        first, attempts, faster = None, [], []
        queue: list[tuple[str, set[int] | None, bool]] = [("everywhere", None, residuals)]
        while queue:
            scope, positions, rounding = queue.pop(0)
            candidate = clone_model(model)
            eligible = None if positions is None else {candidate.graph.nodes[index] for index in positions}
            candidate, section = chain_quantized(candidate, eligible=eligible, residuals=rounding)
            first = first or section
            shape = (len(section["chained"]), len(section.get("quantized_residuals", ())))
            if section["chained"] and not any((a["chained"], a["quantized_residuals"]) == shape for a in attempts):
                chained_plans, chained_selections = self._plan_profiles(
                    candidate, profiles, precisions, cache, constants, tuning
                )
                unchained_ms, chained_ms = self._time_side_by_side(
                    model, plans, candidate, chained_plans, profiles, constants
                )
                margin = _ROUNDING_MARGIN if shape[1] else 0.0
                timed = {"unchained": round(unchained_ms, 5), "chained": round(chained_ms, 5)}
                attempts.append(
                    {"scope": scope, "chained": shape[0], "quantized_residuals": shape[1], "plan_ms": timed,
                     "margin": margin}
                )  # fmt: skip
                if chained_ms < unchained_ms * (1 - margin):
                    kept = (candidate, chained_plans, chained_selections, section)
                    faster.append((chained_ms / (1 - margin), len(attempts) - 1, kept))
            if positions is None and rounding and section.get("quantized_residuals"):
                queue.append(("everywhere, residuals float", None, False))
            elif not queue and not faster and positions is None:
                queue.append(("between the layers the plan runs quantized", quantized, residuals))
        if not attempts:
            return model, plans, selections, first
        if faster:
            _, index, kept = min(faster, key=lambda entry: entry[0])
            kept[3].update({"plan_ms": attempts[index]["plan_ms"], "attempts": attempts})
            return kept
        shown = min(attempts, key=lambda a: a["plan_ms"]["chained"])
        first.update(plan_ms=shown["plan_ms"], attempts=attempts, timed_slower=first.pop("chained"), chained=[])
        return model, plans, selections, first

    def _restore_float_if_faster(
        self, model, unchained, profiles, precisions, cache, constants, tuning, plans, selections
    ):
        """A quantized CPU build keeps its convolutions apart, so that each may be quantized; where every plan runs
        a layer as its float original anyway (the fallback timed faster, as it does for most of a MobileNet's
        layers at batch 1), that layer becomes the float node again (`quant.lower.restore_float`), the CPU block
        fusions may take it, and the plans of that graph are kept if they time faster side by side. On CUDA the
        same without block fusions: the restored layers get the float tactics (cuDNN's fused calls, writes into
        concatenations) that the fallback's dequantized layers lack (ResNet-50's int8 engine at batch 1 ran 0.482
        ms against its fp16 engine's 0.440 with 46 layers on the fallback). Then the same
        with every quantized layer of the model before chaining (`unchained`) restored, kept if faster still: a
        layer timed faster quantized alone, or chained, can cost more in the network by splitting a block the
        float layers fuse (EfficientNet-B0's int8 engine ran 1.03-1.2× slower than its fp32 one so). Both are
        timed whether or not a fusion takes the restored layers: as float nodes they also run the float kernels
        directly and write into their concatenations (the detector's int8 engine ran 1.2× slower than its fp32
        one before). Last, where the all-float plan was not kept, the layers it timed faster than the kept plan
        times them quantized are restored alone, the rest chained as the kept model is (`_faster_in_float`).
        Returns (model, plans, selections, the report's section: each attempt by scope, "timed_float",
        "everything" and "faster_in_float"; None where there was nothing to try)."""
        kernels = self._cpu_kernels(quantized=True)
        families = self.families
        if families is not None and "fallback" not in families:
            return model, plans, selections, None  # (without the fallback family every quantized layer stays so)
        if kernels is None and self.device.type == "cpu":
            return model, plans, selections, None  # (no C++ kernels here: nothing would fuse the restored layers)
        fusions = [FuseCpuBlocks(kernels), FuseCpuExpansions(kernels)] if kernels is not None else []
        floats = set.intersection(*[_runs_float(model, plan) for plan in plans])
        # (the all-float attempt is a float tuning of the whole network: on CUDA a minute at batch 256 from cold,
        # as a TensorRT int8 build times fp16 tactics for every layer; its layer times choose the last attempt's)
        scopes = ("timed_float",) if unchained is model and floats == _quantized_layers(model) else SCOPES
        section: dict[str, Any] = {}
        float_ms: dict[str, float] = {}
        for scope in scopes:
            started = time.perf_counter()
            if scope == "faster_in_float":
                if section.get("everything", {}).get("kept", True):  # (not made, or kept: nothing to mix)
                    continue
                chosen = _faster_in_float(model, plans, unchained, float_ms)
                if not chosen:
                    continue
                base = unchained
            else:
                base, chosen = (model, floats) if scope == "timed_float" else (unchained, _quantized_layers(unchained))
            candidate = clone_model(base)
            restored = restore_float(candidate, [candidate.graph.nodes[index] for index in sorted(chosen)])
            if not restored:
                continue
            if scope == "faster_in_float":  # the layers left quantized pass int8 as the kept model's do
                candidate, _ = chain_quantized(
                    candidate,
                    enabled=bool(chained_values(model.graph)),
                    residuals=any(node.attributes.get("z_scale") for node in model.graph.nodes),
                )
            fused: dict[str, int] = {}
            if fusions:
                candidate, report = optimize(candidate, fusions)
                fused = _count(e.rule for e in report.fired())
            infer_model(candidate, check=False)
            planned = time.perf_counter()
            float_plans, float_selections = self._plan_profiles(
                candidate, profiles, precisions, cache, constants, tuning
            )
            tuned = time.perf_counter()
            before_ms, restored_ms = self._time_side_by_side(model, plans, candidate, float_plans, profiles, constants)
            section[scope] = {
                "restored": len(restored),
                "fused": fused,
                "plan_ms": {"apart": round(before_ms, 5), "fused": round(restored_ms, 5)},
                "kept": restored_ms < before_ms,
                # where the attempt's time went: making the graph, planning (tuning) it, timing both plans
                "seconds": {
                    "graph": round(planned - started, 2),
                    "planning": round(tuned - planned, 2),
                    "timing": round(time.perf_counter() - tuned, 2),
                },
            }
            if scope == "faster_in_float":
                section[scope]["layers"] = restored
            if scope == "everything":
                float_ms = _layer_ms(candidate, float_plans)
            if section[scope]["kept"]:
                model, plans, selections = candidate, float_plans, float_selections
        return model, plans, selections, section or None

    def _time_side_by_side(self, model, plans, other, other_plans, profiles, constants) -> tuple[float, float]:
        """Total milliseconds of `plans` (of `model`) and of `other_plans` (of `other`) over the profiles at their
        opt shapes, each the median of `_SIDE_BY_SIDE_ROUNDS` rounds timed in alternation, so that a noisy
        machine slows both alike (one timing each decided ResNet-50's chain wrongly on a shared CPU)."""
        budget = TimingBudget.for_effort(self.config.effort)
        totals = [0.0, 0.0]
        for profile, plan, other_plan in zip(profiles, plans, other_plans, strict=True):
            shapes = {n: r.opt for n, r in profile.ranges.items()}
            feeds = {v.name: t for v, t in _random_inputs(model, shapes, self.device).items()}
            schedules = [
                Schedule(model, list(plan.layers), self.device, constants),
                Schedule(other, list(other_plan.layers), self.device, constants),
            ]
            rounds: list[list[float]] = [[], []]
            for _ in range(_SIDE_BY_SIDE_ROUNDS):
                for side, schedule in enumerate(schedules):
                    rounds[side].append(_time_schedule(schedule, feeds, self.device, budget).median)
            for side in (0, 1):
                totals[side] += sorted(rounds[side])[len(rounds[side]) // 2]
        return totals[0], totals[1]

    def _load_cache(self) -> TimingCache:
        path = self.config.timing_cache
        return TimingCache.load(path) if path and Path(path).exists() else TimingCache()

    def _cpu_kernels(self, quantized: bool = False) -> CpuKernels | None:
        """What our CPU kernels for fused blocks evaluate, where this build can use them, else None. A quantized
        build keeps the convolutions apart, each of which may be quantized (`quantized`: ask for the kernels
        anyway, for the layers it runs in float, `_restore_float_if_faster`)."""
        families = self.families
        if self.device.type != "cpu" or (families is not None and "cpu" not in families):
            return None
        if self.config.quantized_type is not None and not quantized:
            return None
        if depthwise_pointwise.problem() or compiler_problem():
            return None
        return CpuKernels(convolution=depthwise_pointwise.ACTIVATIONS, gate=squeeze_excite.ACTIVATIONS)

    def _tune(self, model: Model, profile: Profile, precisions, cache: TimingCache, constants, tuning) -> list[Layer]:
        """Each layer's fastest candidate on the real outputs of the layers chosen before it; `tuning` adds up
        where the time went."""
        graph = model.graph
        nodes = graph.nodes
        env: dict[Value, Any] = dict(_random_inputs(model, {n: r.opt for n, r in profile.ranges.items()}, self.device))
        families = self.families
        if self.device.type == "cpu" and self.config.precompile and (families is None or "cpu" in families):
            started = time.perf_counter()
            compile_cpu_kernels()
            tuning["precompile_s"] = tuning.get("precompile_s", 0.0) + time.perf_counter() - started
        if self.device.type == "cuda" and self.config.precompile:
            done = precompile(
                model, dict(env), self.device, effort=self.config.effort, precisions=precisions,
                families=self.families, constants=constants, workers=compile_workers(self.device),
                cache=cache,
            )  # fmt: skip
            tuning["precompile_s"] = tuning.get("precompile_s", 0.0) + done.seconds
            tuning["precompiled"] = tuning.get("precompiled", 0) + done.submitted
            if done.stopped:
                tuning["precompile_stopped"] = done.stopped
        walk = Walk(nodes, env, set(graph.outputs))
        layers = []
        for index, node in enumerate(nodes):
            inputs = [None if v is None or v.is_const else env[v] for v in node.inputs]
            opset = model.opset(node.domain)
            choice = autotune(
                node,
                opset,
                inputs,
                self.device,
                effort=self.config.effort,
                precisions=precisions,
                families=self.families,
                cache=cache,
                constants=constants,
            )
            kernel = build_layer_kernel(
                tactic_by_key(choice.tactic), node, opset, self.device, choice.config, constants
            )
            with torch.inference_mode(), full_float32():
                outputs = kernel(
                    [t for v, t in zip(node.inputs, inputs, strict=True) if v is not None and not v.is_const]
                )
            walk.after(index, outputs)
            tuning["prepare_s"] += choice.prepare_s
            tuning["timing_s"] += choice.timing_s
            tuning["skipped"] += choice.skipped
            tuning["candidate_s"] += choice.candidate_s
            tuning["first_run_s"] += choice.first_run_s
            candidates = tuple(choice.candidates)
            layers.append(Layer(index, choice.tactic, choice.config, choice.median_ms, candidates, choice.from_cache))
            if self.on_layer is not None:
                self.on_layer(index, len(nodes), node, choice)
        return layers

    def _select(self, model: Model, profile: Profile, greedy: list[Layer], precisions, cache, constants):
        """The fastest of the greedy plan and the uniform plans (every layer's best candidate in one precision
        and layout), each timed end to end at the opt shapes (replaying a CUDA graph on CUDA); the timings
        are kept in the timing cache like the layers'.

        The greedy choice can get stuck: at batch 1 a float32 graph input makes fp32 the cheapest first layer,
        and each next layer then avoids the cast. Timing whole plans sees the cast is paid only once.
        """
        options = {"greedy": greedy}
        nodes = [model.graph.nodes[layer.node] for layer in greedy]
        traits = [(has_float_activation(node), layout_free(node)) for node in nodes]
        for precision in precisions:
            for layout in ("NCHW", "NHWC"):
                options[f"{precision} {layout}"] = [
                    _uniform(layer, precision, layout, floats, any_layout)
                    for layer, (floats, any_layout) in zip(greedy, traits, strict=True)
                ]
        distinct: dict[tuple, str] = {}
        for name, layers in options.items():
            distinct.setdefault(tuple((layer.tactic, str(layer.config)) for layer in layers), name)
        feeds = {
            v.name: t
            for v, t in _random_inputs(model, {n: r.opt for n, r in profile.ranges.items()}, self.device).items()
        }
        budget = TimingBudget.for_effort(self.config.effort)
        graph_digest = hashlib.sha256(json.dumps(model_to_dict(model)[0], sort_keys=True).encode()).hexdigest()
        timings, keys, fresh, schedules = {}, {}, set(), {}

        def schedule_of(name: str) -> Schedule:  # each plan's kernels built once, whoever times or records it
            if name not in schedules:
                schedules[name] = Schedule(model, options[name], self.device, constants)
            return schedules[name]

        for signature_items, name in distinct.items():
            keys[name] = signature(
                device_key(self.device), software_versions(), "tensorforge::Plan",
                [list(t.shape) for t in feeds.values()], [t.dtype for t in feeds.values()], None,
                {"graph": graph_digest, "layers": [list(item) for item in signature_items]},
            )  # fmt: skip
            cached = cache.get(keys[name], "plan", {})
            if cached is None:
                timing = _time_schedule(schedule_of(name), feeds, self.device, budget)
                cached = cache.record(keys[name], "plan", {}, timing)
                fresh.add(name)
            timings[name] = cached.median_ms
        confirmed = self._confirm_plans(schedule_of, timings, keys, fresh, feeds, budget, cache)
        best = min(timings, key=timings.get)
        selection = {"chosen": best, "ms": {name: round(ms, 5) for name, ms in timings.items()}}
        if confirmed:
            selection["confirmed"] = confirmed
        _, problem = _recorded(schedule_of(best), feeds, self.device)
        selection["cuda_graph" if self.device.type == "cuda" else "cpu_graph"] = problem or "captured"
        return options[best], selection

    def _confirm_plans(self, schedule_of, timings, keys, fresh, feeds, budget, cache) -> list[str]:
        """On the CPU, the plans within `CONTENDER_RATIO` of the fastest (up to `CONFIRM_TOP`, one of them timed in
        this build) timed again against one another in `CONFIRM_ROUNDS` interleaved rounds; their times in
        `timings` and the cache replaced by those. Timed one after another, the plans of a build on a shared CPU see
        its load change between them (the layers' own candidates are confirmed likewise, `autotune`). Returns the
        names confirmed."""
        if self.device.type != "cpu":
            return []
        ranked = sorted((name for name in timings if math.isfinite(timings[name])), key=timings.get)
        top = [name for name in ranked[:CONFIRM_TOP] if timings[name] <= CONTENDER_RATIO * timings[ranked[0]]]
        if len(top) < 2 or not fresh.intersection(top):
            return []
        calls = []
        for name in top:
            schedule = schedule_of(name)
            replay, _ = _recorded(schedule, feeds, self.device)
            calls.append(replay or functools.partial(schedule.execute, feeds))
        confirmed = []
        for name, timing in zip(
            top,
            measure_interleaved(calls, device=self.device, rounds=CONFIRM_ROUNDS, **budget.as_kwargs()),
            strict=True,
        ):
            if timing.ok:
                timings[name] = cache.record(keys[name], "plan", {}, timing).median_ms
                confirmed.append(name)
        return confirmed

    def _observe(self, model: Model, layers: list[Layer], shapes, constants) -> _Observed:
        """Run `layers` once at `shapes` (the profile's max) and record what every value becomes."""
        schedule = Schedule(model, layers, self.device, constants)
        observed = _Observed()
        feeds = _random_inputs(model, shapes, self.device)
        for value, tensor in feeds.items():
            _record(observed, value, tensor)
        schedule.execute({v.name: t for v, t in feeds.items()}, observe=lambda v, t: _record(observed, v, t))
        return observed


def _uniform(layer: Layer, precision: str, layout: str, floats: bool = True, any_layout: bool = False) -> Layer:
    """`layer`'s fastest candidate in `precision` (or fp32 where it has none) and `layout` (or "any"); in any
    precision for a layer without float activations (`floats` False: no neighbour sees its precision), in either
    layout for a layer whose activations are the same memory in both (`any_layout`, `variant.layout_free`)."""
    finite = [c for c in layer.candidates if math.isfinite(c.median_ms)]
    layouts = ("NCHW", "NHWC") if any_layout else (layout,)
    for wanted_precision, wanted_layouts in (
        (precision, layouts),
        (precision, ("any",)),
        ("fp32", layouts),
        ("fp32", ("any",)),
    ):
        matching = [
            c
            for c in finite
            if c.config.get("layout") in wanted_layouts
            and (not floats or c.config.get("precision") == wanted_precision)
        ]
        if matching:
            best = min(matching, key=lambda c: c.median_ms)
            return Layer(layer.node, best.tactic, best.config, best.median_ms, layer.candidates, layer.from_cache)
    return layer


def _recorded(schedule: Schedule, feeds, device: torch.device) -> tuple[Callable[[], Any] | None, str | None]:
    """A replay of `schedule` on `feeds` recorded as an execution context records it (a CUDA graph, a CPU graph),
    or None and why it cannot be: then every run of the engine is eager, the Python of every layer each time,
    which at batch 1 can cost more than the kernels. The plans are timed the way they will run."""
    run = functools.partial(schedule.execute, feeds)
    run()  # warm-up, as a context runs before it records: cuDNN and cuBLAS pick their kernels, weights are packed
    try:
        if device.type == "cuda":
            graph, _ = capture(run)
        else:
            graph, _ = schedule.record(feeds)
    except Exception as err:  # e.g. a kernel that reads a value back to the host or copies from pageable memory
        return None, f"not recordable, runs eagerly: {type(err).__name__}: {str(err)[:300]}"
    return graph.replay, None


def _time_schedule(schedule: Schedule, feeds, device: torch.device, budget: TimingBudget) -> Timing:
    """Median milliseconds of one run of `schedule` (a graph replay where it can be recorded)."""
    replay, _ = _recorded(schedule, feeds, device)
    return measure(replay or functools.partial(schedule.execute, feeds), device=device, **budget.as_kwargs())


def complete_profiles(model: Model, profiles: tuple[Profile, ...]) -> tuple[list[Profile], list[str]]:
    """Every profile with a range for every input; the notes say which dynamic dims were fixed at 1."""
    graph = model.graph
    inputs = [v for v in graph.inputs if v.name not in graph.initializers]
    names = {v.name for v in inputs}
    notes: list[str] = []
    completed = []
    for index, profile in enumerate(profiles or (Profile(),)):
        unknown = sorted(set(profile.ranges) - names)
        if unknown:
            raise InputError(f"profile {index} names {unknown}, which are not inputs of the model ({sorted(names)})")
        for value in inputs:
            shape_range = profile.ranges.get(value.name)
            if shape_range is None:
                fixed = _default_shape(value, notes)
                profile = profile.add(value.name, fixed, fixed, fixed)
            else:
                _check_declared(value, shape_range.min, shape_range.max)
        completed.append(profile)
    return completed, sorted(set(notes))


def _default_shape(value: Value, notes: list[str]) -> tuple[int, ...]:
    if value.shape is None:
        raise InputError(
            f"input {value.name!r} has no declared shape: give its shapes with --profile {value.name}=MIN:OPT:MAX "
            "(e.g. 1x3x224x224:8x3x224x224:32x3x224x224)"
        )
    if not value.dtype.has_torch or not (value.dtype.is_float or value.dtype.is_integer or value.dtype == DType.BOOL):
        raise UnsupportedError(f"input {value.name!r} is {value.dtype}: engines take numeric tensor inputs only")
    dynamic = [axis for axis, d in enumerate(value.shape) if not isinstance(d, int)]
    if dynamic:
        notes.append(
            f"input {value.name!r} ({format_type(value.dtype, value.shape)}): dynamic axes {dynamic} fixed at 1; "
            f"give --profile {value.name}=MIN:OPT:MAX for other sizes"
        )
    return tuple(d if isinstance(d, int) else 1 for d in value.shape)


def _check_declared(value: Value, low: tuple[int, ...], high: tuple[int, ...]) -> None:
    if value.shape is None:
        return
    if len(value.shape) != len(low):
        raise InputError(
            f"the profile for {value.name!r} has rank {len(low)}, the model declares "
            f"{format_type(value.dtype, value.shape)} (rank {len(value.shape)})"
        )
    for axis, declared in enumerate(value.shape):
        if isinstance(declared, int) and not low[axis] == high[axis] == declared:
            raise InputError(
                f"the profile for {value.name!r} gives axis {axis} the range {low[axis]}..{high[axis]}, but the "
                f"model fixes it at {declared} ({format_type(value.dtype, value.shape)}); export the model with "
                "that axis dynamic to vary it"
            )


def _specialize(model: Model, profiles: list[Profile]) -> None:
    """Make static every input dim that all profiles fix to one size, then re-infer shapes."""
    for value in model.graph.inputs:
        ranges = [p.ranges[value.name] for p in profiles if value.name in p.ranges]
        if not ranges:
            continue
        rank = len(ranges[0].min)
        dims = []
        for axis in range(rank):
            sizes = {r.min[axis] for r in ranges} | {r.max[axis] for r in ranges}
            declared = value.shape[axis] if value.shape is not None and len(value.shape) == rank else None
            dims.append(sizes.pop() if len(sizes) == 1 else declared or f"{value.name}_{axis}")
        value.shape = tuple(dims)
    infer_model(model, check=False)


def _memory_plan(model: Model, layers: list[Layer], observed) -> MemoryPlan:
    """The arena for `layers` (at the shapes and dtypes one run `observed`), with the tensors their producers can
    write inside the concatenations reading them placed there (`concat_views`). Outputs of the layers whose tactics
    allocate them (not `writes_into`) stay outside; those of a tactic with `arena_for_concatenations` go in only as
    such views."""
    outside, only_as_views = set(), set()
    for layer in layers:
        tactic = tactic_by_key(layer.tactic)
        names = {v.name for v in model.graph.nodes[layer.node].outputs if v.name}
        if tactic is None or not tactic.writes_into:
            outside |= names
        elif tactic.arena_for_concatenations:
            only_as_views |= names
    return plan_graph(
        model.graph,
        observed.shapes,
        dtypes=observed.dtypes,
        exclude=observed.others,
        outside=outside,
        views=concat_views(model, layers, observed.shapes, observed.dtypes),
        only_as_views=only_as_views,
    )


def _quantized_layers(model: Model) -> set[int]:
    """The positions of `model`'s quantized layers."""
    return {index for index, node in enumerate(model.graph.nodes) if is_quantized_layer(node)}


def _runs_quantized(model: Model, plan: Plan) -> set[int]:
    """The positions of the quantized layers that `plan` runs with quantized arithmetic (not a float fallback)."""
    nodes = model.graph.nodes
    return {
        layer.node
        for layer in plan.layers
        if is_quantized_layer(nodes[layer.node]) and not layer.tactic.startswith("fallback.")
    }


def _layer_key(node: Node) -> str:
    """What names a layer across graphs rewritten from one model (node names may be empty): the original value its
    output stands for."""
    out = node.outputs[0]
    return out.origin or out.name


def _layer_ms(model: Model, plans: list[Plan], positions: set[int] | None = None) -> dict[str, float]:
    """The tuned time of each layer (of those at `positions`; None: all), by `_layer_key`, summed over the plans
    (one per profile)."""
    nodes = model.graph.nodes
    total: dict[str, float] = {}
    for plan in plans:
        for layer in plan.layers:
            if positions is None or layer.node in positions:
                key = _layer_key(nodes[layer.node])
                total[key] = total.get(key, 0.0) + layer.median_ms
    return total


def _faster_in_float(model: Model, plans: list[Plan], unchained: Model, float_ms: dict[str, float]) -> set[int]:
    """The positions in `unchained` of the quantized layers to restore to float: all but those that `plans` (of
    `model`) run quantized faster than the all-float plans ran them (`float_ms`, by `_layer_key`). A narrow
    layer's float form can beat its int8 one where the wide layers around it gain (the detector's 16-channel 1×1
    layers ran 1.6× their fp16 time in int8). Empty where that restores nothing new, or everything."""
    running = set.intersection(*[_runs_quantized(model, plan) for plan in plans])
    quantized_ms = _layer_ms(model, plans, running)
    kept = {key for key, ms in quantized_ms.items() if ms <= float_ms.get(key, math.inf)}
    if not kept or len(kept) == len(quantized_ms):
        return set()
    return {
        index
        for index, node in enumerate(unchained.graph.nodes)
        if is_quantized_layer(node) and _layer_key(node) not in kept
    }


def _runs_float(model: Model, plan: Plan) -> set[int]:
    """The positions of the quantized layers that `plan` runs as their float originals (a float fallback)."""
    nodes = model.graph.nodes
    return {
        layer.node
        for layer in plan.layers
        if is_quantized_layer(nodes[layer.node]) and layer.tactic.startswith("fallback.")
    }


def _fallback_layers(model: Model, plan: Plan) -> list[str]:
    """The quantized layers of `plan` that run as their float originals because that timed faster."""
    nodes = model.graph.nodes
    return [nodes[layer.node].name for layer in plan.layers if layer.tactic.startswith("fallback.")]


def build_families(config: BuildConfig) -> tuple[str, ...] | None:
    """The tactic families a build may use (None: all): the config's, less the sparse family when sparsity is
    off."""
    if config.sparsity != "off":
        return config.tactic_families
    chosen = config.tactic_families or tuple(dict.fromkeys(t.family for t in all_tactics()))
    return tuple(family for family in chosen if family != SPARSE_FAMILY)


def _sparse_kernels(plan: Plan) -> list[int]:
    """The nodes `plan` runs on a 2:4 sparse kernel."""
    return [layer.node for layer in plan.layers if layer.tactic.split(".")[0] == SPARSE_FAMILY]


def _refuse_control_flow(model: Model) -> None:
    nodes = [node for node in model.graph.nodes if any(True for _ in node.subgraphs())]
    if nodes:
        shown = ", ".join(node.label for node in nodes[:5])
        raise UnsupportedError(
            f"engines do not run control flow yet; the model has {len(nodes)} node(s) with subgraphs ({shown}). "
            "Run it with the executor (`tensorforge run model.onnx`) instead."
        )


def _random_inputs(model: Model, shapes: Mapping[str, tuple[int, ...]], device: torch.device) -> dict[Value, Any]:
    rng = np.random.default_rng(0)
    graph = model.graph
    return {
        v: random_tensor(v.dtype, tuple(shapes[v.name]), rng).to(device)
        for v in graph.inputs
        if v.name not in graph.initializers
    }


def _record(tuning: _Observed, value: Value, tensor: Any) -> None:
    if not value.name:
        return
    if isinstance(tensor, torch.Tensor):
        tuning.shapes[value.name] = tuple(tensor.shape)
        tuning.dtypes[value.name] = DType.from_torch(tensor.dtype)
    else:
        tuning.others.add(value.name)


def _count(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def build_engine(model: Model | str | os.PathLike[str], config: BuildConfig | None = None, **options: Any) -> Engine:
    """`Builder(config or BuildConfig(**options)).build(model)`."""
    return Builder(config if config is not None else BuildConfig(**options)).build(model)
