"""Linear algebra: MatMul, Gemm, Einsum and Det.

Floats narrower than 32 bits compute in float32 and cast back. Integer contractions must stay exact, but
torch has integer matmul kernels only on the CPU: they run in float64 on the tensor's device when a bound
proves every partial sum exact (below 2**53, the common case), and otherwise in int64 on the CPU. Either
way the result wraps to the input type like an integer accumulator would.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .helpers import narrow, upcast
from .registry import OpContext, register

_EXACT_FLOAT64 = 2**53


def _contract(fn: Callable[..., torch.Tensor], *operands: torch.Tensor) -> torch.Tensor:
    """`fn(*operands)` for a multilinear `fn` (matmul, einsum), computed exactly for integer operands."""
    dtype = operands[0].dtype
    if dtype.is_floating_point:
        return fn(*(upcast(x) for x in operands)).to(dtype)
    wide = [x.double() for x in operands]
    bound = fn(*(x.abs() for x in wide))
    if bound.numel() == 0 or bound.max() < _EXACT_FLOAT64:
        return narrow(fn(*wide).to(torch.int64), dtype)
    exact = fn(*(x.cpu().to(torch.int64) for x in operands))
    return narrow(exact.to(operands[0].device), dtype)


@register("MatMul", since=1)
def matmul(ctx: OpContext, a, b):
    """numpy.matmul: 1-D operands are promoted to matrices and the added dimension removed."""
    return _contract(torch.matmul, a, b)


# -- Gemm --------------------------------------------------------------------------------------------------


def _gemm(a, b, c, alpha: float, beta: float, trans_a: int, trans_b: int) -> torch.Tensor:
    """alpha * A' @ B' + beta * C, with A' = A^T if transA (B' likewise) and C broadcast to (M, N); C is
    skipped when beta is 0. Integers stay exact for integral alpha and beta; otherwise the sum is taken
    in float64 and truncated, like numpy's `astype`."""
    dtype = a.dtype
    a, b = upcast(a), upcast(b)
    terms = [(_contract(torch.matmul, a.mT if trans_a else a, b.mT if trans_b else b), alpha)]
    if c is not None and beta != 0:
        terms.append((upcast(c), beta))
    if not dtype.is_floating_point:
        integral = all(float(scale).is_integer() for _, scale in terms)
        terms = [(t.to(torch.int64), int(s)) if integral else (t.double(), s) for t, s in terms]
    return narrow(sum(t if s == 1 else t * s for t, s in terms), dtype)


@register("Gemm", since=1)
def gemm_1(ctx: OpContext, a, b, c, *, alpha=1.0, beta=1.0, broadcast=0, transA=0, transB=0):
    """Before opset 7, C broadcasts only when `broadcast` is set; otherwise it must be (M, N)."""
    m = a.shape[1] if transA else a.shape[0]
    n = b.shape[0] if transB else b.shape[1]
    if not broadcast and tuple(c.shape) != (m, n):
        raise ValueError(f"C has shape {list(c.shape)}, expected [{m}, {n}] without broadcast")
    return _gemm(a, b, c, alpha, beta, transA, transB)


@register("Gemm", since=7)
def gemm_7(ctx: OpContext, a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """C broadcasts unidirectionally to (M, N); it is optional from opset 11."""
    return _gemm(a, b, c, alpha, beta, transA, transB)


# -- Einsum / Det ------------------------------------------------------------------------------------------


@register("Einsum", since=12)
def einsum(ctx: OpContext, *inputs, equation):
    """numpy.einsum semantics, including `...` and the implicit output (letters seen once, sorted)."""
    equation = equation.replace(" ", "")
    return _contract(lambda *xs: torch.einsum(equation, *xs), *inputs)


@register("Det", since=11)
def det(ctx: OpContext, x):
    """Determinant of each square matrix in the last two dimensions."""
    return torch.linalg.det(upcast(x)).to(x.dtype)
