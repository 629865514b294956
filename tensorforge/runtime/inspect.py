"""What an engine is made of, as plain data: per layer the original nodes it fused, its tactic and config,
precision, layout, outputs (shape, dtype, arena slot), time and runner-up; then the build report.

`load_for_inspection` reads an engine file without checking it against this machine, so an engine built
on a GPU can be inspected on a laptop; such an engine can be described but not run.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..errors import UnsupportedError
from ..ir import DType, Value, qualified_op
from ..tactics.autotune import Candidate
from ..tactics.fallback import output_quantization
from ..tactics.variant import Variant, output_dtypes
from .engine import Engine
from .environment import Environment, compatibility_problems
from .plan import Layer, Plan


def load_for_inspection(path: str | os.PathLike[str]) -> Engine:
    """The engine in `path`, its weights on the CPU, whatever device it was built for (not for running)."""
    return Engine.load(path, check_environment=False)


def describe_engine(engine: Engine) -> dict[str, Any]:
    """A JSON-ready description of `engine` (see the module docstring)."""
    graph = engine.model.graph
    return {
        "environment": engine.environment.to_dict(),
        "runs_here": _problems_here(engine),
        "config": engine.config.to_dict(),
        "inputs": [_tensor(v) for v in graph.inputs if v.name not in graph.initializers],
        "outputs": [_tensor(v) for v in graph.outputs],
        "nodes": len(graph),
        "profiles": [_profile(engine, plan) for plan in engine.plans],
        "report": engine.report,
    }


def layer_candidates(engine: Engine, name: str) -> list[dict[str, Any]]:
    """Every candidate the build timed for each layer whose node name contains `name` (each profile), fastest
    first, with its time against the fastest and why it did not run; empty when no layer's name matches."""
    found = []
    for index, plan in enumerate(engine.plans):
        for layer in plan.layers:
            node = engine.model.graph.nodes[layer.node]
            if name not in node.name:
                continue
            ranked = sorted(layer.candidates, key=lambda c: c.median_ms)
            best = ranked[0].median_ms if ranked and math.isfinite(ranked[0].median_ms) else math.nan
            rows = [
                {**c.to_dict(), "ratio": c.median_ms / best if math.isfinite(c.median_ms) and best > 0 else None}
                for c in ranked
            ]
            chosen = {"tactic": layer.tactic, "config": layer.config}
            found.append(
                {"profile": index, "layer": node.name, "op": node.op_type, "chosen": chosen, "candidates": rows}
            )
    return found


def _profile(engine: Engine, plan: Plan) -> dict[str, Any]:
    memory = plan.memory
    return {
        "ranges": plan.profile.to_dict(),
        "tuned_shapes": {name: list(shape) for name, shape in plan.tuned_shapes.items()},
        "total_ms": plan.total_ms,
        "memory": {
            "arena_bytes": memory.arena_bytes,
            "naive_bytes": memory.naive_bytes,
            "lower_bound_bytes": memory.lower_bound_bytes,
            "alignment": memory.alignment,
            "tensors": len(memory.offsets),
            "inplace": len(memory.inplace),
            "report": memory.report(),
        },
        "layers": [_layer(engine, plan, position, layer) for position, layer in enumerate(plan.layers)],
    }


def _layer(engine: Engine, plan: Plan, position: int, layer: Layer) -> dict[str, Any]:
    node = engine.model.graph.nodes[layer.node]
    stored = output_dtypes(node, Variant.of(layer.config))
    outputs = []
    for value, dtype in zip(node.outputs, stored, strict=True):
        if not value.name:
            continue
        entry = _tensor(value)
        entry["stored_dtype"] = str(DType.from_torch(dtype)) if dtype is not None else entry["dtype"]
        entry["arena_offset"] = plan.memory.offsets.get(value.name)
        entry["arena_bytes"] = plan.memory.sizes.get(value.name)
        entry["inplace_of"] = plan.memory.inplace.get(value.name)
        view = plan.memory.views.get(value.name)
        entry["inside"] = {"concatenation": view[0], "first_channel": view[1]} if view else None
        entry["outside_bytes"] = plan.memory.outside.get(value.name)
        outputs.append(entry)
    runner_up = _runner_up(layer)
    return {
        "position": position,
        "node": layer.node,
        "name": node.name,
        "op": qualified_op(node),
        "origins": list(node.origins),
        "tactic": layer.tactic,
        "config": layer.config,
        "precision": _math(node, layer),
        "layout": layer.layout,
        "median_ms": layer.median_ms,
        "from_cache": layer.from_cache,
        "runner_up": None
        if runner_up is None
        else {
            "tactic": runner_up.tactic,
            "config": runner_up.config,
            "median_ms": runner_up.median_ms,
            "ratio": runner_up.median_ms / layer.median_ms if layer.median_ms > 0 else None,
        },
        "candidates": len(layer.candidates),
        "outputs": outputs,
    }


