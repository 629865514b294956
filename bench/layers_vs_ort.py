"""Which layers we lose on against ONNX Runtime on the CPU: for one zoo model, every layer of a tensorforge engine
beside the ONNX Runtime nodes that compute the same ONNX nodes, per-layer median times from both profilers, the
biggest losses first.

Ours: `profile_engine` (the engine's CPU graph replayed, each layer's calls timed). ONNX Runtime: its CPU provider at
its default graph optimizations with `enable_profiling`, each node's `*_kernel_time` events. Both run in this process
with the same intra-op thread count, in alternating rounds (ONNX Runtime first in even rounds, ours first in odd
ones), each round `--warmup` untimed and `--runs` timed runs; a layer's or node's time is the median over the rounds of
its per-round medians. ONNX Runtime always runs the fp32 model, whatever `--precision` our engine is built in.
Both profilers cost something. Ours times each layer's recorded calls in a replay, a few µs of Python a layer.
ONNX Runtime's times its nodes' kernels, and on two threads their sum exceeded a whole unprofiled run (MobileNetV3:
9.74 ms of nodes against runs of 8.55): so an unprofiled session runs in the same rounds, and the part of the node
sum beyond its run, spread over the nodes, is taken off each row in the last two columns (a lower bound of the
profiler's share: what it adds between nodes is not in the node times). On one thread the node sum was below the
run and nothing is taken off. Ratios under about 1.2× on sub-millisecond layers are level.

Mapping: each of our layers lists the ONNX nodes it fused (`Node.origins`). ONNX Runtime fuses too and renames what
it fuses, so its nodes are mapped through the optimized graph it writes (`ort_coverage`): a node is anchored on the
ONNX node of its name, on the producer of the value it is named after (its NCHWc convolutions are named
"<output value>_nchwc", the value before the activation it fused), on the producer of an output it shares with the
model, or on what its consumers are anchored on (a HardSwish it inlined as an unnamed HardSigmoid and Mul); an anchor
that is no convolution or product takes in the Conv/Gemm/MatMul chain behind it (Conv → BatchNormalization → Relu),
and ONNX nodes left over (a fused activation or residual Add) go with their latest input's producer. ONNX Runtime's
layout conversions (ReorderInput/ReorderOutput) stand for no ONNX node and get rows of their own, as does a node that
cannot be anchored. A row is one of our layers with the ONNX Runtime nodes that cover its ONNX nodes; where one of
theirs spans several of our layers, those layers share a row.

    python bench/layers_vs_ort.py --model mobilenetv3 --runs 20 --out DIR   (writes DIR/layers-MODEL.json and .md)
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import suite
from tensorforge import zoo
from tensorforge.onnxruntime_session import runtime
from tensorforge.runtime.engine import Engine
from tensorforge.runtime.profiler import LayerProfile, profile_engine

KERNEL_TIME = "_kernel_time"  # suffix of ONNX Runtime's per-node profile events
LAYOUT_OPS = frozenset({"ReorderInput", "ReorderOutput"})  # ONNX Runtime's NCHWc conversions: no ONNX node behind
HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "Gemm", "MatMul", "MatMulInteger"})


# -- the ONNX model's dataflow ----------------------------------------------------------------------------------


def onnx_label(node: onnx.NodeProto) -> str:
    """How tensorforge names an ONNX node in `Node.origins`: its name, else "Op(first output)"
    (as `passes.base._label`)."""
    return node.name or f"{node.op_type}({next((v for v in node.output if v), '?')})"


class Dataflow:
    """An ONNX graph's nodes by label, in order, with who produces and who reads each value; `dynamic` holds the
    values computed from the graph inputs (not from weights alone)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.order = [onnx_label(node) for node in graph.node]
        self.position = {label: i for i, label in enumerate(self.order)}
        self.op = {label: node.op_type for label, node in zip(self.order, graph.node, strict=True)}
        self.inputs = {label: [v for v in node.input if v] for label, node in zip(self.order, graph.node, strict=True)}
        self.producer = {v: label for label, node in zip(self.order, graph.node, strict=True) for v in node.output if v}
        self.consumers: dict[str, list[str]] = defaultdict(list)
        for label in self.order:
            for value in self.inputs[label]:
                self.consumers[value].append(label)
        weights = {init.name for init in graph.initializer}
        self.dynamic = {v.name for v in graph.input if v.name not in weights}
        for label, node in zip(self.order, graph.node, strict=True):
            if any(v in self.dynamic for v in self.inputs[label]):
                self.dynamic.update(v for v in node.output if v)

    def computed_inputs(self, label: str) -> list[str]:
        """The inputs of `label` that another node computes from the graph inputs."""
        return [v for v in self.inputs[label] if v in self.dynamic and v in self.producer]


