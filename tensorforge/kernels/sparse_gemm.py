"""Products with a 2:4-sparse weight on the sparse tensor cores (Ampere and later), through torch's two backends.

`compress(W, backend)` packs a weight W [N, K] with at most two nonzeros in every four along K (fp16, bf16 or int8,
on CUDA) once; `sparse_linear(rows, weight, bias)` computes `rows · Wᵀ + bias`, [M, N], with it (int8 operands:
exact int32 sums, `out_dtype=torch.int32`).

- "cusparselt": NVIDIA's cuSPARSELt (`torch._cslt_compress`, `torch._cslt_sparse_mm`). It multiplies the sparse
  operand on the left, so the product is W · rowsᵀ, written transposed (`transpose_result`): [M, N] row-major
  without a copy. Its algorithm (`alg_id`) is the caller's to choose: the autotuner times them as configurations,
  rather than cuSPARSELt's own search (`torch._cslt_sparse_mm_search`), which on an H100 failed inside the library
  in fp16 with `transpose_result` ("internal error"). Bias inside. Eagerly each call costs 0.3 ms to hundreds of ms
  of host-side setup (fp16 with `transpose_result`); a CUDA-graph replay skips it.
- "cutlass": PyTorch's CUTLASS kernels (`torch._to_sparse_semi_structured`, `torch._sparse_semi_structured_linear`),
  with the bias and a ReLU or SiLU inside; Ampere and Ada only (compute capability 8.x).

Shapes (torch's rules): W's N and K multiples of 16 for cuSPARSELt, of 32 and 64 for CUTLASS in fp16 and bf16;
in int8 of 32 and 32, and of 16 and 128. Rows of any count (padded here to a multiple of 8, 16 in int8, when
needed, and the padding's rows dropped after).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BACKENDS = ("cusparselt", "cutlass")
# cuSPARSELt's algorithms (`alg_id`) timed at each tuning effort, the likeliest first (the tuner's first round times
# only a tactic's first configuration): on an H100 (cuSPARSELt 0.8) 1 was the fastest on 10 of 13 fp16 products of
# BERT-base and ResNet-50, 0 on one, 2 and 3 on the small ones (bench/sparse_gemm.py)
CUSPARSELT_ALGORITHMS = {0: (1, 0), 1: (1, 0, 2, 3), 2: (1, 0, *range(2, 8))}
# (N, K) multiples by backend and whether the operands are int8
_WEIGHT_MULTIPLES = {
    ("cusparselt", False): (16, 16),
    ("cutlass", False): (32, 64),
    ("cusparselt", True): (32, 32),
    ("cutlass", True): (16, 128),
}
# our activation names the CUTLASS kernels apply in their epilogue, and theirs
CUTLASS_ACTIVATIONS = {"Relu": "relu", "Swish": "silu"}


def backend_problem(backend: str) -> str | None:
    """Why this torch build, on this machine's current GPU if it has one, cannot run `backend`, or None."""
    if backend == "cusparselt" and not torch.backends.cusparselt.is_available():
        return "this torch build has no cuSPARSELt"
    if backend == "cutlass":
        if not hasattr(torch, "_sparse_semi_structured_linear"):
            return "this torch build has no CUTLASS semi-structured product"
        # torch's CUTLASS kernels are built for sm_80-sm_89 only: on a Hopper GPU compressing a weight runs an
        # illegal instruction, which poisons the whole CUDA context, so the backend must never be tried there
        if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 8:
            major, minor = torch.cuda.get_device_capability()
            return f"PyTorch's CUTLASS sparse kernels run only on compute capability 8.x, not {major}.{minor}"
    return None


def shape_problem(n: int, k: int, backend: str, int8: bool = False) -> str | None:
    """Why `backend` cannot take a weight of [n, k] (of int8 when `int8`, else 16-bit floats), or None."""
    rows, columns = _WEIGHT_MULTIPLES[backend, int8]
    if n % rows or k % columns:
        return f"{backend} needs N a multiple of {rows} and K of {columns}, not {n} × {k}"
    return None


@dataclass
class SparseWeight:
    """A weight packed for one backend (CUTLASS's also has its metadata apart)."""

    backend: str
    packed: torch.Tensor
    meta: torch.Tensor | None = None


def compress(matrix: torch.Tensor, backend: str) -> SparseWeight:
    """`matrix` [N, K] (2:4 along K, fp16, bf16 or int8, CUDA) packed for `backend`."""
    matrix = matrix.contiguous()
    if backend == "cusparselt":
        return SparseWeight(backend, torch._cslt_compress(matrix))
    packed, meta = torch._to_sparse_semi_structured(matrix)
    return SparseWeight(backend, packed, meta)


def sparse_linear(
    rows: torch.Tensor,
    weight: SparseWeight,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    algorithm: int = 0,
) -> torch.Tensor:
    """`rows · Wᵀ + bias` [M, N], in rows' type or `out_dtype` (int8 rows: torch.int32 for exact sums);
    `activation` ("relu", "silu") only on CUTLASS, inside its kernel; `algorithm` cuSPARSELt's `alg_id`. `bias`
    is [N] in the output's type."""
    count = rows.shape[0]
    padding = -count % (16 if rows.dtype == torch.int8 else 8)
    if padding:
        rows = F.pad(rows, (0, 0, 0, padding))
    if weight.backend == "cusparselt":
        if activation is not None:
            raise ValueError("cuSPARSELt's product here applies no activation")
        y = torch._cslt_sparse_mm(
            weight.packed, rows.t(), bias=bias, out_dtype=out_dtype, transpose_result=True, alg_id=algorithm
        )
    else:
        y = torch._sparse_semi_structured_linear(
            rows, weight.packed, weight.meta, bias=bias, activation=activation, out_dtype=out_dtype
        )
    return y[:count] if padding else y
