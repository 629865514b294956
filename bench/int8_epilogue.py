"""What an int8 layer's epilogue forms cost: ResNet-50's block-final 1×1 layers at batch 256 (int8 in, an int8
residual, ReLU, int8 out) on the warp-specialized Gluon kernel and on Triton's TMA kernel, and two layers without a
residual, with the epilogue's helpers replaced by other forms of the same arithmetic, each form in its own process
(Triton keys its compiled kernels by their helpers' source):

- base: as the library has them (the residual widened by `cvt`; after the ReLU the result clipped to 127 only;
  on the Gluon kernel 1 / y_scale folded into the column factors, the bias and z_scale);
- widen-bits: the residual widened through the rounding constant's bits (a byte permute, an integer add and a
  float subtract instead of one `I2F.S8`), as the library did before;
- unfolded: the Gluon kernel multiplies every output by 1 / y_scale;
- clip-both: the result clipped to [−128, 127].

Every form's int8 output is checked against the base form's: equal, or off by one step where a value lies within
float32 rounding of a tie. The fastest of each layer's effort-0 tiles (found with the base form; on Triton's kernel
every effort-1 tile, the transposed one among them) is timed in every form; the base form runs first and last to
show the drift between processes.

    python bench/int8_epilogue.py --out DIR      (writes int8-epilogue-bBATCH.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.experimental import gluon

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels import quantize as quantizing
from tensorforge.kernels.gluon import gemm as gluon_gemm
from tensorforge.kernels.triton import conv_tma
from tensorforge.kernels.triton.conv import conv2d_nhwc_quantized, fit_configs, pack_weight, tma_configs
from tensorforge.kernels.triton.epilogue import _MAGIC, activation_args  # the library's rounding constant
from tensorforge.tactics.gluon_gemm import GemmConfig, conv_ws, gemm_ws_configs, pack_conv_weight
from tensorforge.tactics.timing import measure


@triton.jit
def _widen_bits(z):
    return (z.to(tl.int32) + 0x4B400000).to(tl.float32, bitcast=True) - _MAGIC


@triton.jit
def _quantize_clip_both(
    v, inv_scale, QUANT: tl.constexpr, OPERAND: tl.constexpr = False, NONNEG: tl.constexpr = False,
    FOLDED: tl.constexpr = False,
):  # fmt: skip
    v = v.to(tl.float32)
    if not FOLDED:
        v = v * inv_scale
    v = tl.minimum(tl.maximum(v, -128.0), 127.0) + _MAGIC
    return v.to(tl.int32, bitcast=True).to(tl.int8)


@gluon.constexpr_function
def _never_folds(quant_y, has_scale, pre, post):
    return False


FORMS = {  # name: {module attribute: replacement}
    "base": {},
    "widen-bits": {"widen": _widen_bits},
    "unfolded": {"_folds_output_scale": _never_folds},
    "clip-both": {"quantize": _quantize_clip_both},
}
# name: (input channels, output channels, kernel, side, residual, kernel family)
LAYERS = {
    "layer1 1x1 64->256 +z": (64, 256, 1, 56, True, "gluon"),
    "layer2 1x1 128->512 +z": (128, 512, 1, 28, True, "gluon"),
    "layer3 1x1 256->1024 +z": (256, 1024, 1, 14, True, "gluon"),
    "layer1 1x1 64->256 +z, Triton": (64, 256, 1, 56, True, "triton"),
    "layer3 1x1 256->1024 +z, Triton": (256, 1024, 1, 14, True, "triton"),
    "layer1 1x1 64->256": (64, 256, 1, 56, False, "gluon"),
    "layer1 3x3 64->64": (64, 64, 3, 56, False, "triton"),
    "layer1 1x1 256->64": (256, 64, 1, 56, False, "triton"),
}
Y_INV_SCALE, Z_SCALE, X_SCALE = 0.37, 0.013, 0.021


def _install(form: str) -> None:
    """Replace the helpers the Gluon and TMA kernels call (before either compiles)."""
    for attribute, replacement in FORMS[form].items():
        for module in (gluon_gemm, conv_tma):
            if hasattr(module, attribute):
                setattr(module, attribute, replacement)


def _layer(name: str, batch: int, device: torch.device):
    cin, cout, k, side, residual, family = LAYERS[name]
    generator = torch.Generator(device=device).manual_seed(7)
    x = torch.randint(-128, 128, (batch, cin, side, side), dtype=torch.int8, device=device, generator=generator)
    z = torch.randint(-128, 128, (batch, cout, side, side), dtype=torch.int8, device=device, generator=generator)
    w = torch.randn(cout, cin, k, k, device=device, generator=generator) / (cin * k * k) ** 0.5
    wq, w_scale = quantizing.quantize_weight(w, "int8")
    bias = torch.randn(cout, device=device, generator=generator) * 0.5
    x = x.contiguous(memory_format=torch.channels_last)
    z = z.contiguous(memory_format=torch.channels_last) if residual else None
    return family, k, x, z, wq, w_scale, bias


def _runner(name: str, batch: int, device: torch.device):
    """(run(config) -> int8 output, the effort-0 tiles) for the layer in one epilogue form."""
    family, k, x, z, wq, w_scale, bias = _layer(name, batch, device)
    out = torch.empty(x.shape[0], wq.shape[0], *x.shape[2:], dtype=torch.int8, device=device)
    out = out.contiguous(memory_format=torch.channels_last)
    pads = (k // 2, k // 2)
    if family == "gluon":
        packed = pack_conv_weight(wq)
        scale = (w_scale.double() * X_SCALE).float()
        b = bias.float()

        def run(config):
            return conv_ws(
                x, packed, out, GemmConfig(**config), kernel=(k, k), pads=pads, scale=scale, bias=b, z=z,
                z_scale=Z_SCALE, post=activation_args("Relu"), quant_y=1, y_inv_scale=Y_INV_SCALE,
            )  # fmt: skip

        configs = [c for c in gemm_ws_configs(0, quantized=True) if GemmConfig(**c).shared_bytes(
            torch.int8, torch.int8, torch.int8 if z is not None else None) <= gluon_gemm.SHARED_LIMIT]  # fmt: skip
        return run, configs
    packed = pack_weight(wq, 1, k_major=True)
    cin = x.shape[1]

    def run(config):
        return conv2d_nhwc_quantized(
            x, packed, w_scale.float(), X_SCALE, bias, z, out=out, out_hw=x.shape[2:],
            pads_begin=pads, post=activation_args("Relu"), config=config, y_scale=1.0 / Y_INV_SCALE,
            z_scale=Z_SCALE if z is not None else 0.0,
        )  # fmt: skip

    return run, fit_configs(tma_configs(1, quantized=True), cin, wq.shape[0], 32)  # the transposed tile among them


def child(form: str, batch: int, configs: dict, reference: Path, device: torch.device) -> dict:
    """Time every layer in `form` (with `configs`, or the fastest of each layer's tiles when empty); saves the
    outputs under `reference` (the base form) or checks them against it."""
    _install(form)
    result = {}
    for name in LAYERS:
        if device.type == "cpu" and LAYERS[name][5] == "gluon":
            continue  # Gluon runs on Hopper only
        run, tiles = _runner(name, batch, device)
        if name in configs:
            tiles = [configs[name]]
        best = (float("inf"), None)
        for config in tiles:
            try:
                run(config)
            except Exception as err:  # a tile this layer cannot take: skipped, said so
                print(f"  {name} {config}: {type(err).__name__}: {str(err)[:120]}", file=sys.stderr, flush=True)
                continue
            ms = measure(lambda run=run, config=config: run(config), device=device, warmup=3, repeats=30).median
            best = min(best, (ms, config), key=lambda pair: pair[0])
        got = run(best[1]).cpu()
        path = reference / f"{name.replace(' ', '_').replace('>', '')}.pt"
        if form == "base" and not path.exists():
            torch.save(got, path)
        want = torch.load(path)
        steps = (got.int() - want.int()).abs()
        result[name] = {"ms": best[0], "config": best[1], "max_steps": int(steps.max()),
                        "off": float((steps > 0).float().mean())}  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--device", default="cuda", help="cuda; cpu checks the script under the Triton interpreter")
    parser.add_argument("--form", choices=list(FORMS), help=argparse.SUPPRESS)  # a child process's form
    parser.add_argument("--configs", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--reference", type=Path, help=argparse.SUPPRESS)  # where the base form's outputs are kept
    args = parser.parse_args()
    if args.form:
        device = torch.device(args.device)
        print(json.dumps(child(args.form, args.batch, json.loads(args.configs), args.reference, device)))
        return
    results: dict[str, dict] = {}
    configs: dict = {}
    reference = tempfile.TemporaryDirectory()  # the outputs compared between forms: large, not results
    for form in [*FORMS, "base"]:
        done = subprocess.run(
            [sys.executable, __file__, "--form", form, "--batch", str(args.batch), "--reference", reference.name,
             "--configs", json.dumps(configs), "--device", args.device],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode:
            print(f"{form}: failed\n{done.stderr[-2000:]}", flush=True)
            continue
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        configs = configs or {name: row["config"] for name, row in rows.items()}
        results[form if form not in results else "base again"] = rows
        line = "  ".join(f"{r['ms']:.4f} ({r['max_steps']}, {100 * r['off']:.3f}%)" for r in rows.values())
        print(f"{form:<18} {line}", flush=True)
    print("columns: " + " | ".join(LAYERS) + "; each: ms (largest difference from base in steps, % of outputs off)")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    meta = {"device": name, "date": time.strftime("%Y-%m-%d"), "batch": args.batch}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"int8-epilogue-b{args.batch}.json").write_text(json.dumps({**meta, "forms": results}, indent=1))


if __name__ == "__main__":
    main()