# -- ONNX Runtime nodes -> ONNX nodes ---------------------------------------------------------------------------


def _ort_graph_nodes(optimized: onnx.GraphProto, profiled: Sequence[tuple[str, str]]) -> dict[str, onnx.NodeProto]:
    """The optimized graph's node behind each profiled (name, op): by name, or for an unnamed node (the profile calls
    it "Op_<index>") the k-th unnamed node of that op, both lists being in execution (topological) order."""
    named = {node.name: node for node in optimized.node if node.name}
    unnamed: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in optimized.node:
        if not node.name:
            unnamed[node.op_type].append(node)
    taken: Counter[str] = Counter()
    found = {}
    for name, op in profiled:
        if name in named:
            found[name] = named[name]
        elif taken[op] < len(unnamed[op]):
            found[name] = unnamed[op][taken[op]]
            taken[op] += 1
    return found


def _name_anchor(name: str, flow: Dataflow) -> str | None:
    """The ONNX node an ONNX Runtime node's name points at: a node of that name, or the producer of the value it is
    named after (NCHWc nodes: "<value>_nchwc"), also without the "_token_<n>" ONNX Runtime adds to make names unique."""
    for candidate in dict.fromkeys([name, re.sub(r"_token_\d+$", "", name)]):
        if candidate in flow.op:
            return candidate
        value = candidate.removesuffix("_nchwc")
        if value in flow.producer:
            return flow.producer[value]
    return None


def ort_coverage(
    original: onnx.ModelProto, optimized: onnx.ModelProto, profiled: Sequence[tuple[str, str]]
) -> dict[str, list[str]]:
    """For each profiled ONNX Runtime node (name, op, in execution order), the labels of the ONNX nodes of `original`
    it computes, in the model's order; empty for a layout conversion or a node that cannot be anchored (see the
    module docstring)."""
    flow = Dataflow(original.graph)
    nodes = _ort_graph_nodes(optimized.graph, profiled)
    ops = dict(profiled)
    anchors: dict[str, str] = {}
    for name, op in profiled:
        if op in LAYOUT_OPS:
            continue
        anchor = _name_anchor(name, flow)
        if anchor is None and name in nodes:
            anchor = next((flow.producer[v] for v in nodes[name].output if v in flow.producer), None)
        if anchor is not None:
            anchors[name] = anchor
    # nodes of ONNX Runtime's own making (an inlined function's parts): anchored where all their readers are
    readers: dict[str, list[str]] = defaultdict(list)
    for name, node in nodes.items():
        for value in node.input:
            readers[value].append(name)
    for name, _ in reversed(profiled):
        if name in anchors or ops[name] in LAYOUT_OPS or name not in nodes:
            continue
        found = {anchors.get(reader) for output in nodes[name].output for reader in readers[output]}
        if len(found) == 1 and None not in found:
            anchors[name] = found.pop()

    owners: dict[str, set[str]] = defaultdict(set)  # ONNX node label -> the ONNX Runtime nodes computing it
    for name, anchor in anchors.items():
        owners[anchor].add(name)
    for name, anchor in anchors.items():  # a fused convolution named after its BatchNormalization or Relu
        if flow.op[anchor] not in HEAVY_OPS:
            for label in _heavy_chain(anchor, flow, owners):
                owners[label].add(name)
    for label in flow.order:  # what is left (a fused activation, a residual Add): with its latest input's producer
        if label in owners:
            continue
        sources = [flow.producer[v] for v in flow.computed_inputs(label) if flow.producer[v] in owners]
        if sources:
            owners[label] = set(owners[max(sources, key=flow.position.__getitem__)])
    covered: dict[str, list[str]] = {name: [] for name, _ in profiled}
    for label in flow.order:
        for name in sorted(owners.get(label, ())):
            covered[name].append(label)
    return covered


