"""`tensorforge inspect model.engine`: print what `runtime.inspect.describe_engine` says about an engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from ..runtime.inspect import (
    build_time_line,
    describe_engine,
    layer_candidates,
    load_for_inspection,
    plan_selection_line,
    quantization_lines,
    sparsity_lines,
)
from .common import out


def inspect_engine(path: Path, as_json: bool, candidates: str | None = None) -> None:
    """Describe the engine file `path` (built on any device) as text or, with `as_json`, as JSON; with
    `candidates`, only every candidate timed for the layers whose name contains it."""
    engine = load_for_inspection(path)
    if candidates is not None:
        _print_candidates(layer_candidates(engine, candidates), candidates, as_json)
        return
    description = describe_engine(engine)
    if as_json:
        print(json.dumps(description, indent=2))
        return
    _print_header(path, description)
    for index, profile in enumerate(description["profiles"]):
        _print_profile(index, profile, description["report"])
    _print_build(description["report"])


def _print_header(path: Path, description: dict[str, Any]) -> None:
    env = description["environment"]
    capability = env["compute_capability"]
    device = f"{env['device_name']} ({f'sm_{capability[0]}{capability[1]}' if capability else env['device_type']})"
    versions = ", ".join(
        f"{label} {env[key]}"
        for label, key in (("tensorforge", "tensorforge_version"), ("torch", "torch_version"),
                           ("CUDA", "cuda_version"), ("triton", "triton_version"))
        if env[key]
    )  # fmt: skip
    out.print(f"{path}  engine built on {device} with {versions}", style="bold")
    if description["runs_here"]:
        out.print("cannot run on this machine: " + "; ".join(description["runs_here"]), style="yellow")
    config = description["config"]
    families = ", ".join(config["tactic_families"]) if config["tactic_families"] else "all"
    out.print(
        f"precisions {', '.join(config['precisions'])}; effort {config['effort']}; tactic families {families}; "
        f"sparsity {config.get('sparsity', 'auto')}; {description['nodes']} nodes"
    )
    table = Table("", "name", "type", box=None)
    for kind in ("inputs", "outputs"):
        for item in description[kind]:
            table.add_row(kind[:-1], item["name"], f"{item['dtype']}{_shape(item['shape'])}")
    out.print(table)
    report = description["report"]
    for note in report.get("notes", []):
        out.print(f"note: {note}", style="yellow")
    optimizer = report.get("optimizer", {})
    if optimizer:
        fired = ", ".join(f"{rule} {count}x" for rule, count in optimizer.get("fired", {}).items())
        out.print(f"graph: {optimizer['nodes_before']} -> {optimizer['nodes_after']} nodes ({fired or 'no fusion'})")


def _print_profile(index: int, profile: dict[str, Any], report: dict[str, Any]) -> None:
    ranges = ", ".join(
        f"{name} {_shape(r['min'])}..{_shape(r['max'])} (opt {_shape(r['opt'])})"
        for name, r in profile["ranges"].items()
    )
    out.print(f"profile {index}: {ranges}", style="bold")
    for layer in profile["layers"]:
        runner_up = layer["runner_up"]
        versus = "only candidate"
        if runner_up is not None:
            ratio = f" ({runner_up['ratio']:.2f}x)" if runner_up["ratio"] is not None else ""
            versus = f"runner-up {runner_up['tactic']} {_config(runner_up['config'])} {runner_up['median_ms']:.4f} ms"
            versus += ratio
        cache = " (timing cache)" if layer["from_cache"] else ""
        out.print(
            f"  [{layer['position']}] {layer['name'] or '(unnamed)'}  {layer['op']}  {layer['tactic']} "
            f"{layer['precision']} {layer['layout']}  {layer['median_ms']:.4f} ms{cache}; {versus}"
        )
        if layer["origins"] and layer["origins"] != [layer["name"]]:
            out.print(f"      from   {', '.join(layer['origins'])}")
        extra = {k: v for k, v in layer["config"].items() if k not in ("precision", "layout")}
        if extra:
            out.print(f"      config {_config(extra)}")
        for item in layer["outputs"]:
            same = f" (= {item['origin']})" if item["origin"] not in (None, item["name"]) else ""
            stored = f" stored {item['stored_dtype']}" if item["stored_dtype"] != item["dtype"] else ""
            arena = (
                f"arena @{item['arena_offset']} +{item['arena_bytes']} B"
                if item["arena_offset"] is not None
                else f"allocated by its kernel ({item['outside_bytes']} B at most)"
                if item.get("outside_bytes") is not None
                else "not in the arena"
            )
            inplace = f" in place of {item['inplace_of']}" if item["inplace_of"] else ""
            if item.get("inside"):
                inside = item["inside"]
                inplace += f" inside {inside['concatenation']} from channel {inside['first_channel']}"
            out.print(
                f"      out    {item['name']}{same}  {item['dtype']}{_shape(item['shape'])}{stored}  {arena}{inplace}"
            )
    out.print(f"  sum of layer times at opt: {profile['total_ms']:.3f} ms")
    line = plan_selection_line(report, index)
    if line:
        out.print(f"  {line}")
    for line in profile["memory"]["report"].splitlines():
        out.print(f"  {line}")


def _print_build(report: dict[str, Any]) -> None:
    for line in quantization_lines(report):
        out.print(line)
    for line in sparsity_lines(report):
        out.print(line)
    out.print(build_time_line(report))


def _config(config: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key}={value}" for key, value in config.items()) + "}" if config else ""


def _shape(shape: list | tuple | None) -> str:
    return "[?]" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _print_candidates(layers: list[dict[str, Any]], name: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(layers, indent=2))
        return
    if not layers:
        out.print(f"no layer's name contains {name!r}", style="yellow")
    for layer in layers:
        chosen = layer["chosen"]
        out.print(
            f"profile {layer['profile']}: {layer['layer']} ({layer['op']}), chosen {chosen['tactic']}", style="bold"
        )
        for c in layer["candidates"]:
            picked = (c["tactic"], c["config"]) == (chosen["tactic"], chosen["config"])
            time = "-" if c["median_ms"] is None else f"{c['median_ms']:.4f} ms"
            ratio = "" if c["ratio"] is None else f"{c['ratio']:.2f}x"
            note = f"  ({c['note'][:160]})" if c["note"] else ""
            out.print(f"{'*' if picked else ' '} {c['tactic']:<30} {time:>11} {ratio:>6}  {_config(c['config'])}{note}",
                      markup=False, soft_wrap=True)  # fmt: skip
