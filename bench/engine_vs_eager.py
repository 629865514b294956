"""A tensorforge engine against PyTorch eager and eager + CUDA graph, measured in one run.

For each batch size: build the engine (fresh, then again with the warm timing cache), then time the same
model, on the same device, in the same precision and memory format, as
- `eager`: the PyTorch module, half precision, channels_last (on CUDA), BatchNorm left as is;
- `eager+graph`: that module captured in one CUDA graph and replayed;
- `tensorforge`: `ExecutionContext.run` on the engine (CUDA graphs on CUDA), fed float32 as the ONNX model
  declares; the engine's first layer casts.
Each measurement is the median wall time of `--runs` synchronized calls after warm-up (a latency: one call
is one request). Writes JSON and a markdown table.

    python bench/engine_vs_eager.py --model resnet50 --batch 1 --batch 256 --fp16 --out results/
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from suite import eager_module, graphed, median_ms

from tensorforge import __version__, zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.frontend import import_model
from tensorforge.tactics.autotune import relative_error


def bench(name: str, batch: int, precision: str, device: torch.device, runs: int, warmup: int, effort: int) -> dict:
    size = 224 if name in ("resnet50", "mobilenetv3") else None
    shape = zoo.input_shape(name, batch, size)
    model = import_model(zoo.export(name, batch=batch, size=size, dynamic_batch=False))
    precisions = ("fp32",) if precision == "fp32" else ("fp32", precision)
    with tempfile.TemporaryDirectory() as scratch:
        cache = str(Path(scratch) / "timing.json")
        config = BuildConfig(
            device=str(device),
            precisions=precisions,
            profiles=(Profile().add("input", shape, shape, shape),),
            effort=effort,
            timing_cache=cache,
        )
        started = time.perf_counter()
        engine = build_engine(model, config)
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        build_engine(model, config)
        rebuild_s = time.perf_counter() - started
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    x32 = torch.randn(shape, device=device)
    x = x32.to(dtype).contiguous(memory_format=torch.channels_last) if device.type == "cuda" else x32.to(dtype)
    module = eager_module(name, size, device, precision)
    context = engine.create_context()
    with torch.inference_mode():
        reference = zoo.build(name, size=size).double().to(device)(x32.double())
    results = {"model": name, "batch": batch, "precision": precision, "build_s": build_s, "rebuild_s": rebuild_s}
    with torch.inference_mode():
        results["eager_ms"] = median_ms(lambda: module(x), device, runs, warmup)
        eager_out = module(x)
    if device.type == "cuda":
        replay = graphed(module, [x])
        results["eager_graph_ms"] = median_ms(replay, device, runs, warmup)
    engine.schedule(0)  # weights converted and kernels built before the memory is measured
    if device.type == "cuda":  # the memory a context takes for activations: eager run, capture, replays
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            context.run({"input": x32})
        results["context_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    results["tensorforge_ms"] = median_ms(lambda: context.run({"input": x32}), device, runs, warmup)
    ours = context.run({"input": x32})["output"]
    results["error_vs_float64"] = relative_error(ours, reference)
    results["eager_error_vs_float64"] = relative_error(eager_out, reference)
    results["layers"] = _layer_summary(engine)
    results["plan_selection"] = engine.report["plan_selection"][0]
    results["cuda_graph_captured"] = bool(getattr(context, "captured_shapes", []))
    results["eager_shapes"] = [reason for reason in getattr(context, "eager_shapes", {}).values()]
    nodes = engine.model.graph.nodes
    results["slowest_layers"] = [
        {
            "node": nodes[l.node].name,
            "op": nodes[l.node].op_type,
            "tactic": l.tactic,
            "config": l.config,
            "ms": l.median_ms,
        }
        for l in sorted(engine.plans[0].layers, key=lambda l: -l.median_ms)[:12]
    ]
    results["sum_of_layers_ms"] = engine.plans[0].total_ms
    slowest = max(engine.plans[0].layers, key=lambda l: l.median_ms)
    results["slowest_layer_candidates"] = sorted(
        ((c.median_ms, c.tactic, c.config, c.note) for c in slowest.candidates), key=lambda c: c[0]
    )
    results["arena_mib"] = engine.plans[0].memory.arena_bytes / 2**20
    return results


def _layer_summary(engine) -> dict[str, int]:
    counts: dict[str, int] = {}
    for layer in engine.plans[0].layers:
        key = f"{layer.tactic} {layer.precision} {layer.layout}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _table(rows: list[dict]) -> str:
    lines = [
        "| model | batch | precision | eager ms | eager+graph ms | tensorforge ms | vs eager | vs eager+graph | "
        "img/s | build s | warm rebuild s | error vs fp64 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours = r["tensorforge_ms"]
        graph = r.get("eager_graph_ms")
        graph_ms, vs_graph = ("-", "-") if graph is None else (f"{graph:.3f}", f"{graph / ours:.2f}x")
        errors = f"{r['error_vs_float64']:.1e} (eager {r['eager_error_vs_float64']:.1e})"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['precision']} | {r['eager_ms']:.3f} | {graph_ms} | {ours:.3f} | "
            f"{r['eager_ms'] / ours:.2f}x | {vs_graph} | {1e3 * r['batch'] / ours:.0f} | {r['build_s']:.1f} | "
            f"{r['rebuild_s']:.1f} | {errors} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", choices=sorted(zoo.MODELS))
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--precision", default=None, choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--effort", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    device = torch.device(args.device)
    precision = args.precision or ("fp16" if device.type == "cuda" else "fp32")
    rows = [
        bench(args.model, batch, precision, device, args.runs, args.warmup, args.effort) for batch in args.batch or [1]
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    meta = {"device": name, "torch": torch.__version__, "tensorforge": __version__, "date": time.strftime("%Y-%m-%d")}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"engine_vs_eager_{args.model}_{device.type}"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    table = _table(rows)
    (args.out / f"{stem}.md").write_text(f"{meta}\n\n{table}\n")
    print(meta)
    print(table)
    for row in rows:
        peak = f"context peak {row['context_peak_mib']:.1f} MiB" if "context_peak_mib" in row else ""
        print(
            row["batch"],
            row["layers"],
            f"arena {row['arena_mib']:.1f} MiB",
            peak,
            f"graph {row['cuda_graph_captured']}",
        )
        print("  plans:", row["plan_selection"], f"sum of layers {row['sum_of_layers_ms']:.3f} ms")
        for candidate in row["slowest_layer_candidates"]:
            print("  candidate of the slowest layer:", candidate)
        for layer in row["slowest_layers"][:6]:
            print(f"  {layer['ms']:.4f} ms {layer['op']} {layer['node']} {layer['tactic']} {layer['config']}")


if __name__ == "__main__":
    main()
