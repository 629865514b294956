"""1×1 stride-1 convolutions as a GEMM whose operands the Tensor Memory Accelerator moves (Hopper's TMA).

An unpadded 1×1 convolution of one group with stride 1 over channels_last tensors is the product of two
matrices with no gather at all: the input's pixels are the rows of X [M, Cin] (M = N·H·W), the output's the
rows of Y [M, Cout]. When those rows sit at one stride from each other (a dense NHWC tensor, or a channel slice
of a wider one, as a concatenation's input) each operand is one 2-D tensor descriptor: a K tile arrives in
shared memory as one bulk copy, already in the swizzled layout the tensor cores read, with no address
arithmetic or per-element masks in the loop (rows and channels past the end read as zeros), and the result
leaves through shared memory in whole rows. The pointer-gathering kernel of `kernels.triton.conv` spends its
issue slots on addresses and masks and stores each thread's few scattered elements; on the memory-bound 1×1
layers of ResNet-style blocks (few input channels, many pixels) that, not the arithmetic, sets the time.

The epilogue is `kernels.triton.conv`'s: dequantization (`acc · x_scale · w_scale[n]` for int8 / E4M3),
bias, pre-activation, residual (read with its own descriptor, dequantized by z_scale when quantized), post-
activation, then a cast or a requantization (`y_scale`) as it is stored.

`launch` runs it when the geometry (`tma_problem`) and every operand allow: rows 16-byte aligned at one stride,
channels innermost, a K-major or contiguous packed weight, a residual of the output's shape in the same row
layout (`launch` says which operand does not); `conv`'s launcher falls back to the gathering kernel with the
same tiles otherwise, so a `tma` configuration is valid for every call.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .epilogue import activate, quantize

_ALIGN_BYTES = 16  # TMA: global addresses and every stride but the last in multiples of 16 bytes


@triton.jit
def _conv1x1_tma(
    a_desc, b_desc, z_desc, y_desc, bias, w_scale,
    M, N, K,
    pre0, pre1, post0, post1, x_scale, x_inv_scale, y_inv_scale, z_scale,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
    QUANT: tl.constexpr, QUANTIZE_X: tl.constexpr, QUANT_Y: tl.constexpr, W_K_MAJOR: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] tile of Y = epilogue(X · W): X rows through a_desc, W through b_desc ([N, K] when
    W_K_MAJOR, else [K, N]), the residual through z_desc, Y through y_desc. Programs are swizzled as in
    `conv._conv2d_igemm` (GROUP_M row tiles sweep the column tiles together, sharing weight columns in L2)."""
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_tiles
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(m_tiles - first_m, GROUP_M)
    off_m = (first_m + (pid % per_group) % group_rows) * BLOCK_M
    off_n = ((pid % per_group) // group_rows) * BLOCK_N

    if QUANT == 1:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k = kt * BLOCK_K
        a = a_desc.load([off_m, k])  # zeros past M and K: they add nothing (and quantize to 0)
        if QUANTIZE_X:
            a = quantize(a, x_inv_scale, QUANT)
        if W_K_MAJOR:
            b = b_desc.load([off_n, k]).T
        else:
            b = b_desc.load([k, off_n])
        if QUANT == 1:
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        elif QUANT == 2:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)  # see conv._conv2d_igemm
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    cols = off_n + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if QUANT != 0:
        acc = acc.to(tl.float32) * (x_scale * tl.load(w_scale + cols, mask=col_ok, other=0.0))[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    acc = activate(acc, PRE, pre0, pre1)
    if HAS_RES:
        acc += z_desc.load([off_m, off_n]).to(tl.float32) * z_scale
    acc = activate(acc, POST, post0, post1)
    if QUANT_Y != 0:
        out = quantize(acc, y_inv_scale, QUANT_Y)
    else:
        out = acc.to(y_desc.dtype)
    y_desc.store([off_m, off_n], out)  # rows and channels past the end are not written


def _rows(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(rows, channels, row stride) of a 4-D (N, C, H, W) tensor whose pixels are rows of contiguous channels
    at one stride (channels_last, or a channel slice of a wider channels_last tensor); None otherwise."""
    n, c, h, w = t.shape
    row = t.stride(3) if w > 1 else (t.stride(2) if h > 1 else t.stride(0))
    if c > 1 and t.stride(1) != 1:
        return None
    wanted = {0: (h * w * row, n), 2: (w * row, h), 3: (row, w)}
    if any(size > 1 and t.stride(axis) != stride for axis, (stride, size) in wanted.items()):
        return None
    return n * h * w, c, row


def _aligned(t: torch.Tensor, row: int) -> bool:
    return t.data_ptr() % _ALIGN_BYTES == 0 and (row * t.element_size()) % _ALIGN_BYTES == 0


def _matrix(t: torch.Tensor, block: list[int]) -> TensorDescriptor | str:
    """The descriptor of a 4-D channels_last-rows tensor as its [rows, channels] matrix, or why there is none."""
    rows = _rows(t)
    if rows is None:
        return f"its strides {list(t.stride())} are not rows of contiguous channels at one stride"
    m, c, row = rows
    if not _aligned(t, row):
        return f"its rows ({row} elements of {t.element_size()} bytes from {t.data_ptr():#x}) are not 16-byte aligned"
    return TensorDescriptor(t, [m, c], [row, 1], block)


def _weight_matrix(weight: torch.Tensor, k_major: bool, block_n: int, block_k: int) -> TensorDescriptor | str:
    """The packed (1, 1, 1, Cin, Cout) weight as an [N, K] (K-major) or [K, N] matrix descriptor."""
    _, _, _, cin, cout = weight.shape
    if k_major:
        shape, strides, block = [cout, cin], [weight.stride(4), 1], [block_n, block_k]
    else:
        shape, strides, block = [cin, cout], [weight.stride(3), 1], [block_k, block_n]
    if not _aligned(weight, strides[0]):
        return "the packed weight's rows are not 16-byte aligned (channels × element size a multiple of 16)"
    return TensorDescriptor(weight, shape, strides, block)


def tma_problem(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, geometry: tuple) -> str | None:
    """Why the call's geometry rules the TMA kernel out; None when only the operands' rows remain to check.
    `geometry`: (strides, pads_begin, out_hw) as `conv._launch` has them."""
    strides, pads_begin, out_hw = geometry
    groups, kh, kw, _, _ = weight.shape
    if (groups, kh, kw) != (1, 1, 1):
        return f"1×1 convolutions of one group only (weight {groups} groups of {kh}×{kw})"
    if tuple(strides) != (1, 1) or any(pads_begin) or tuple(out_hw) != tuple(x.shape[2:]):
        return "stride 1 and no padding only"
    if residual is not None and any(s == 0 for s, n in zip(residual.stride(), residual.shape, strict=True) if n > 1):
        return "the residual is broadcast"
    if x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < (9, 0):
        return "tensor descriptors need compute capability 9.0 (Hopper) or newer"
    return None


def launch(
    x: torch.Tensor, weight: torch.Tensor, k_major: bool, bias: torch.Tensor | None, residual: torch.Tensor | None,
    y: torch.Tensor, geometry: tuple, pre, post, cfg, *, dot_precision: str, quant: int,
    weight_scale: torch.Tensor | None, x_scale: float, y_scale: float, z_scale: float,
) -> str | None:  # fmt: skip
    """Run the TMA kernel into `y` (operands checked by `conv`'s callers; `geometry` as `tma_problem` takes it);
    returns why it did not run (`tma_problem`'s reason, an operand's rows not at one stride or not 16-byte
    aligned), None when it ran."""
    problem = tma_problem(x, weight, residual, geometry)
    if problem:
        return problem
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    descriptors: list[Any] = [
        _matrix(x, [bm, bk]),
        _weight_matrix(weight, k_major, bn, bk),
        _matrix(residual, [bm, bn]) if residual is not None else None,
        _matrix(y, [bm, bn]),
    ]
    for problem in descriptors:
        if isinstance(problem, str):
            return problem
    a_desc, b_desc, z_desc, y_desc = descriptors
    m, k = a_desc.shape
    n = y_desc.shape[1]
    scales = weight_scale if weight_scale is not None else y
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _conv1x1_tma[grid](
        a_desc, b_desc, z_desc if z_desc is not None else y_desc, y_desc, bias if bias is not None else y, scales,
        m, n, k, *pre[1:], *post[1:], x_scale, 1.0 / x_scale, 1.0 / y_scale if y_scale else 1.0,
        z_scale if z_scale else 1.0,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, PRE=pre[0], POST=post[0], QUANT=quant,
        QUANTIZE_X=quant != 0 and x.dtype != weight.dtype, QUANT_Y=quant if y_scale else 0, W_K_MAJOR=k_major,
        DOT_PRECISION=dot_precision, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return None
