"""Whether ResNet's projection shortcut should merge into the block's last convolution: measured before it is built.

The first bottleneck of each ResNet stage ends `relu(conv3(y) + b3 + downsample(x) + bd)`, two 1×1 convolutions
whose outputs are added. Today an engine runs them as two layers: conv3 writes its output, the downsample reads
it back as its residual. The two are one 1×1 convolution over the channels of y and of x subsampled by the
downsample's stride, concatenated: `relu([W3 | Wd] · [y ; x[::s, ::s]] + b3 + bd)`, which never writes or reads
conv3's output (at batch 256 in fp16: 411 MB each way for the first stage) but needs the concatenation: free when
y's producer writes into its slice, a strided copy of x's subsampled pixels otherwise (a quarter of x for s = 2).

For each stage's first block (ResNet-50, channels_last, fp16), one run times, each checked against the float32
reference first:
- today: conv3 (cuDNN with its bias) then the downsample with the residual and ReLU
  (`cudnn_convolution_add_relu`), as the engine's vendor tactic runs them;
- merged: the one convolution over a ready concatenation (cuDNN fused conv + bias + ReLU), and the copy of x's
  subsampled pixels into the concatenation's slice (`torch.Tensor.copy_` into a channel slice);
so `merged + copy` against `today` says whether the rewrite pays when only y's producer writes in place. cuDNN
runs in benchmark mode (it times its algorithms on the first call of a shape), as the engine's vendor tactic
does from effort 1 (a first version timed cuDNN's heuristic choice and a separate bias add, not what an engine
runs: 1.19 ms for layer1's pair at batch 256).

    python bench/residual_merge.py --batch 256 --out DIR      (writes residual-merge-bBATCH.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.tactics.timing import measure

# (stage, input channels, block width, input side, downsample stride): ResNet-50's first bottleneck of each stage.
STAGES = [
    ("layer1", 64, 64, 56, 1),
    ("layer2", 256, 128, 56, 2),
    ("layer3", 512, 256, 28, 2),
    ("layer4", 1024, 512, 14, 2),
]
TOLERANCE = 5e-3  # fp16, normwise against the float32 reference


def timed(fn, device) -> float:
    return measure(fn, device=device, warmup=3, repeats=20).median


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def stage_case(cin: int, width: int, side: int, stride: int, batch: int, device: torch.device, dtype: torch.dtype):
    """The block's tensors: x (the block input), y (conv2's output), the two weights and biases, and the
    float32 reference of the block's output."""
    torch.manual_seed(0)
    out_side = side // stride
    cout = 4 * width

    def act(*shape):
        return torch.randn(*shape, device=device).to(dtype).contiguous(memory_format=torch.channels_last)

    x, y = act(batch, cin, side, side), act(batch, width, out_side, out_side)
    w3 = (torch.randn(cout, width, 1, 1, device=device) / width**0.5).to(dtype)
    wd = (torch.randn(cout, cin, 1, 1, device=device) / cin**0.5).to(dtype)
    b3, bd = torch.randn(cout, device=device).to(dtype), torch.randn(cout, device=device).to(dtype)
    ref = torch.relu(
        F.conv2d(y.float(), w3.float(), b3.float()) + F.conv2d(x.float(), wd.float(), bd.float(), stride=stride)
    )
    return x, y, w3, wd, b3, bd, ref


def measure_stage(cin: int, width: int, side: int, stride: int, batch: int, device: torch.device) -> dict:
    """Today's two layers, the merged convolution and the copy into its concatenation, checked, then timed (ms)."""
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    x, y, w3, wd, b3, bd, ref = stage_case(cin, width, side, stride, batch, device, dtype)
    weight, bias = torch.cat([w3, wd], dim=1), b3 + bd
    concat = torch.empty(
        y.shape[0], width + cin, *y.shape[2:], dtype=dtype, device=device, memory_format=torch.channels_last
    )
    concat[:, :width].copy_(y)  # as conv2 would write it, in place
    subsampled = x[:, :, ::stride, ::stride]
    if device.type == "cuda":

        def today():
            z = F.conv2d(y, w3, b3)
            return torch.cudnn_convolution_add_relu(x, wd, z, 1.0, bd, (stride, stride), (0, 0), (1, 1), 1)

        def merged():
            return torch.cudnn_convolution_relu(concat, weight, bias, (1, 1), (0, 0), (1, 1), 1)

    else:

        def today():
            return torch.relu(F.conv2d(x, wd, bd, stride=stride) + F.conv2d(y, w3, b3))

        def merged():
            return torch.relu(F.conv2d(concat, weight, bias))

    def copy():
        return concat[:, width:].copy_(subsampled)

    copy()
    errors = {"today": _error(today(), ref), "merged": _error(merged(), ref)}
    if any(not e <= TOLERANCE for e in errors.values()):
        raise SystemExit(f"wrong result {errors} (tolerance {TOLERANCE})")
    ms = {"today": timed(today, device), "merged": timed(merged, device), "copy": timed(copy, device)}
    # x's producer cannot write into the concatenation (other layers read x as it is): its pixels are copied.
    return {**ms, "merged_plus_copy": ms["merged"] + ms["copy"], "errors": errors, "dtype": str(dtype)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--device", default="cuda", help="cuda; cpu checks the script (float32)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    rows = []
    print(f"{'stage':<8}{'today ms':>10}{'merged ms':>11}{'copy ms':>9}{'merged+copy':>13}{'gain':>8}", flush=True)
    for stage, cin, width, side, stride in STAGES:
        row = {"stage": stage, **measure_stage(cin, width, side, stride, args.batch, device)}
        rows.append(row)
        gain = row["today"] / row["merged_plus_copy"]
        print(
            f"{stage:<8}{row['today']:>10.4f}{row['merged']:>11.4f}{row['copy']:>9.4f}"
            f"{row['merged_plus_copy']:>13.4f}{gain:>7.2f}x",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    meta = {"batch": args.batch, "device": device_name, "date": time.strftime("%Y-%m-%d")}
    (args.out / f"residual-merge-b{args.batch}.json").write_text(json.dumps({**meta, "stages": rows}, indent=1))


if __name__ == "__main__":
    main()
