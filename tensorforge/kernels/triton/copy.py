"""Copies between tensors of any strides (converting the float type on the way), and the concatenation and layout
change (`relayout`: NCHW ↔ NHWC with a cast, a `Reformat`) built on them.

torch's `cat` and `copy_` move a tensor whose strides disagree with the destination's (a channels_last
convolution output reshaped to [N, C, H·W] and concatenated along the pixels, as a detector's heads do) one
scattered element at a time: on the H200, 0.57 ms for 155 MB, about 0.5 TB/s. Here both sides are collapsed to at
most three dimensions and copied in [BLOCK_A × BLOCK_B] tiles of the last two: each tile is loaded along the
source's contiguous dimension and stored along the destination's (Triton moves it between the two layouts
through shared memory), so both sides are read and written in whole lines.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .epilogue import QUANT_CODES, quantize

_TILED_TYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})


@triton.jit
def _strided_copy(
    src, dst, D1, D2,
    s0, s1, s2,
    d0, d1, d2,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    """dst[i, a, b] = src[i, a, b] for the [BLOCK_A, BLOCK_B] tile `program_id(0)` of the (D0, D1, D2) box."""
    pid = tl.program_id(0)
    tiles_b = tl.cdiv(D2, BLOCK_B)
    tiles_a = tl.cdiv(D1, BLOCK_A)
    b = pid % tiles_b
    rest = pid // tiles_b
    i = (rest // tiles_a).to(tl.int64)
    ia = ((rest % tiles_a) * BLOCK_A + tl.arange(0, BLOCK_A)).to(tl.int64)
    ib = (b * BLOCK_B + tl.arange(0, BLOCK_B)).to(tl.int64)
    mask = (ia < D1)[:, None] & (ib < D2)[None, :]
    values = tl.load(src + i * s0 + (ia * s1)[:, None] + (ib * s2)[None, :], mask=mask)
    tl.store(dst + i * d0 + (ia * d1)[:, None] + (ib * d2)[None, :], values.to(dst.dtype.element_ty), mask=mask)


def tiled(src: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a copy of `src` into a tensor of `dtype` runs the tiled copy here: on CUDA, between float32, float16
    and bfloat16 (8-bit and integer types, and CPU tensors, keep torch's copy)."""
    return src.is_cuda and src.dtype in _TILED_TYPES and dtype in _TILED_TYPES


def copy_configs(effort: int) -> list[dict[str, int]]:
    """Tiles worth timing at `effort` (the two tiled dimensions, warps)."""
    configs = [{"block_a": 64, "block_b": 64, "num_warps": 4}, {"block_a": 32, "block_b": 128, "num_warps": 4}]
    if effort >= 1:
        configs += [{"block_a": 128, "block_b": 32, "num_warps": 4}, {"block_a": 64, "block_b": 128, "num_warps": 8}]
    return configs


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """`shape` and the `strides` of several tensors of that shape with dimensions of size 1 dropped and neighbours
    merged wherever every tensor steps over them as over one dimension; ([], ...) for a single element."""
    dims = [d for d, size in enumerate(shape) if size != 1]
    sizes = [shape[d] for d in dims]
    merged = [[s[d] for d in dims] for s in strides]
    d = len(sizes) - 1
    while d > 0:
        if all(s[d - 1] == s[d] * sizes[d] for s in merged):
            sizes[d - 1] *= sizes[d]
            del sizes[d]
            for s in merged:
                s[d - 1] = s[d]
                del s[d]
        d -= 1
    return sizes, merged


