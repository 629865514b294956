"""Every distinct convolution layer of zoo models: our Triton kernels against cuDNN, layer by layer, one run.

For each model and batch size the model is exported, imported and optimized; every distinct `FusedConv` (input
and weight shape, attributes, epilogue) is then timed on the same random fp16 channels_last inputs as
- `cudnn+torch`: what a framework runs: cuDNN's convolution with its bias, then the epilogue's activation and
  residual add as separate torch ops, in fp16 (the issue's baseline);
- `vendor`: the best of our vendor tactics (cuDNN's fused conv + bias + ReLU (+ residual) where it applies);
- `ours`: the best of our own kernels: the Triton and the CUDA C (NVRTC) tactics, every config at `--effort`.
Every candidate is checked against the float32 reference by the autotuner before it is timed; each of our
candidates that computed a wrong result or failed (not one that declined the layer) is listed, which makes a
sweep of the zoo's convolutions the on-device correctness sweep of our kernels too. Reports per layer and a
summary (layers won, geometric-mean ratio, candidates wrong), as JSON and markdown.

    python bench/conv_sweep.py --model resnet50 --model mobilenetv3 --batch 1 --batch 64 --out results/
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tensorforge import zoo
from tensorforge.frontend import import_model
from tensorforge.ir import Node, qualified_op
from tensorforge.ops.fused import DOMAIN, apply_activation
from tensorforge.ops.pool import window_geometry
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import autotune
from tensorforge.tactics.timing import measure

_NATIVE = {"": lambda y: y, "Relu": F.relu, "HardSwish": F.hardswish, "SiLU": F.silu, "Sigmoid": torch.sigmoid}


def distinct_convs(name: str, batch: int, size: int) -> tuple[list[Node], int]:
    """The model's FusedConv nodes after optimization, one per distinct shape/attribute/epilogue, and the opset."""
    model = import_model(zoo.export(name, batch=batch, size=size, dynamic_batch=False))
    optimize(model)
    seen, nodes = set(), []
    for node in model.graph.nodes:
        if qualified_op(node) != f"{DOMAIN}::FusedConv":
            continue
        shapes = tuple(tuple(v.shape) if v is not None else None for v in node.inputs)
        key = (shapes, json.dumps(dict(node.attributes), sort_keys=True, default=str))
        if key not in seen:
            seen.add(key)
            nodes.append(node)
    return nodes, model.opset(DOMAIN)


def describe(node: Node) -> str:
    x, w = node.inputs[0].shape, node.inputs[1].shape
    a = node.attributes
    stride = "x".join(map(str, a.get("strides", [1, 1])))
    group = a.get("group", 1)
    residual = "res" if len(node.inputs) > 3 and node.inputs[3] is not None else ""
    epilogue = "+".join(p for p in (a.get("pre", ""), residual, a.get("post", "")) if p)
    return (
        f"{x[1]}->{w[0]} {w[2]}x{w[3]} s{stride}" + (f" g{group}" if group > 1 else "") + f" @{x[2]}x{x[3]}"
        + (f" [{epilogue}]" if epilogue else "")
    )  # fmt: skip


def _inputs(node: Node, device: torch.device) -> list[torch.Tensor | None]:
    """Random fp16 channels_last activations (the layer's non-constant inputs); constants come from the graph."""
    inputs = []
    for value in node.inputs:
        if value is None or value.is_const:
            inputs.append(None)
            continue
        tensor = torch.randn(list(value.shape), device=device).half()
        inputs.append(tensor.contiguous(memory_format=torch.channels_last) if tensor.dim() == 4 else tensor)
    return inputs


def _unfused(node: Node, inputs: list[torch.Tensor | None], device: torch.device):
    """cuDNN's convolution (with its bias) followed by the epilogue as separate fp16 torch ops."""
    a = node.attributes
    w = node.inputs[1].const.to(device).half().contiguous(memory_format=torch.channels_last)
    b = node.inputs[2].const.to(device).half() if len(node.inputs) > 2 and node.inputs[2] is not None else None
    x, z = inputs[0], inputs[3] if len(inputs) > 3 else None
    strides, dilations = list(a.get("strides", [1, 1])), list(a.get("dilations", [1, 1]))
    begin, end, _ = window_geometry(
        x.shape[2:], w.shape[2:], strides, dilations, a.get("pads"), a.get("auto_pad", "NOTSET")
    )
    if begin != end:
        raise ValueError("asymmetric padding")

    def activation(name, params):
        return _NATIVE[name] if name in _NATIVE else (lambda y: apply_activation(y, name, params))

    pre = activation(a.get("pre", ""), a.get("pre_params", []))
    post = activation(a.get("post", ""), a.get("post_params", []))

    def call():
        y = pre(F.conv2d(x, w, b, strides, begin, dilations, a.get("group", 1)))
        if z is not None:
            y = post(y + z)
        return y

    return call


def _best(choice, family: str) -> tuple[float, str]:
    timed = [c for c in choice.candidates if c.tactic.split(".")[0] == family and math.isfinite(c.median_ms)]
    if not timed:
        return math.inf, "; ".join(sorted({c.note for c in choice.candidates if c.tactic.startswith(family)}))[:200]
    best = min(timed, key=lambda c: c.median_ms)
    config = {k: v for k, v in best.config.items() if k not in ("precision",)}
    return best.median_ms, f"{best.tactic} {config}"