def _math(node, layer: Layer) -> str:
    """The layer's arithmetic: its variant's precision, or for a quantized layer its quantized type (with the
    activation scale; "from int8" when its input comes quantized, "-> int8" with the output scale when it writes
    a quantized output), or the float precision it fell back to; a layer norm that writes its quantized readers'
    input says so ("fp16 -> int8 (y_scale s)", "and fp16" when it writes Y too)."""
    quant = node.attributes.get("quant") if node.op_type in ("QuantizedConv", "QuantizedGemm") else None
    if quant is None:
        written = output_quantization(node).get(0)  # a layer norm writing its quantized readers' input
        if written is None:
            return layer.precision
        beside = f" and {layer.precision}" if len(node.outputs) > 1 else ""
        return f"{layer.precision} -> {written[1]} (y_scale {written[0]:.4g}){beside}"
    source = node.inputs[0].dtype
    reads = f" from {source}" if source in (DType.INT8, DType.FLOAT8E4M3FN) else ""
    y_scale = node.attributes.get("y_scale", 0.0)
    writes = f"{quant} (y_scale {y_scale:.4g})" if y_scale else layer.precision
    if layer.tactic.startswith("fallback."):
        return f"{layer.precision} (float fallback of {quant}{reads})" + (f" -> {writes}" if y_scale else "")
    per_channel = len(node.inputs) > 5 and node.inputs[5] is not None
    scale = "x_scale per channel" if per_channel else f"x_scale {node.attributes['x_scale']:.4g}"
    return f"{quant} ({scale}){reads} -> {writes}"


def _runner_up(layer: Layer) -> Candidate | None:
    """The fastest timed candidate other than the chosen one."""
    others = [
        c
        for c in layer.candidates
        if math.isfinite(c.median_ms) and (c.tactic, c.config) != (layer.tactic, layer.config)
    ]
    return min(others, key=lambda c: c.median_ms, default=None)


def _tensor(value: Value) -> dict[str, Any]:
    shape = None if value.shape is None else list(value.shape)
    return {"name": value.name, "origin": value.origin, "dtype": str(value.dtype), "shape": shape}


def _problems_here(engine: Engine) -> list[str]:
    """Why this engine cannot run on this machine (empty when it can)."""
    try:
        here = Environment.current(engine.config.device)
    except UnsupportedError as error:
        return [str(error)]
    return compatibility_problems(engine.environment, here)


def plan_selection_line(report: dict[str, Any], index: int) -> str | None:
    """The build report's whole-plan timings of profile `index` as one line, or None when none were taken."""
    selection = report.get("plan_selection", [])
    if index >= len(selection):
        return None
    confirmed = selection[index].get("confirmed", [])
    timed = ", ".join(
        f"{name} {ms:.3f} ms{' (interleaved)' if name in confirmed else ''}"
        for name, ms in selection[index]["ms"].items()
    )
    line = f"whole plans timed at opt: {timed}; chosen: {selection[index]['chosen']}"
    for kind in ("cuda", "cpu"):
        graph = selection[index].get(f"{kind}_graph")
        if graph:
            return f"{line}; {kind.upper()} graph: {graph}"
    return line


def build_time_line(report: dict[str, Any]) -> str:
    """How long the build took and where the tuning time went, and the timing cache it used, as one line."""
    line = f"built in {report.get('build_seconds', 0):.1f} s, tuning {report.get('tuning_seconds', 0):.1f} s"
    tuning = report.get("tuning", {})
    if tuning:
        line += (
            f" ({tuning['prepare_s']:.1f} s building, compiling and checking candidates, {tuning['timing_s']:.1f} s"
            f" timing them; {tuning['skipped']} configurations of slower tactics not tried)"
        )
        if tuning.get("precompiled"):
            line += f"; first {tuning['precompiled']} candidates compiled in one pool in {tuning['precompile_s']:.1f} s"
        if tuning.get("precompile_stopped"):
            line += f" (that pass stopped early at {tuning['precompile_stopped']})"
        if tuning.get("candidate_s"):  # engines built before these were recorded lack them
            line += (
                f"; the candidates' own preparation {tuning['candidate_s']:.1f} s in all, first runs (compiles)"
                f" {tuning['first_run_s']:.1f} s of it"
            )
    cache = report.get("timing_cache", {})
    if cache.get("path"):
        line += f"; timing cache {cache['path']}: {cache['entries_before']} -> {cache['entries']} entries"
    return line


def sparsity_lines(report: dict[str, Any]) -> list[str]:
    """The build report's sparsity section as lines: weights pruned, layers with the 2:4 pattern, and how many of
    those each plan runs on a sparse kernel; none when no layer has the pattern."""
    section = report.get("sparsity")
    if not section or not section["layers"]:
        return []
    lines = []
    if section["pruned"]:
        lines.append(f"sparsity force: {len(section['pruned'])} weights pruned to 2:4 (the answers change)")
    running = ", ".join(str(len(nodes)) for nodes in section.get("sparse_kernels", []))
    lines.append(
        f"2:4 sparse weights: {len(section['layers'])} layers; on sparse kernels: {running or 0} (per profile)"
    )
    return lines