def _heavy_chain(anchor: str, flow: Dataflow, owners: Mapping[str, set[str]]) -> list[str]:
    """The unowned nodes from `anchor` back to the Conv/Gemm/MatMul it follows through single-reader values (that
    node included), or none where no such node is reached."""
    chain, at = [], anchor
    while True:
        computed = flow.computed_inputs(at)
        if len(computed) != 1 or len(flow.consumers[computed[0]]) != 1:
            return []
        at = flow.producer[computed[0]]
        if at in owners:
            return []
        chain.append(at)
        if flow.op[at] in HEAVY_OPS:
            return chain


# -- rows: our layers with the ONNX Runtime nodes that cover the same ONNX nodes ---------------------------------


@dataclass(frozen=True)
class OurLayer:
    """One layer of our engine: its node's name and op, its tactic, the ONNX nodes it fused."""

    name: str
    op: str
    tactic: str
    origins: tuple[str, ...]


@dataclass
class Row:
    """Our layers and ONNX Runtime's nodes over one set of ONNX nodes, with their summed median times."""

    layers: list[str]  # our layers' node names
    layer_ops: list[str]
    tactics: list[str]
    ort_nodes: list[str]
    ort_ops: list[str]
    onnx_nodes: list[str]  # in the model's order
    op_kinds: str  # the ONNX nodes' op types with counts (ONNX Runtime's ops for a row of theirs alone)
    ours_ms: float
    ort_ms: float
    rounds_ms: dict[str, list[float]] = field(default_factory=dict)  # each round's sum, "ours" and "ort"

    @property
    def delta_ms(self) -> float:
        return self.ours_ms - self.ort_ms

    @property
    def ratio(self) -> float | None:
        return self.ours_ms / self.ort_ms if self.ort_ms > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "delta_ms": self.delta_ms, "ratio": self.ratio}


def _op_kinds(ops: Iterable[str]) -> str:
    counts = Counter(ops)
    return ", ".join(op if n == 1 else f"{n} {op}" for op, n in counts.items())


def group_rows(
    layers: Sequence[OurLayer],
    ours_rounds: Sequence[Sequence[float]],
    ort_ops: Mapping[str, str],
    ort_rounds: Sequence[Mapping[str, float]],
    coverage: Mapping[str, Sequence[str]],
    flow: Dataflow,
) -> list[Row]:
    """Rows of our layers, each round's per-layer medians `ours_rounds`, and ONNX Runtime's
    nodes (`ort_ops`: name -> op), each round's per-node medians, grouped where they cover the same ONNX nodes
    (`coverage`: ONNX Runtime node -> ONNX nodes), sorted by ours − ORT descending."""
    parent: dict[tuple[str, Any], tuple[str, Any]] = {}

    def find(item: tuple[str, Any]) -> tuple[str, Any]:
        parent.setdefault(item, item)
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    layers_of: dict[str, list[int]] = defaultdict(list)
    for position, layer in enumerate(layers):
        find(("ours", position))
        for label in layer.origins:
            layers_of[label].append(position)
    for name in ort_ops:
        find(("ort", name))
        for label in coverage.get(name, ()):
            for position in layers_of.get(label, ()):
                parent[find(("ort", name))] = find(("ours", position))
    groups: dict[tuple[str, Any], list[tuple[str, Any]]] = defaultdict(list)
    for item in list(parent):
        groups[find(item)].append(item)

    rows = []
    for items in groups.values():
        ours = sorted(position for kind, position in items if kind == "ours")
        members = {name for kind, name in items if kind == "ort"}
        theirs = [name for name in ort_ops if name in members]  # in execution order
        labels = {label for p in ours for label in layers[p].origins} | {label for n in theirs for label in coverage[n]}
        onnx_nodes = sorted(labels, key=lambda label: flow.position.get(label, len(flow.order)))
        ours_per_round = [sum(medians[p] for p in ours) for medians in ours_rounds]
        ort_per_round = [sum(medians.get(n, 0.0) for n in theirs) for medians in ort_rounds]
        kinds = [flow.op[label] for label in onnx_nodes if label in flow.op] or [ort_ops[n] for n in theirs]
        rows.append(
            Row(
                layers=[layers[p].name for p in ours],
                layer_ops=[layers[p].op for p in ours],
                tactics=[layers[p].tactic for p in ours],
                ort_nodes=theirs,
                ort_ops=[ort_ops[n] for n in theirs],
                onnx_nodes=onnx_nodes,
                op_kinds=_op_kinds(kinds),
                ours_ms=sum(statistics.median(r[p] for r in ours_rounds) for p in ours),
                ort_ms=sum(statistics.median(r.get(n, 0.0) for r in ort_rounds) for n in theirs),
                rounds_ms={"ours": ours_per_round, "ort": ort_per_round},
            )
        )
    return sorted(rows, key=lambda row: -row.delta_ms)