def strided_copy(
    src: torch.Tensor, dst: torch.Tensor, *, block_a: int = 64, block_b: int = 64, num_warps: int = 4
) -> torch.Tensor:
    """`dst` (any strides) overwritten with `src` (same shape, any strides; the same type, or both floating point:
    converted as it is stored, rounding to nearest even as torch does); returns dst. A copy that is one contiguous
    run on both sides, or whose strides do not collapse to three dimensions, is torch's."""
    same_kind = src.dtype == dst.dtype or (src.is_floating_point() and dst.is_floating_point())
    if tuple(src.shape) != tuple(dst.shape) or not same_kind or src.device != dst.device:
        raise ValueError(
            f"strided_copy: src is {src.dtype} {list(src.shape)} on {src.device}, dst {dst.dtype} {list(dst.shape)}"
            f" on {dst.device}: shapes and devices must agree, types too unless both are floating point"
        )
    sizes, (src_strides, dst_strides) = collapse(src.shape, src.stride(), dst.stride())
    if src.numel() == 0:
        return dst
    if len(sizes) > 3 or (len(sizes) == 1 and src_strides == dst_strides == [1]):
        return dst.copy_(src)
    pad = 3 - len(sizes)
    sizes = [1] * pad + sizes
    src_strides = [0] * pad + src_strides
    dst_strides = [0] * pad + dst_strides
    block_a, block_b = fit_tile(block_a, block_b, sizes[1], sizes[2])
    grid = (sizes[0] * triton.cdiv(sizes[1], block_a) * triton.cdiv(sizes[2], block_b),)
    _strided_copy[grid](
        src, dst, sizes[1], sizes[2], *src_strides, *dst_strides,
        BLOCK_A=block_a, BLOCK_B=block_b, num_warps=num_warps,
    )  # fmt: skip
    return dst