def sweep_layer(node: Node, opset: int, device: torch.device, effort: int) -> dict:
    inputs = _inputs(node, device)
    row = {"layer": describe(node)}
    with torch.inference_mode():
        baseline = measure(_unfused(node, inputs, device), device=device, warmup=10, repeats=50)
    row["cudnn_torch_ms"] = baseline.median
    row["wrong"] = []
    for family in ("vendor", "triton", "cuda"):
        choice = autotune(
            node, opset, inputs, device, effort=effort, precisions=("fp16",), families=[family], exhaustive=True
        )
        row[f"{family}_ms"], row[f"{family}_choice"] = _best(choice, family)
        row["wrong"] += [
            f"{c.tactic} {c.config}: {c.note}"
            for c in choice.candidates
            if c.tactic.split(".")[0] == family and not math.isfinite(c.median_ms) and not c.note.startswith("unsup")
        ]
    best = min(("triton", "cuda"), key=lambda f: row[f"{f}_ms"])
    row["ours_ms"], row["ours_choice"] = row[f"{best}_ms"], row[f"{best}_choice"]
    return row


def summarize(rows: list[dict]) -> dict:
    def ratios(key: str) -> list[float]:
        return [r[key] / r["ours_ms"] for r in rows if math.isfinite(r["ours_ms"]) and math.isfinite(r[key])]

    summary = {
        "layers": len(rows),
        "ours_ran": sum(math.isfinite(r["ours_ms"]) for r in rows),
        "candidates_wrong": sum(len(r.get("wrong", ())) for r in rows),
    }
    for key in ("cudnn_torch_ms", "vendor_ms"):
        values = ratios(key)
        summary[f"wins_vs_{key[:-3]}"] = sum(v > 1.0 for v in values)
        summary[f"geomean_speedup_vs_{key[:-3]}"] = (
            math.exp(statistics.fmean(map(math.log, values))) if values else None
        )
    return summary


def markdown(results: dict) -> str:
    lines = [
        f"Device: {results['device']}; torch {results['torch']}; {results['date']}; effort {results['effort']}",
        "",
    ]
    for run in results["runs"]:
        s = run["summary"]
        lines += [
            f"### {run['model']} batch {run['batch']} ({s['layers']} distinct convolutions)",
            "",
            f"Our kernels win {s['wins_vs_cudnn_torch']}/{s['ours_ran']} against cuDNN + torch epilogue "
            f"(geomean speed-up {_fmt(s['geomean_speedup_vs_cudnn_torch'])}×) and {s['wins_vs_vendor']}/"
            f"{s['ours_ran']} against our best vendor tactic ({_fmt(s['geomean_speedup_vs_vendor'])}×). "
            f"Candidates that computed a wrong result or failed: {s.get('candidates_wrong', 'n/a')}.",
            *[f"- {r['layer']}: {problem}" for r in run["rows"] for problem in r.get("wrong", ())],
            "",
            "| layer | cuDNN + torch ms | vendor ms | triton ms | cuda ms | speed-up vs cuDNN + torch | our choice |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in run["rows"]:
            speedup = r["cudnn_torch_ms"] / r["ours_ms"] if math.isfinite(r["ours_ms"]) else math.nan
            lines.append(
                f"| {r['layer']} | {r['cudnn_torch_ms']:.4f} | {r['vendor_ms']:.4f} | {r['triton_ms']:.4f} | "
                f"{r['cuda_ms']:.4f} | {speedup:.2f} | {r['ours_choice']} |"
            )
        lines.append("")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="zoo model (repeatable; default resnet50, mobilenetv3)")
    parser.add_argument("--batch", action="append", type=int, help="batch size (repeatable; default 1 and 64)")
    parser.add_argument("--size", type=int, default=224, help="image side")
    parser.add_argument("--effort", type=int, default=1, help="tuning effort of the Triton tactics (0-2)")
    parser.add_argument("--device", default="cuda", help="cuda (the point of it) or cpu (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory")
    args = parser.parse_args()
    device = torch.device(args.device)
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "effort": args.effort,
        "runs": [],
    }
    for name in args.model or ["resnet50", "mobilenetv3"]:
        for batch in args.batch or [1, 64]:
            nodes, opset = distinct_convs(name, batch, args.size)
            rows = []
            for node in nodes:
                row = sweep_layer(node, opset, device, args.effort)
                rows.append(row)
                print(
                    f"{name} b{batch} {row['layer']:<40} cudnn+torch {row['cudnn_torch_ms']:.4f} "
                    f"vendor {row['vendor_ms']:.4f} triton {row['triton_ms']:.4f} cuda {row['cuda_ms']:.4f}  "
                    f"{row['ours_choice']}",
                    flush=True,
                )
            results["runs"].append({"model": name, "batch": batch, "rows": rows, "summary": summarize(rows)})
            print(json.dumps(results["runs"][-1]["summary"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conv_sweep.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / "conv_sweep.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
