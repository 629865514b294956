"""Row-wise Triton kernels over the last axis: softmax and layer normalization.

Both view their input as [rows, N] and give each program BLOCK_R rows of a BLOCK_N-wide tile, computing in
float32 and rounding once to the output type.

- `softmax(x)`: `exp(x − max) / Σ exp(x − max)` along the last axis. A row that fits one tile is read once;
  a longer row is streamed twice: an online pass keeps per-lane running maxima m and sums s
  (s ← s·e^(m − m') + e^(x − m')), then a second pass writes. A row of −inf gives NaN, as torch does.
- `layer_norm(x, scale, bias, epsilon)`: `(x − mean) / √(var + ε) · scale + bias` over the last axes
  (population variance), with scale and bias of the normalized shape. Rows longer than a tile take a pass
  for the mean, one for the variance (of x − mean: no cancellation) and one to write. With `y_scale` the
  float32 result is quantized onto the int8 or E4M3 grid of the output's type (the epilogues' `quantize`), and
  may also be written, rounded to a float type, into a second output (`copy`) in the same pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .epilogue import QUANT_CODES, quantize


def row_configs(effort: int) -> list[dict[str, int]]:
    """Tile sizes (elements per program, at most) and warps worth timing at `effort`. A transformer's 768-wide
    rows are 1.5 KB of fp16: 4 of them a program (BERT-base's layer norm at batch 64: 14 µs for 25 MB, 1.8 TB/s)
    leave little in flight per multiprocessor, 8 (13.2 µs) not much more; effort 0 also times one and two rows a
    program with 4 warps (no measurable change on BERT). `cuda.layernorm`, a warp a row, competes with these."""
    levels = [[(4096, 8), (8192, 8), (1024, 4), (2048, 4)], [(8192, 16)], [(16384, 16)]]
    chosen = levels[: max(0, min(effort, len(levels) - 1)) + 1]
    return [{"BLOCK": block, "num_warps": warps} for level in chosen for block, warps in level]


@triton.jit
def _softmax_kernel(
    x, y, ROWS, N, sxr, sxc, syr, syc,
    ONE_PASS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_in = (rows < ROWS)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    x_rows = x + rows.to(tl.int64)[:, None] * sxr
    y_rows = y + rows.to(tl.int64)[:, None] * syr
    if ONE_PASS:
        inside = rows_in & (cols < N)
        value = tl.load(x_rows + cols * sxc, mask=inside, other=float("-inf")).to(tl.float32)
        top = tl.max(value, axis=1)[:, None]
        e = tl.exp(value - top)
        e = tl.where(inside, e, 0.0)
        tl.store(y_rows + cols * syc, (e / tl.sum(e, axis=1)[:, None]).to(y.dtype.element_ty), mask=inside)
    else:
        m = tl.full((BLOCK_R, BLOCK_N), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_R, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            inside = rows_in & (cols + start < N)
            value = tl.load(x_rows + (cols + start) * sxc, mask=inside, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, value)
            empty = m_new == float("-inf")  # nothing but -inf seen in this lane yet
            s = tl.where(empty, 0.0, s * tl.exp(m - m_new) + tl.exp(value - m_new))
            m = m_new
        top = tl.max(m, axis=1)[:, None]
        total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - top)), axis=1)[:, None]
        for start in range(0, N, BLOCK_N):
            inside = rows_in & (cols + start < N)
            value = tl.load(x_rows + (cols + start) * sxc, mask=inside, other=float("-inf")).to(tl.float32)
            out = tl.exp(value - top) / total
            tl.store(y_rows + (cols + start) * syc, out.to(y.dtype.element_ty), mask=inside)


@triton.jit
def _layer_norm_kernel(
    x, scale, bias, y, copy, ROWS, N, sxr, sxc, syr, syc, epsilon, y_inv_scale,
    HAS_BIAS: tl.constexpr, QUANT: tl.constexpr, HAS_COPY: tl.constexpr, ONE_PASS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_in = (rows < ROWS)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    x_rows = x + rows.to(tl.int64)[:, None] * sxr
    y_rows = y + rows.to(tl.int64)[:, None] * syr
    copy_rows = copy + rows.to(tl.int64)[:, None] * N  # (contiguous, as y is when there is a copy)
    if ONE_PASS:
        inside = rows_in & (cols < N)
        value = tl.load(x_rows + cols * sxc, mask=inside, other=0.0).to(tl.float32)
        mean = tl.sum(value, axis=1)[:, None] / N
        centered = tl.where(inside, value - mean, 0.0)
        inv_std = 1.0 / tl.sqrt_rn(tl.sum(centered * centered, axis=1)[:, None] / N + epsilon)
        out = centered * inv_std * tl.load(scale + cols, mask=cols < N, other=0.0).to(tl.float32)
        if HAS_BIAS:
            out += tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(y_rows + cols * syc, _output(out, y, y_inv_scale, QUANT), mask=inside)
        if HAS_COPY:
            tl.store(copy_rows + cols, out.to(copy.dtype.element_ty), mask=inside)
    else:
        total = tl.zeros((BLOCK_R, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            inside = rows_in & (cols + start < N)
            total += tl.load(x_rows + (cols + start) * sxc, mask=inside, other=0.0).to(tl.float32)
        mean = tl.sum(total, axis=1)[:, None] / N
        squares = tl.zeros((BLOCK_R, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            inside = rows_in & (cols + start < N)
            value = tl.load(x_rows + (cols + start) * sxc, mask=inside, other=0.0).to(tl.float32)
            centered = tl.where(inside, value - mean, 0.0)
            squares += centered * centered
        inv_std = 1.0 / tl.sqrt_rn(tl.sum(squares, axis=1)[:, None] / N + epsilon)
        for start in range(0, N, BLOCK_N):
            in_row = cols + start < N
            inside = rows_in & in_row
            value = tl.load(x_rows + (cols + start) * sxc, mask=inside, other=0.0).to(tl.float32)
            out = (value - mean) * inv_std * tl.load(scale + cols + start, mask=in_row, other=0.0).to(tl.float32)
            if HAS_BIAS:
                out += tl.load(bias + cols + start, mask=in_row, other=0.0).to(tl.float32)
            tl.store(y_rows + (cols + start) * syc, _output(out, y, y_inv_scale, QUANT), mask=inside)
            if HAS_COPY:
                tl.store(copy_rows + cols + start, out.to(copy.dtype.element_ty), mask=inside)


@triton.jit
def _output(out, y, y_inv_scale, QUANT: tl.constexpr):
    """A float32 block as y's type: quantized (QUANT 1 int8, 2 E4M3) or rounded."""
    if QUANT != 0:
        return quantize(out, y_inv_scale, QUANT)
    else:
        return out.to(y.dtype.element_ty)


def softmax(x: torch.Tensor, *, out: torch.Tensor | None = None, config: dict[str, Any] | None = None) -> torch.Tensor:
    """Softmax of float `x` along its last axis, in `x`'s dtype or into `out` (same shape, any float type)."""
    rows_x, y, rows_y = _rows("softmax", x, out, x.shape[-1:])
    if y.numel() == 0:
        return y
    launch = _tiling(rows_x.shape, config)
    _softmax_kernel[launch.grid](
        rows_x, rows_y, *rows_x.shape, *rows_x.stride(), *rows_y.stride(),
        ONE_PASS=launch.one_pass, BLOCK_R=launch.block_r, BLOCK_N=launch.block_n, num_warps=launch.num_warps,
    )  # fmt: skip
    return y


def layer_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    out: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
    y_scale: float = 0.0,
    copy: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNormalization of float `x` over the axes [axis, rank) as ONNX defines it (stash type float32), with
    scale and bias broadcastable to the normalized shape, in `x`'s dtype or into `out`; with a positive `y_scale`,
    quantized into `out` (int8 or float8_e4m3fn) as `ops.fused.quantize_activation` quantizes, and, when `copy`
    (a contiguous float tensor of x's shape) is given, Y unquantized into it as well."""
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"layer_norm: axis {axis} is out of range for a rank-{x.dim()} input")
    quant = QUANT_CODES.get(out.dtype, 0) if out is not None and y_scale else 0
    if bool(y_scale) != bool(quant):
        raise ValueError(f"layer_norm: a y_scale needs an int8 or float8_e4m3fn out, and such an out a y_scale "
                         f"(got {y_scale}, out {None if out is None else out.dtype})")  # fmt: skip
    normalized = tuple(x.shape[axis % x.dim() :])
    rows_x, y, rows_y = _rows("layer_norm", x, out, normalized, quantized=bool(quant))
    n = rows_x.shape[1]
    flat_scale = _parameter("scale", scale, normalized, n)
    flat_bias = _parameter("bias", bias, normalized, n) if bias is not None else None
    if copy is not None:
        if not quant:
            raise ValueError("layer_norm: a copy of Y is written beside a quantized output only")
        _rows("layer_norm", x, copy, normalized)
        if not copy.is_contiguous():
            raise ValueError("layer_norm: the copy of Y must be contiguous")
    if y.numel() == 0:
        return y
    launch = _tiling(rows_x.shape, config)
    _layer_norm_kernel[launch.grid](
        rows_x, flat_scale, flat_bias if flat_bias is not None else flat_scale, rows_y,
        copy if copy is not None else rows_y, *rows_x.shape, *rows_x.stride(), *rows_y.stride(), float(epsilon),
        1.0 / y_scale if quant else 1.0, HAS_BIAS=flat_bias is not None, QUANT=quant, HAS_COPY=copy is not None,
        ONE_PASS=launch.one_pass,
        BLOCK_R=launch.block_r, BLOCK_N=launch.block_n, num_warps=launch.num_warps,
    )  # fmt: skip
    return y


def _rows(
    what: str, x: torch.Tensor, out: torch.Tensor | None, normalized: tuple[int, ...], quantized: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`x` as [rows, prod(normalized)] (a view when its strides allow), the output (float, or quantized) and its
    [rows, N] view."""
    if not x.is_floating_point() or x.dim() == 0:
        raise ValueError(f"{what}: needs a float tensor with at least one dim, got {x.dtype} {list(x.shape)}")
    n = math.prod(normalized)
    rows = x.reshape(-1, n) if n else x.reshape(0, 0)
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    wanted = "a quantized" if quantized else "a float"
    if tuple(y.shape) != tuple(x.shape) or y.device != x.device or (not quantized and not y.is_floating_point()):
        raise ValueError(f"{what}: out is {y.dtype} {list(y.shape)} on {y.device}, needs {wanted} {list(x.shape)}")
    try:
        rows_y = y.view(-1, n) if n else y.view(0, 0)
    except RuntimeError:
        raise ValueError(f"{what}: out's strides do not allow a [rows, {n}] view; pass a contiguous tensor") from None
    return rows, y, rows_y


def _parameter(name: str, tensor: torch.Tensor, normalized: tuple[int, ...], n: int) -> torch.Tensor:
    try:
        return tensor.broadcast_to(normalized).reshape(n).contiguous()
    except RuntimeError:
        raise ValueError(
            f"layer_norm: {name} of shape {list(tensor.shape)} does not broadcast to the normalized shape "
            f"{list(normalized)}"
        ) from None


@dataclass(frozen=True, slots=True)
class _Tiling:
    block_r: int
    block_n: int
    one_pass: bool
    grid: tuple[int]
    num_warps: int


def _tiling(shape: torch.Size, config: dict[str, Any] | None) -> _Tiling:
    """Rows per program and tile width: a whole row per tile when it fits `BLOCK`, several short rows too."""
    config = config or row_configs(0)[0]
    rows, n = shape
    block_n = min(triton.next_power_of_2(max(n, 1)), config["BLOCK"])
    block_r = max(1, min(config["BLOCK"] // block_n, triton.next_power_of_2(rows)))
    grid = (triton.cdiv(rows, block_r),)
    return _Tiling(block_r, block_n, n <= block_n, grid, config["num_warps"])