# -- measuring both ----------------------------------------------------------------------------------------------


def ort_session(proto: onnx.ModelProto, threads: int, profile_in: Path | None = None) -> Any:
    """An ONNX Runtime CPU session at the default graph optimizations with `threads` intra-op threads; with
    `profile_in`, profiling into that folder, where it also writes its optimized graph (ort-optimized.onnx)."""
    ort = runtime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # not the warning that an NCHWc-optimized model is specific to this CPU
    if profile_in is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_in / "ort-profile")
        options.optimized_model_filepath = str(profile_in / "ort-optimized.onnx")
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_runs(trace: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, float]], list[float], list[tuple[str, str]]]:
    """From an ONNX Runtime profile: per model run, each node's kernel time in ms (summed where it ran more than
    once); each run's whole time in ms; every node's (name, op) in execution order."""
    windows = sorted(
        (event["ts"], event["dur"]) for event in trace if event.get("cat") == "Session" and event["name"] == "model_run"
    )
    starts = [start for start, _ in windows]
    runs: list[dict[str, float]] = [defaultdict(float) for _ in windows]
    ops: dict[str, str] = {}
    for event in sorted(trace, key=lambda event: event.get("ts", 0)):
        if event.get("cat") != "Node" or not event["name"].endswith(KERNEL_TIME):
            continue
        name = event["name"].removesuffix(KERNEL_TIME)
        ops.setdefault(name, event["args"]["op_name"])
        runs[bisect.bisect_right(starts, event["ts"]) - 1][name] += event["dur"] / 1e3
    return [dict(run) for run in runs], [duration / 1e3 for _, duration in windows], list(ops.items())


def our_layers(engine: Engine, profile: LayerProfile) -> list[OurLayer]:
    """The profiled layers, in schedule order, with the ONNX nodes each fused."""
    nodes = engine.model.graph.nodes
    return [OurLayer(layer.name, layer.op, layer.tactic, tuple(nodes[layer.node].origins)) for layer in profile.layers]


