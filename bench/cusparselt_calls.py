"""Which of torch's cuSPARSELt calls work on this GPU, and what each costs eagerly: every case in a process of its
own, since a CUDA error that loses the context (an illegal instruction) would fail every case after it.

A case is (type, M, K, N, transpose_result, algorithm or "search"): the product `rows · Wᵀ` of a 2:4 weight W
[N, K] with rows [M, K] through `torch._cslt_sparse_mm` (the algorithm from `_cslt_sparse_mm_search` for
"search"), its error against the float64 product, and its eager time beside the dense product's (20 calls
between CUDA events, after 3: eager, so host-side work counts; `bench/sparse_gemm.py` times graph replays).

    python bench/cusparselt_calls.py --out DIR      (writes cusparselt-calls.json, prints a line a case)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHAPES = [(112, 128, 64), (256, 128, 64), (8192, 768, 3072), (8192, 3072, 768), (12544, 1024, 256)]
CALLS = 20


def _case(dtype: str, m: int, k: int, n: int, transpose: bool, mode: str) -> dict:
    """Run one case here (in the child process) and return its result."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(0)
    if dtype == "int8":
        w = torch.randint(-8, 8, (n, k), device="cuda", generator=generator, dtype=torch.int8)
        x = torch.randint(-8, 8, (m, k), device="cuda", generator=generator, dtype=torch.int8)
        out_dtype, dense = torch.int32, lambda: torch._int_mm(x, w.t())
    else:
        kind = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        w = torch.randn(n, k, device="cuda", generator=generator).to(kind)
        x = torch.randn(m, k, device="cuda", generator=generator).to(kind)
        out_dtype, dense = None, lambda: x @ w.t()
    w = w * torch.tensor([1, 1, 0, 0], device="cuda", dtype=w.dtype).repeat(n, k // 4)
    packed = torch._cslt_compress(w)
    if mode == "search":
        algorithm = torch._cslt_sparse_mm_search(packed, x.t(), out_dtype=out_dtype, transpose_result=transpose)
    else:
        algorithm = int(mode)

    def sparse():
        return torch._cslt_sparse_mm(packed, x.t(), out_dtype=out_dtype, transpose_result=transpose, alg_id=algorithm)

    y = sparse()
    got = (y if transpose else y.t()).double()
    want = x.double() @ w.double().t()
    error = float((got - want).norm() / want.norm())
    return {"algorithm": int(algorithm), "error": error, "ms": _eager_ms(sparse), "dense_ms": _eager_ms(dense)}


def _eager_ms(fn) -> float:
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / CALLS


def _run(case: tuple) -> dict:
    """One case in a fresh process, with CUDA_LAUNCH_BLOCKING so that an error surfaces at its own call."""
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    done = subprocess.run(
        [sys.executable, __file__, "--case", *map(str, case)], capture_output=True, text=True, env=env, timeout=120
    )
    row = dict(zip(("dtype", "m", "k", "n", "transpose_result", "mode"), case, strict=True))
    if done.returncode == 0:
        return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}
    errors = [line for line in done.stderr.splitlines() if "Error" in line] or done.stderr.splitlines()[-1:]
    return {**row, "failed": errors[-1] if errors else f"exit {done.returncode}"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument(
        "--workers", type=int, default=1, help="cases run at once, each its own process (faster; the times disturbed)"
    )
    parser.add_argument("--case", nargs=6, help=argparse.SUPPRESS)  # (how each child is started)
    args = parser.parse_args(argv)
    if args.case:
        dtype, m, k, n, transpose, mode = args.case
        print(json.dumps(_case(dtype, int(m), int(k), int(n), transpose == "True", mode)))
        return
    import torch

    cases = [
        (dtype, m, k, n, transpose, mode)
        for dtype in ("fp16", "int8")
        for m, k, n in SHAPES
        for transpose in (True, False)
        for mode in ("0", "search")
    ]
    cases += [("fp16", 8192, 768, 3072, True, str(algorithm)) for algorithm in range(1, 6)]
    versions = f"torch {torch.__version__}, cuSPARSELt {torch.backends.cusparselt.version()}"
    print(f"{versions}, {torch.cuda.get_device_name()}")
    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(_run, cases))
    for row in rows:
        print(json.dumps(row))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cusparselt-calls.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