def quantization_lines(report: dict[str, Any]) -> list[str]:
    """The build report's quantization section as lines: scales, layers quantized, float layers and why."""
    section = report.get("quantization")
    if not section:
        return chain_lines(report)  # an explicitly quantized model: no calibration, maybe chained layers
    lines = [
        f"{section['type']}: {len(section['quantized'])} layers quantized, {len(section['float'])} float "
        f"(scales from {section['scales']})"
    ]
    tried = dict(section.get("calibrators") or {})
    if tried:
        metric = tried.pop("metric")
        scores = ", ".join(f"{label} {value:.5f}" for label, value in tried.items())
        lines.append(f"calibrators compared by {metric} with float, every layer quantized: {scores}")
    channels = section.get("per_channel_inputs")
    if channels:
        lines.append(f"depthwise convolution inputs quantized per channel: {len(channels)}")
    target = section.get("target")
    if target:
        verdict = "met" if target["met"] else "NOT met"
        residuals = ", quantized residuals rounded" if target.get("residuals") else ""
        lines.append(
            f"accuracy target {target['metric']} >= {target['value']}: {verdict} ({target['achieved']:.5f}; every "
            f"layer quantized: {target['all_quantized']:.5f}{residuals})"
        )
    lines += [f"  float: {name}: {why}" for name, why in section["float"].items()]
    rounding = section.get("residual_rounding")
    if rounding:
        verdict = "may round them" if rounding["kept"] else "adds them in float"
        if "why" in rounding:
            lines.append(f"residual streams: {rounding['why']}; the engine {verdict}")
        else:
            lines.append(
                f"residual streams: rounding {rounding['residuals']} residual(s) loses "
                f"{rounding['cosine_loss_rounded']} of cosine against quantization's {rounding['cosine_loss_exact']} "
                f"on the calibration data: the engine {verdict}"
            )
    lines += chain_lines(report)
    for index, names in enumerate(section.get("timed_to_float", [])):
        if names:
            lines.append(
                f"profile {index}: {len(names)} quantized layers run as their float originals, which timed faster: "
                + ", ".join(names)
            )
    for scope, tried in (section.get("float_blocks") or {}).items():
        which = {
            "timed_float": "the layers timed faster in float",
            "everything": "every quantized layer",
            "faster_in_float": "the layers the all-float plan ran faster",
        }[scope]
        fused = ", ".join(f"{count} {rule}" for rule, count in (tried.get("fused") or {}).items()) or "nothing"
        line = f"{which} restored to float ({tried['restored']}; fused: {fused})"
        if tried.get("plan_ms"):  # (keys of the first reports: "fused" is the restored plan, "apart" the other)
            ms = tried["plan_ms"]
            line += f": {ms['fused']:.3f} ms against {ms['apart']:.3f} ms, " + ("kept" if tried["kept"] else "not kept")
        else:
            line += ": not timed"
        if tried.get("seconds"):
            line += " ({graph:.1f} s making the graph, {planning:.1f} s planning it, {timing:.1f} s timing)".format(
                **tried["seconds"]
            )
        lines.append(line)
    return lines


def chain_lines(report: dict[str, Any]) -> list[str]:
    """The build report's chaining of quantized layers (`passes.quant_chain`) as lines: how many activations
    travel quantized, and why the quantized layers that could write for quantized readers write float."""
    chain = report.get("quantized_activations") or {}
    if not chain.get("enabled"):
        return []
    lines = [
        f"{len(chain['chained'])} activations pass quantized between quantized layers; "
        f"{len(chain['float'])} quantized layers write float for quantized readers"
    ]
    timed = chain.get("plan_ms")
    if timed:
        if chain["chained"]:
            verdict = "kept"
        elif chain.get("restored_to_float"):
            verdict = f"kept, then restored to float with its layers ({len(chain['restored_to_float'])} activations)"
        else:
            verdict = f"not kept ({len(chain.get('timed_slower', []))} activations)"
        lines.append(
            f"  chained plan {timed['chained']:.3f} ms against {timed['unchained']:.3f} ms unchained: {verdict}"
        )
        for attempt in chain.get("attempts", ()):
            rounds = attempt.get("quantized_residuals")
            held = f", rounds {rounds} residual(s): held to a {attempt['margin']:.0%} margin" if rounds else ""
            lines.append(f"  tried {attempt['scope']}: {attempt['plan_ms']['chained']:.3f} ms{held}")
    if chain.get("quantized_residuals"):
        lines.append(f"  residuals added from quantized values: {', '.join(chain['quantized_residuals'])}")
    if chain.get("residuals"):
        lines.append(f"  residuals: {chain['residuals']}")
    return lines + [f"  writes float: {name}: {why}" for name, why in chain["float"].items()]