def measure(
    proto: onnx.ModelProto,
    engine: Engine,
    feeds: Mapping[str, torch.Tensor],
    *,
    runs: int,
    warmup: int,
    rounds: int,
    threads: int,
    end_to_end: bool = True,
) -> dict[str, Any]:
    """Profile `engine` and ONNX Runtime on `proto` in alternating rounds with the same `feeds` and thread count, and
    group their times (`group_rows`); with `end_to_end`, also time both whole, unprofiled (`interleaved_ms`)."""
    torch.set_num_threads(threads)
    arrays = {name: tensor.numpy() for name, tensor in feeds.items()}
    ours: list[LayerProfile] = []
    plain_ms: list[float] = []  # ONNX Runtime unprofiled, in the same rounds: what its profiler adds
    plain = ort_session(proto, threads)
    with tempfile.TemporaryDirectory() as scratch:
        session = ort_session(proto, threads, profile_in=Path(scratch))
        for index in range(rounds):
            for system in ("ort", "ours", "plain") if index % 2 == 0 else ("plain", "ours", "ort"):
                time.sleep(suite.SETTLE_S)  # ONNX Runtime's threads stop spinning before ours start
                if system == "ort":
                    for _ in range(warmup + runs):
                        session.run(None, arrays)
                elif system == "plain":
                    for _ in range(warmup):
                        plain.run(None, arrays)
                    for _ in range(runs):
                        started = time.perf_counter()
                        plain.run(None, arrays)
                        plain_ms.append((time.perf_counter() - started) * 1e3)
                else:
                    ours.append(profile_engine(engine, feeds, runs=runs, warmup=warmup))
        trace = json.loads(Path(session.end_profiling()).read_text())
        optimized = onnx.load(os.path.join(scratch, "ort-optimized.onnx"))
    per_run, run_ms, profiled = ort_runs(trace)
    if len(per_run) != rounds * (warmup + runs):
        raise RuntimeError(f"ONNX Runtime's profile holds {len(per_run)} runs, not {rounds * (warmup + runs)}")
    timed = [i for i in range(len(per_run)) if i % (warmup + runs) >= warmup]
    ort_rounds = []
    for r in range(rounds):
        round_runs = [per_run[i] for i in timed[r * runs : (r + 1) * runs]]
        ort_rounds.append({name: statistics.median(run.get(name, 0.0) for run in round_runs) for name, _ in profiled})
    ours_rounds = [[layer.median_ms for layer in profile.layers] for profile in ours]
    coverage = ort_coverage(proto, optimized, profiled)
    flow = Dataflow(proto.graph)
    rows = group_rows(our_layers(engine, ours[0]), ours_rounds, dict(profiled), ort_rounds, coverage, flow)
    ort_profiled_run_ms = statistics.median(run_ms[i] for i in timed)
    ort_plain_run_ms = statistics.median(plain_ms)
    # What ONNX Runtime's node times hold of its profiler's cost, at least: the part of their sum beyond a whole
    # unprofiled run, spread over the nodes (MobileNetV3 on 2 threads: nodes 9.74 ms against runs of 8.55)
    overhead_ms = max(sum(row.ort_ms for row in rows) - ort_plain_run_ms, 0.0) / max(len(profiled), 1)
    totals = {
        "ours_ms": sum(row.ours_ms for row in rows),
        "ort_ms": sum(row.ort_ms for row in rows),
        "ours_profiled_run_ms": statistics.median(profile.run_ms for profile in ours),
        "ort_profiled_run_ms": ort_profiled_run_ms,
        "ort_plain_run_ms": ort_plain_run_ms,
        "ort_profiler_ms_per_node": overhead_ms,
        "ours_layers": len(ours[0].layers),
        "ort_nodes": len(profiled),
        "ort_only_ms": sum(row.ort_ms for row in rows if not row.layers),  # layout conversions, unmapped nodes
        "ort_nodes_unmapped": [name for name, op in profiled if not coverage[name] and op not in LAYOUT_OPS],
        "profile_mode": ours[0].mode,
    }
    if end_to_end:
        context = engine.create_context()
        calls = {"ours": lambda: context.run(feeds), "ort": lambda: plain.run(None, arrays)}
        whole = suite.interleaved_ms(calls, torch.device("cpu"), runs * rounds, warmup)
        for system, ms in whole.items():
            if isinstance(ms, Exception):
                raise ms
            totals[f"{system}_end_to_end_ms"] = ms
    rows_out = [_less_profiler(row.to_dict(), overhead_ms) for row in rows]
    return {"totals": totals, "rows": rows_out, "coverage": coverage}


def _less_profiler(row: dict[str, Any], overhead_ms: float) -> dict[str, Any]:
    """`row` with ONNX Runtime's time less its profiler's cost for the row's nodes, and our time against that."""
    less = max(row["ort_ms"] - overhead_ms * len(row["ort_nodes"]), 0.0)
    row["ort_less_profiler_ms"] = less
    row["ratio_less_profiler"] = row["ours_ms"] / less if row["layers"] and less > 0 else None
    return row


# -- report ------------------------------------------------------------------------------------------------------


def _where(row: Mapping[str, Any]) -> str:
    """A short name for a row: the common path of its ONNX nodes and their count, or ONNX Runtime's node name."""
    names = row["onnx_nodes"] or row["ort_nodes"]
    if len(names) == 1:
        return names[0]
    parts = [name.split("/")[:-1] for name in names]
    common = next((i for i, part in enumerate(zip(*parts, strict=False)) if len(set(part)) > 1), min(map(len, parts)))
    if common:
        return f"{'/'.join(parts[0][:common])}/… ({len(names)} nodes)"
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} … ({len(names)} nodes)"


