"""What a GEMM's activation epilogue costs: our Triton GEMM with no activation, ReLU, the tanh GELU and the erf
GELU on the same product, beside cuBLAS (`torch.addmm`) followed by torch's GELU, in one run; on Hopper also the
warp-specialized Gluon GEMM (`kernels.gluon.gemm`), whose producer warp loads the next tiles during the epilogue.

The layers: ConvNeXt-Tiny's first-stage pw1 Linear at batch 64 (M = 64·56·56, K = 96, N = 384: two K steps, so
the epilogue is most of the kernel) and BERT-base's feed-forward up-projection at batch 64 (M = 64·128, K = 768,
N = 3072). Every config of `gemm_configs(effort)` and `gemm_tma_configs(effort)` is timed and the fastest kept;
each result is checked against torch's (float32) first.

    python bench/gemm_epilogue.py --out DIR      (writes gemm-epilogue.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.triton.gemm import gemm, gemm_configs, gemm_tma_configs
from tensorforge.ops.fused import apply_activation
from tensorforge.tactics.timing import measure

LAYERS = {"convnext pw1 56²": (64 * 56 * 56, 96, 384), "bert ff1": (64 * 128, 768, 3072)}
ACTIVATIONS = ("", "Relu", "GeluTanh", "Gelu")  # FusedGemm pre activations ("": none)
TOLERANCE = {torch.float16: 5e-3, torch.float32: 1e-4}  # normwise, against the float32 reference


def reference(a, b, bias, activation: str) -> torch.Tensor:
    return apply_activation(torch.addmm(bias.float(), a.float(), b.float()), activation)


def _fastest(label: str, runs, out: torch.Tensor, want: torch.Tensor, device, nothing: float) -> tuple[float, dict]:
    """The fastest correct (config, run) of `runs`, each writing `out`, as (ms, config); a config that cannot run is
    skipped and said so, a wrong result stops the benchmark; (`nothing`, {}) when none ran."""
    best = (nothing, {})
    for config, run in runs:
        try:
            out.fill_(float("nan"))
            run()
        except Exception as err:  # a config this device or layer cannot take: skipped, said so
            print(f"  {label} {config}: {type(err).__name__}: {err}"[:200], flush=True)
            continue
        error = ((out.float() - want).abs().max() / want.abs().max()).item()
        if not error <= TOLERANCE[out.dtype]:
            raise SystemExit(f"{label} {config}: wrong result, error {error:.2e}")
        ms = measure(run, device=device, warmup=3, repeats=20).median
        if not ms >= best[0]:
            best = (ms, config)
    return best


def ours(a, b, bias, activation: str, configs, device) -> tuple[float, dict]:
    """The fastest correct config of our GEMM with `activation` in its epilogue (ms, config)."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=device)
    runs = [(c, lambda c=c: gemm(a, b, bias, pre=activation, out=out, config=c)) for c in configs]
    return _fastest(activation, runs, out, reference(a, b, bias, activation), device, math.inf)


def warp_specialized(a, b, bias, activation: str, device) -> tuple[float, dict]:
    """The fastest correct config of the Gluon warp-specialized GEMM (ms, config); (nan, {}) where this Triton or
    device has none."""
    try:
        from tensorforge.kernels.gluon.gemm import GemmConfig, gemm_ws
        from tensorforge.tactics.gluon_gemm import gemm_ws_configs
    except ImportError:
        return math.nan, {}
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return math.nan, {}
    k_major = b.T.contiguous()
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=device)
    pre = activation_args(activation)
    tiles = [(c, GemmConfig(**c)) for c in gemm_ws_configs(1)]
    runs = [(c, lambda t=t: gemm_ws(a, k_major, out, t, bias=bias, pre=pre)) for c, t in tiles]
    return _fastest(f"gluon {activation}", runs, out, reference(a, b, bias, activation), device, math.nan)


def cublas(a, b, bias, activation: str, device) -> float:
    """cuBLAS's product and bias, then the activation as torch's own kernel (what a framework runs; the
    reference's `apply_activation` computes GELU in float64)."""
    torch_activation = {
        "": lambda y: y,
        "Relu": F.relu,
        "GeluTanh": lambda y: F.gelu(y, approximate="tanh"),
        "Gelu": F.gelu,
    }[activation]
    return measure(lambda: torch_activation(torch.addmm(bias, a, b)), device=device, warmup=3, repeats=20).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--effort", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="M multiplier (small values check the script)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    configs = gemm_configs(args.effort) + (gemm_tma_configs(args.effort) if device.type == "cuda" else [])
    rows = []
    print(f"{'layer':<18}{'epilogue':<10}{'ours ms':>9}{'gluon ws ms':>13}{'cuBLAS+torch ms':>17}", flush=True)
    for name, (m, k, n) in LAYERS.items():
        m = max(1, int(m * args.scale))
        torch.manual_seed(0)
        a = torch.randn(m, k, device=device).to(dtype)
        b = (torch.randn(k, n, device=device) / k**0.5).to(dtype)
        bias = torch.randn(n, device=device).to(dtype)
        for activation in ACTIVATIONS:
            ms, config = ours(a, b, bias, activation, configs, device)
            ws_ms, ws_config = warp_specialized(a, b, bias, activation, device)
            vendor = cublas(a, b, bias, activation, device)
            rows.append({"layer": name, "m": m, "k": k, "n": n, "activation": activation, "ours_ms": ms,
                         "config": config, "gluon_ws_ms": ws_ms, "gluon_ws_config": ws_config,
                         "cublas_torch_ms": vendor})  # fmt: skip
            print(f"{name:<18}{activation or 'none':<10}{ms:>9.4f}{ws_ms:>13.4f}{vendor:>17.4f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    meta = {"device": device_name, "date": time.strftime("%Y-%m-%d"), "dtype": str(dtype), "effort": args.effort}
    (args.out / "gemm-epilogue.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
