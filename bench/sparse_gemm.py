"""Where 2:4 sparsity pays: products with a 2:4-pruned weight on the sparse tensor cores (cuSPARSELt and CUTLASS,
`kernels.sparse_gemm`) beside the dense product of the same pruned weight (cuBLAS through `torch.addmm`, and
`torch._int_mm` in int8, with W row-major as `vendor.cublas-int8` holds it and as W's transposed view: the vendor
baselines the dense tactics compete with), in fp16 and in int8 (int32 sums), in one run, timed in interleaved
rounds (CUDA graphs, L2 flushed: `tactics.timing.measure_interleaved`).

Products are BERT-base's at batch 64 × sequence 128 and ResNet-50's 1×1 convolutions as products over pixel rows
at batch 256 (and at batch 1 / 8 for latency). Each row: M, K, N, the dense median, each backend's median and the
dense/sparse ratio (over 1: sparse is faster; cuSPARSELt at the best of four algorithms), and each backend's error
against the float64 product (int8: exact).

    python bench/sparse_gemm.py --out DIR      (writes sparse-gemm.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.sparse_gemm import (
    BACKENDS,
    CUSPARSELT_ALGORITHMS,
    backend_problem,
    compress,
    shape_problem,
    sparse_linear,
)
from tensorforge.ops.structured_sparsity import prune_2to4
from tensorforge.tactics.autotune import relative_error
from tensorforge.tactics.timing import first_line, measure_interleaved

# (name, M, K, N): rows · Wᵀ with W [N, K]
PRODUCTS = [
    ("bert qkv b64", 8192, 768, 2304),
    ("bert out b64", 8192, 768, 768),
    ("bert ff1 b64", 8192, 768, 3072),
    ("bert ff2 b64", 8192, 3072, 768),
    ("bert ff1 b1", 128, 768, 3072),
    ("resnet layer1 1x1 in b256", 256 * 56 * 56, 256, 64),
    ("resnet layer1 1x1 out b256", 256 * 56 * 56, 64, 256),
    ("resnet layer2 1x1 out b256", 256 * 28 * 28, 128, 512),
    ("resnet layer3 1x1 in b256", 256 * 14 * 14, 1024, 256),
    ("resnet layer3 1x1 out b256", 256 * 14 * 14, 256, 1024),
    ("resnet layer4 1x1 in b256", 256 * 7 * 7, 2048, 512),
    ("resnet layer4 1x1 out b256", 256 * 7 * 7, 512, 2048),
    ("resnet layer4 1x1 out b8", 8 * 7 * 7, 512, 2048),
]


def _operands(m, k, n, dtype, device, generator):
    """Rows [M, K], a 2:4-pruned weight W [N, K] and a bias [N] (None in int8), in `dtype`, and the float64
    product with the bias."""
    x = torch.randn(m, k, device=device, generator=generator)
    w = prune_2to4(torch.randn(n, k, device=device, generator=generator) / k**0.5)
    if dtype == "int8":
        x = (x * 40).round().clamp(-127, 127).to(torch.int8)
        w = (w * 127 / w.abs().amax()).round().to(torch.int8)
        return x, w, None, x.double() @ w.double().t()
    x, w, bias = x.half(), w.half(), torch.randn(n, device=device, generator=generator).half()
    return x, w, bias, torch.addmm(bias.double(), x.double(), w.double().t())


def _product(name, m, k, n, dtype, device, generator, rounds) -> dict:
    """One product's row: the dense forms and each backend timed in interleaved rounds, with their errors; each
    backend's ratio is to the fastest dense form."""
    x, w, bias, want = _operands(m, k, n, dtype, device, generator)
    out_dtype = torch.int32 if dtype == "int8" else None
    if dtype == "int8":  # cuBLAS's int8 product with W as [K, N] row-major (vendor.cublas-int8's), and as W's view
        weight_kn = w.t().contiguous()
        candidates = {"dense": lambda: torch._int_mm(x, weight_kn), "dense-wt": lambda: torch._int_mm(x, w.t())}
    else:
        candidates = {"dense": lambda: torch.addmm(bias, x, w.t())}
    problems = {}
    for backend in BACKENDS:
        problem = backend_problem(backend) or shape_problem(n, k, backend, dtype == "int8")
        if problem:
            problems[backend] = problem
            continue
        packed = compress(w, backend)
        for algorithm in CUSPARSELT_ALGORITHMS[1] if backend == "cusparselt" else (0,):
            label = f"{backend}/{algorithm}" if backend == "cusparselt" else backend
            candidates[label] = lambda packed=packed, algorithm=algorithm: sparse_linear(
                x, packed, bias, out_dtype=out_dtype, algorithm=algorithm
            )
    forms, errors = {}, {}
    for label, form in candidates.items():
        try:
            errors[label] = relative_error(form(), want)
            forms[label] = form
        except Exception as err:  # reported in the row (cuBLAS refuses some int8 shapes), the others still timed
            problems[label] = f"{type(err).__name__}: {first_line(err)}"
    timed = measure_interleaved(list(forms.values()), device=device, rounds=rounds)
    medians = {label: t.median for label, t in zip(forms, timed, strict=True)}
    dense = min((t for label, t in medians.items() if label.startswith("dense")), default=float("nan"))
    best = {b: min(((t, x) for x, t in medians.items() if x.split("/")[0] == b), default=None) for b in BACKENDS}
    best = {b: found for b, found in best.items() if found}  # (a backend with nothing that ran has no cell)
    cells = [f"{best[b][0]:.4f} ({dense / best[b][0]:.2f}x) {best[b][1]}" if b in best else "n/a" for b in BACKENDS]
    print(f"{name:28} {dtype:>5} {m:>7} {k:>5} {n:>5} {dense:9.4f} " + " ".join(f"{c:>30}" for c in cells))
    return {
        "product": name, "dtype": dtype, "m": m, "k": k, "n": n, "median_ms": medians,
        "speedup_over_dense": {label: dense / t for label, t in medians.items() if not label.startswith("dense")},
        "relative_error": errors, "not_run": problems,
        "timing_errors": {label: t.error for label, t in zip(forms, timed, strict=True) if t.error},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", nargs="+", choices=("fp16", "int8"), default=["fp16", "int8"])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    generator = torch.Generator(device).manual_seed(0)
    rows_out = []
    print(
        f"{'product':28} {'type':>5} {'M':>7} {'K':>5} {'N':>5} {'dense ms':>9} "
        + " ".join(f"{b + ' (best)':>30}" for b in BACKENDS)
    )
    for name, m, k, n in PRODUCTS:
        for dtype in args.dtype:
            rows_out.append(_product(name, m, k, n, dtype, device, generator, args.rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cusparselt": torch.backends.cusparselt.version() if torch.backends.cusparselt.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
        "products": rows_out,
    }
    (args.out / "sparse-gemm.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
