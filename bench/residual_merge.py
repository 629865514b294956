"""Whether ResNet's projection shortcut should merge into the block's last convolution: measured before it is built.

The first bottleneck of each ResNet stage ends `relu(conv3(y) + b3 + downsample(x) + bd)`, two 1×1 convolutions
whose outputs are added. Today an engine runs them as two layers: conv3 writes its output, the downsample reads
it back as its residual. The two are one 1×1 convolution over the channels of y and of x subsampled by the
downsample's stride, concatenated: `relu([W3 | Wd] · [y ; x[::s, ::s]] + b3 + bd)`, which never writes or reads
conv3's output (at batch 256 in fp16: 411 MB each way for the first stage) but needs the concatenation: free when
y's producer writes into its slice, a strided copy of x's subsampled pixels otherwise (a quarter of x for s = 2).

For each stage's first block of ResNet-50 (fp16 channels_last on CUDA, float32 on the CPU), one run times what an
engine would run, each layer through the autotuner over every tactic family (each candidate checked against the
reference first, the fastest kept):
- today: the optimized graph's two layers, conv3 (with its bias) and the downsample (bias, conv3's output as its
  residual, ReLU);
- merged: one FusedConv (bias, ReLU) over the concatenation, and the copy of x's subsampled pixels into the
  concatenation's slice (`torch.Tensor.copy_` into a channel slice);
so `merged + copy` against `today` says whether the rewrite pays when only y's producer writes in place.

    python bench/residual_merge.py --batch 256 --out DIR      (writes residual-merge-bBATCH.json, prints a table)

Each layer is autotuned from cold caches (its Triton candidates compile first), so a stage takes a while on a GPU;
`--stages` picks the ones to measure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge import zoo
from tensorforge.frontend import import_model
from tensorforge.ir import Graph, Node, qualified_op
from tensorforge.ops.fused import DOMAIN
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import Choice, autotune
from tensorforge.tactics.timing import measure

STAGES = ["layer1", "layer2", "layer3", "layer4"]


def fused_conv(graph: Graph, name: str) -> Node:
    """The FusedConv layer that the node called `name` became."""
    for node in graph.nodes:
        if node.name == name and qualified_op(node) == f"{DOMAIN}::FusedConv":
            return node
    raise SystemExit(f"no FusedConv named {name!r} in the optimized graph")


def merged_conv(batch: int, channels: int, side: int, cout: int, seed: int) -> tuple[Node, int]:
    """A 1×1 FusedConv with bias and ReLU over `channels` input channels, through the importer and optimizer."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(cout, channels, 1, 1, generator=generator) / channels**0.5
    bias = torch.randn(cout, generator=generator)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["conv"], name="merged"), helper.make_node("Relu", ["conv"], ["y"])],
        "merged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, cout, side, side])],
        [numpy_helper.from_array(weight.numpy(), "w"), numpy_helper.from_array(bias.numpy(), "b")],
    )
    model = import_model(helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]))
    optimize(model)
    return fused_conv(model.graph, "merged"), model.opset(DOMAIN)


def activation(shape, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(list(shape), device=device).to(dtype).contiguous(memory_format=torch.channels_last)


def best(node: Node, opset: int, inputs: list, device: torch.device, precision: str, effort: int) -> Choice:
    """The autotuner's choice for `node` over every tactic family (None inputs: the node's constants)."""
    return autotune(node, opset, inputs, device, effort=effort, precisions=(precision,))


def measure_stage(graph: Graph, opset: int, stage: str, device: torch.device, effort: int) -> dict:
    precision, dtype = ("fp16", torch.float16) if device.type == "cuda" else ("fp32", torch.float32)
    conv3 = fused_conv(graph, f"/{stage}/{stage}.0/conv3/Conv")
    down = fused_conv(graph, f"/{stage}/{stage}.0/downsample/downsample.0/Conv")
    y_shape, x_shape, z_shape = conv3.inputs[0].shape, down.inputs[0].shape, conv3.outputs[0].shape
    stride = down.attributes.get("strides", [1, 1])[0]
    y, x = activation(y_shape, device, dtype), activation(x_shape, device, dtype)
    z = activation(z_shape, device, dtype)
    first = best(conv3, opset, [y, None, None], device, precision, effort)
    second = best(down, opset, [x, None, None, z], device, precision, effort)
    batch, width, side = y_shape[0], y_shape[1], y_shape[2]
    merged_node, merged_opset = merged_conv(batch, width + x_shape[1], side, z_shape[1], seed=len(stage))
    concat = activation((batch, width + x_shape[1], side, side), device, dtype)
    merged = best(merged_node, merged_opset, [concat, None, None], device, precision, effort)
    subsampled = x[:, :, ::stride, ::stride]
    copy = measure(lambda: concat[:, width:].copy_(subsampled), device=device, warmup=3, repeats=20).median
    return {
        "stage": stage,
        "today": first.median_ms + second.median_ms,
        "today_layers": [(first.tactic, first.median_ms), (second.tactic, second.median_ms)],
        "merged": merged.median_ms,
        "merged_tactic": merged.tactic,
        "copy": copy,
        "merged_plus_copy": merged.median_ms + copy,
        "precision": precision,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--effort", type=int, default=0, help="the autotuner's effort for every layer")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--device", default="cuda", help="cuda; cpu checks the script (float32)")
    parser.add_argument("--stages", nargs="+", default=STAGES, choices=STAGES, help="which stages' first blocks")
    args = parser.parse_args()
    device = torch.device(args.device)
    model = import_model(zoo.export("resnet50", batch=args.batch, size=224, dynamic_batch=False))
    optimize(model)
    opset = model.opset(DOMAIN)
    rows = []
    print(
        f"{'stage':<8}{'today ms':>10}{'merged ms':>11}{'copy ms':>9}{'merged+copy':>13}{'gain':>8}  tactics",
        flush=True,
    )
    for stage in args.stages:
        row = measure_stage(model.graph, opset, stage, device, args.effort)
        rows.append(row)
        tactics = " + ".join(t for t, _ in row["today_layers"]) + f" against {row['merged_tactic']}"
        print(
            f"{stage:<8}{row['today']:>10.4f}{row['merged']:>11.4f}{row['copy']:>9.4f}"
            f"{row['merged_plus_copy']:>13.4f}{row['today'] / row['merged_plus_copy']:>7.2f}x  {tactics}",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    meta = {"batch": args.batch, "effort": args.effort, "device": device_name, "date": time.strftime("%Y-%m-%d")}
    (args.out / f"residual-merge-b{args.batch}.json").write_text(json.dumps({**meta, "stages": rows}, indent=1))


if __name__ == "__main__":
    main()