def fit_tile(block_a: int, block_b: int, d1: int, d2: int) -> tuple[int, int]:
    """The [block_a, block_b] tile reshaped, same number of elements, to a box of d1 × d2 (powers of two): a side
    longer than its dimension shrinks to it and the other grows (a 3-channel image's NCHW → NHWC copy moves 4 × 1024
    tiles, not 64 × 64 ones with 61 rows masked)."""
    total = block_a * block_b
    a = min(block_a, triton.next_power_of_2(d1))
    b = min(total // a, triton.next_power_of_2(d2))
    return min(total // b, triton.next_power_of_2(d1)), b


def relayout(
    x: torch.Tensor,
    dtype: torch.dtype,
    memory_format: torch.memory_format,
    *,
    block_a: int = 64,
    block_b: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`x` as a new tensor of float type `dtype` in `memory_format` (NCHW ↔ NHWC and a cast in one pass)."""
    out = torch.empty(x.shape, dtype=dtype, device=x.device, memory_format=memory_format)
    return strided_copy(x, out, block_a=block_a, block_b=block_b, num_warps=num_warps)


def concat(
    inputs: Sequence[torch.Tensor],
    axis: int,
    out: torch.Tensor | None = None,
    *,
    block_a: int = 64,
    block_b: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`inputs` (any strides) concatenated along `axis` into `out` (any strides; by default a new contiguous
    tensor), one `strided_copy` per input into its slice."""
    if not inputs:
        raise ValueError("concat: no inputs")
    first = inputs[0]
    rank = first.dim()
    if not -rank <= axis < rank:
        raise ValueError(f"concat: axis {axis} is out of range for rank-{rank} inputs")
    axis %= rank
    for tensor in inputs:
        others = (tensor.shape[:axis], tensor.shape[axis + 1 :])
        if tensor.dim() != rank or others != (first.shape[:axis], first.shape[axis + 1 :]):
            shapes = [list(t.shape) for t in inputs]
            raise ValueError(f"concat: inputs must agree on every dimension but axis {axis}; got {shapes}")
        if tensor.dtype != first.dtype or tensor.device != first.device:
            kinds = [f"{t.dtype} on {t.device}" for t in inputs]
            raise ValueError(f"concat: inputs must share one type and device; got {kinds}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    if out is None:
        out = torch.empty(shape, dtype=first.dtype, device=first.device)
    elif list(out.shape) != shape:
        raise ValueError(f"concat: out is {list(out.shape)}, the concatenation {shape}")
    start = 0
    for tensor in inputs:
        part = out.narrow(axis, start, tensor.shape[axis])
        strided_copy(tensor, part, block_a=block_a, block_b=block_b, num_warps=num_warps)
        start += tensor.shape[axis]
    return out


@triton.jit
def _space_to_depth(
    x, y, C, H2, W, COL0, W2P, inv_scale,
    sxn, sxc, sxh, sxw,
    syn, syh, syw,
    G: tl.constexpr, BLOCK_J: tl.constexpr, QUANT: tl.constexpr, THROUGH: tl.constexpr,
):  # fmt: skip
    """y[n, i, COL0 + j, (2p + p')·G + c] = x[n, c, 2i + p, 2j + p'] for BLOCK_J of the W2P pixels of row i of
    image n (`program_id(1)` = n·H2 + i), the slots c ≥ C and the columns outside [COL0, COL0 + W/2) zero;
    quantized by `inv_scale` when QUANT (1 int8, 2 E4M3), after a rounding to fp16 (THROUGH 1) or bf16 (2) when
    asked. The load runs along the input's rows (2·BLOCK_J
    consecutive columns of each (c, p) row), the store along y's pixels, whole rows of 4G channels."""
    row = tl.program_id(1)
    n = (row // H2).to(tl.int64)
    i = row % H2
    j0 = tl.program_id(0) * BLOCK_J
    r = tl.arange(0, 2 * G)  # (c, p)
    c = r // 2
    p = r % 2
    col = 2 * (j0 - COL0) + tl.arange(0, 2 * BLOCK_J)  # (j, p'): input column 2j + p'
    source = x + n * sxn + (c * sxc + (2 * i + p) * sxh)[:, None] + (col * sxw)[None, :]
    values = tl.load(source, mask=(c < C)[:, None] & ((col >= 0) & (col < W))[None, :], other=0.0)
    values = tl.permute(tl.reshape(values, [G, 2, BLOCK_J, 2]), [2, 1, 3, 0])  # j, p, p', c
    values = tl.reshape(values, [BLOCK_J, 4 * G])
    if THROUGH == 1:
        values = values.to(tl.float16)
    elif THROUGH == 2:
        values = values.to(tl.bfloat16)
    if QUANT != 0:
        values = quantize(values, inv_scale, QUANT)
    else:
        values = values.to(y.dtype.element_ty)
    jj = j0 + tl.arange(0, BLOCK_J)
    target = y + n * syn + i * syh + (jj * syw)[:, None] + tl.arange(0, 4 * G)[None, :]
    tl.store(target, values, mask=(jj < W2P)[:, None])


_THROUGH = {None: 0, torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def space_to_depth(
    x: torch.Tensor,
    out: torch.Tensor,
    columns: tuple[int, int] = (0, 0),
    scale: float | None = None,
    through: torch.dtype | None = None,
    block_j: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`out` [N, 4G, H/2, W/2 + before + after] (channels_last, G ≥ C a power of two) overwritten with the 2×2
    blocks of `x` [N, C, H, W] (any strides and float type; H, W even), channel (2p + p')·G + c, converted to
    out's type (int8 or E4M3: quantized by `scale`, after rounding to `through`, float16 or bfloat16, if given),
    between `columns` = (before, after) zero columns, the slots c ≥ C zero (`kernels.space_to_depth`); returns
    out."""
    n, channels, h, w = x.shape
    group = out.shape[1] // 4
    width = w // 2 + sum(columns)
    if h % 2 or w % 2 or tuple(out.shape) != (n, 4 * group, h // 2, width) or group < channels or group & (group - 1):
        raise ValueError(
            f"space_to_depth: {list(x.shape)} into {list(out.shape)}: an even map, and out [N, 4G, H/2, W/2 + "
            f"{sum(columns)}] with G ≥ C a power of two"
        )
    if out.stride(1) != 1:
        raise ValueError(f"space_to_depth: out must be channels_last (strides {list(out.stride())})")
    quant = QUANT_CODES.get(out.dtype, 0)
    if quant and not (scale and scale > 0):
        raise ValueError(f"space_to_depth: a {out.dtype} output needs a positive scale, not {scale!r}")
    block_j = min(block_j, triton.next_power_of_2(width))
    _space_to_depth[(triton.cdiv(width, block_j), n * (h // 2))](
        x, out, channels, h // 2, w, columns[0], width, 1.0 / scale if quant else 1.0, *x.stride(), out.stride(0),
        out.stride(2), out.stride(3), G=group, BLOCK_J=block_j, QUANT=quant, THROUGH=_THROUGH[through],
        num_warps=num_warps,
    )  # fmt: skip
    return out
