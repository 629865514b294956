"""What converting an int8 product's int32 sums to float costs in its epilogue: ResNet-50's int8 layers at batch 256
(int8 in, int8 out requantized, the block-final ones with an int8 residual), each on the warp-specialized Gluon
kernel (`conv_ws`) and on Triton's TMA kernel (`conv2d_nhwc_quantized` with a `tma` config), with the sums
converted by the conversion instruction and, where the weight bounds them (`kernels.quantize.small_sums`),
through the rounding constant's bits (`epilogue.sums_to_float`); the E4M3 layer (float sums, nothing to
convert) beside them. Every effort-0 tile is timed converting, and the fastest again without; both outputs must
be equal bit for bit.

    python bench/int8_sums.py --out DIR      (writes int8-sums-bBATCH.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.quantize import quantize_weight, small_sums
from tensorforge.kernels.triton.conv import conv2d_nhwc_quantized, fit_configs, pack_weight, tma_configs
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.tactics.gluon_gemm import GemmConfig, conv_ws, gemm_ws_configs, pack_conv_weight
from tensorforge.tactics.timing import measure

# name: (input channels, output channels, kernel, side, residual)
LAYERS = {
    "layer1 1x1 64->256 +z": (64, 256, 1, 56, True),
    "layer1 1x1 64->256": (64, 256, 1, 56, False),
    "layer1 1x1 256->64": (256, 64, 1, 56, False),
    "layer1 3x3 64->64": (64, 64, 3, 56, False),
    "layer2 1x1 128->512 +z": (128, 512, 1, 28, True),
    "layer3 1x1 256->1024 +z": (256, 1024, 1, 14, True),
}


def timed(fn, device) -> float:
    return measure(fn, device=device, warmup=3, repeats=20).median


def fastest(run, configs, device) -> tuple[float, dict | None]:
    """(ms, config) of the fastest of `configs` that runs (`run(config)`); (inf, None) when none does."""
    best = (float("inf"), None)
    for config in configs:
        try:
            run(config)
        except Exception as err:  # a tile this layer or device cannot take: skipped, said so
            print(f"  {config}: {type(err).__name__}: {str(err)[:120]}", flush=True)
            continue
        ms = timed(lambda config=config: run(config), device)
        if ms < best[0]:
            best = (ms, config)
    return best


def layer(name: str, batch: int, device: torch.device) -> dict:
    cin, cout, k, side, residual = LAYERS[name]
    torch.manual_seed(0)
    x = torch.randint(-128, 128, (batch, cin, side, side), dtype=torch.int8, device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    z = torch.randint(-128, 128, (batch, cout, side, side), dtype=torch.int8, device=device) if residual else None
    z = z.contiguous(memory_format=torch.channels_last) if z is not None else None
    pads = (k // 2, k // 2)
    row: dict = {"layer": name}
    for kind in ("int8", "fp8e4m3"):
        w = torch.randn(cout, cin, k, k, device=device) / (cin * k * k) ** 0.5
        wq, w_scale = quantize_weight(w, kind)
        small = small_sums(wq)
        scale = (w_scale.double() * 0.02).float()
        qtype = wq.dtype
        xk, zk = (x, z) if kind == "int8" else (t.half().to(qtype) if t is not None else None for t in (x, z))
        out = torch.empty(batch, cout, side, side, dtype=qtype, device=device, memory_format=torch.channels_last)
        packed_ws, packed_tma = pack_conv_weight(wq), pack_weight(wq, 1, k_major=True)

        def gluon(config, small=False, xk=xk, zk=zk, out=out, packed_ws=packed_ws, scale=scale, quant=kind):
            return conv_ws(
                xk, packed_ws, out, GemmConfig(**config), kernel=(k, k), pads=pads, scale=scale, z=zk, z_scale=0.01,
                post=activation_args("Relu"), quant_y=1 if quant == "int8" else 2, y_inv_scale=0.5,
                small_sums=small,
            )  # fmt: skip

        def triton_tma(config, small=False, xk=xk, zk=zk, out=out, packed=packed_tma, w_scale=w_scale):
            return conv2d_nhwc_quantized(
                xk, packed, w_scale, 0.02, None, zk, out=out, out_hw=(side, side), pads_begin=pads,
                post=activation_args("Relu"), config=config, y_scale=2.0, z_scale=0.01 if zk is not None else 0.0,
                small_sums=small,
            )  # fmt: skip

        tiles = gemm_ws_configs(0, quantized=True)
        if kind != "int8":  # E4M3 sums promoted each step or left to the tensor cores, as the tactic offers
            tiles += [{**c, "promote": False} for c in tiles]
        forms = {
            "gluon": (gluon, tiles),
            "triton": (triton_tma, fit_configs(tma_configs(0, quantized=True), cin, cout, 32)),
        }
        for form, (run, configs) in forms.items():
            ms, config = fastest(run, configs, device)
            row[f"{form} {kind}"] = {"ms": ms, "config": config}
            if kind != "int8" or config is None:
                continue
            row["small"] = small
            if small:
                converted = run(config).clone()
                same = torch.equal(run(config, small=True), converted)
                if not same:
                    raise SystemExit(f"{name} {form}: the small sums' output differs from the converted one")
                row[f"{form} int8 small"] = {"ms": timed(lambda run=run, c=config: run(c, small=True), device)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--layers", nargs="*", default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    device = torch.device("cuda")
    columns = ("gluon int8", "gluon int8 small", "gluon fp8e4m3", "triton int8", "triton int8 small", "triton fp8e4m3")
    print(f"{'layer':<26}" + "".join(f"{c:>19}" for c in columns), flush=True)
    rows = []
    for name in args.layers:
        row = layer(name, args.batch, device)
        rows.append(row)
        cells = "".join(f"{row[c]['ms']:>19.4f}" if c in row else f"{'-':>19}" for c in columns)
        print(f"{name:<26}{cells}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "batch": args.batch}
    (args.out / f"int8-sums-b{args.batch}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