def markdown(result: Mapping[str, Any], title: str, top: int) -> str:
    """The `top` rows (biggest losses first) and the totals as markdown."""
    totals = result["totals"]
    lines = [
        f"# {title}",
        "",
        "| # | where (ONNX nodes) | our layers | op kinds | ORT nodes | ours ms | ORT ms | ours / ORT "
        "| ours − ORT ms | ORT less its profiler ms | ours / that |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for index, row in enumerate(result["rows"][:top], 1):
        layers = "; ".join(op.split("::")[-1] for op in row["layer_ops"]) or "— (ORT only)"
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}×"
        less = "-" if row["ratio_less_profiler"] is None else f"{row['ratio_less_profiler']:.2f}×"
        lines.append(
            f"| {index} | {_where(row)} | {layers} | {row['op_kinds']} | {len(row['ort_nodes'])} | "
            f"{row['ours_ms']:.3f} | {row['ort_ms']:.3f} | {ratio} | {row['delta_ms']:+.3f} | "
            f"{row['ort_less_profiler_ms']:.3f} | {less} |"
        )
    hidden = len(result["rows"]) - min(top, len(result["rows"]))
    lines.append("")
    if hidden:
        lines.append(f"… and {hidden} more rows (all of them in the JSON).")
    lines.append(
        f"Totals: ours {totals['ours_ms']:.3f} ms over {totals['ours_layers']} layers (profiled runs "
        f"{totals['ours_profiled_run_ms']:.3f} ms, {totals['profile_mode']}), ONNX Runtime {totals['ort_ms']:.3f} ms "
        f"over {totals['ort_nodes']} nodes (profiled runs {totals['ort_profiled_run_ms']:.3f} ms), of which "
        f"{totals['ort_only_ms']:.3f} ms in rows of ONNX Runtime's alone (layout conversions); unprofiled in the "
        f"same rounds {totals['ort_plain_run_ms']:.3f} ms, so its node times hold at least "
        f"{totals['ort_profiler_ms_per_node'] * 1e3:.1f} µs a node of its profiler (the last two columns take that "
        "off)."
    )
    if "ours_end_to_end_ms" in totals:
        lines.append(
            f"End to end, unprofiled: ours {totals['ours_end_to_end_ms']:.3f} ms, ONNX Runtime "
            f"{totals['ort_end_to_end_ms']:.3f} ms."
        )
    if totals["ort_nodes_unmapped"]:
        lines.append(f"ONNX Runtime nodes mapped to no ONNX node: {', '.join(totals['ort_nodes_unmapped'])}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], prog="bench/layers_vs_ort.py")
    parser.add_argument("--model", default="mobilenetv3", choices=sorted(zoo.MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=suite.PRECISIONS, help="our engine's (ORT runs fp32)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per round and system")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per round and system")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of ORT and ours")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="intra-op threads of both")
    parser.add_argument("--effort", type=int, default=0, help="tensorforge build effort")
    parser.add_argument("--top", type=int, default=15, help="rows in the printed table")
    parser.add_argument("--out", type=Path, help="write DIR/layers-MODEL.json and DIR/layers-MODEL.md")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.rounds < 1 or args.threads < 1:
        raise SystemExit("--runs, --rounds and --threads must be at least 1, --warmup at least 0")
    cpu = torch.device("cpu")
    reason = suite.not_applicable("tensorforge", args.precision, cpu)
    if reason:
        raise SystemExit(f"--precision {args.precision}: {reason}")
    size = suite.BENCH_SIZES.get(args.model, zoo.MODELS[args.model].default_size)
    case = suite.Case(args.model, args.batch, size, cpu, args.runs, args.warmup, args.effort)
    engine, build_s = suite.build_engine(case, args.precision)
    print(f"{args.model} batch {args.batch} {args.precision}: built in {build_s:.1f} s", flush=True)
    result = measure(
        case.proto, engine, case.feeds, runs=args.runs, warmup=args.warmup, rounds=args.rounds, threads=args.threads
    )
    title = (
        f"{args.model} (size {size}), batch {args.batch}: tensorforge {args.precision} layers against ONNX Runtime "
        f"fp32 nodes, {args.threads} threads, {args.rounds} rounds × {args.runs} runs"
    )
    text = markdown(result, title, args.top)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        command = ["python", "bench/layers_vs_ort.py", *(sys.argv[1:] if argv is None else argv)]
        meta = {**suite.invocation(cpu, []), "command": " ".join(command)}
        data = {"invocation": meta, "args": {k: str(v) for k, v in vars(args).items()}, "build_s": build_s, **result}
        (args.out / f"layers-{args.model}.json").write_text(json.dumps(data, indent=1) + "\n")
        (args.out / f"layers-{args.model}.md").write_text(text)
        print(f"wrote {args.out}/layers-{args.model}.json and .md")
    return result


if __name__ == "__main__":
    main()
