"""A tiled Triton GEMM with the FusedGemm epilogue inside the kernel.

`gemm` computes `Y = post(pre(alpha · op(A) @ op(B) + beta · C) + Z)` with MatMul's batched broadcasting:
A is [*, M, K] (or [*, K, M] with `trans_a`), B is [*, K, N] (or [*, N, K] with `trans_b`), C and the residual
Z broadcast against Y = [*, M, N] (a bias row [N], a column [M, 1], a full matrix...). Products accumulate in
float32 (fp16 / bf16 inputs) or run on float32 with TF32 or IEEE dot precision; the epilogue is evaluated in
float32 and rounded once to Y's type, which is stored through Y's strides (a caller's `out` may be a view).

Batch dims and rows are one index space: wherever every operand's strides allow it (a 2-D weight shared by
every batch, the transformer case), the batch dims fold into M and the whole product is one big GEMM. Up to
two batch dims that do not fold run on the grid's second axis; any further ones are looped here.
Programs walk the output tiles in GROUP_M-row super-groups so that neighbouring programs share A and B tiles
in L2.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from . import conv_tma
from .epilogue import activate, activation_args
from .tiles import swizzle

_GPU_BATCH_DIMS = 2  # batch dims handled inside one launch; more are looped by the launcher
_INT32_LIMIT = 2**31

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages), the widest search last.
_CONFIGS_BY_EFFORT: tuple[tuple[tuple[int, int, int, int, int, int], ...], ...] = (
    ((128, 128, 64, 8, 8, 3), (64, 128, 64, 8, 4, 4)),
    (
        (128, 256, 64, 8, 8, 3),
        (256, 128, 64, 8, 8, 3),
        (64, 256, 32, 8, 4, 4),
        (128, 64, 64, 8, 4, 4),
        (64, 64, 64, 8, 4, 4),
        (32, 64, 64, 8, 2, 5),
    ),
    (
        (128, 128, 32, 8, 4, 4),
        (128, 128, 128, 8, 8, 3),
        (64, 128, 128, 8, 4, 3),
        (128, 64, 128, 8, 8, 3),
        (64, 32, 64, 8, 2, 5),
        (16, 64, 128, 4, 2, 4),
        (256, 64, 64, 8, 8, 4),
    ),
)


# Tiles of `conv_tma.gemm_rows` (operands moved by TMA; a config with "TMA" runs it when the product is one 2-D
# GEMM whose operands TMA can take, else the kernel here with the same tiles): the usual best Hopper tiles, and
# the widest one as a persistent walk of one program per multiprocessor (the next tile's loads overlap this one's
# epilogue; PERSISTENT programs per multiprocessor, 0 or absent: one program per tile).
_TMA_CONFIGS_BY_EFFORT = (
    ((128, 256, 64, 8, 8, 3, 0), (128, 128, 64, 8, 8, 4, 0), (128, 256, 64, 8, 8, 3, 1)),
    ((256, 128, 64, 8, 8, 3, 0), (64, 128, 64, 8, 4, 4, 0), (128, 128, 64, 8, 8, 4, 2)),
)


def gemm_tma_configs(effort: int, quantized: bool = False) -> list[dict[str, int]]:
    """The "TMA" configurations worth timing at `effort` for a product by a 2-D weight: 3 at 0, 6 from 1 (8-bit
    operands: K tiles of 128, the same 128-byte rows)."""
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "PERSISTENT")
    levels = _TMA_CONFIGS_BY_EFFORT[: max(0, min(effort, len(_TMA_CONFIGS_BY_EFFORT) - 1)) + 1]
    configs = [{**dict(zip(keys, values, strict=True)), "TMA": True} for level in levels for values in level]
    return [{**c, "BLOCK_K": 2 * c["BLOCK_K"]} for c in configs] if quantized else configs


def gemm_configs(effort: int) -> list[dict[str, int]]:
    """Tile configurations worth timing at `effort` (0: two safe picks, 2: the widest search); each level
    includes the ones below it."""
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
    levels = _CONFIGS_BY_EFFORT[: max(0, min(effort, len(_CONFIGS_BY_EFFORT) - 1)) + 1]
    return [dict(zip(keys, values, strict=True)) for level in levels for values in level]


@triton.jit
def _gemm_kernel(
    a, b, c, z, y,
    M, N, K, BATCH1,
    sa0, sa1, sam, sak,
    sb0, sb1, sbk, sbn,
    sc0, sc1, scm, scn,
    sz0, sz1, szm, szn,
    sy0, sy1, sym, syn,
    alpha, beta, pre0, pre1, post0, post1,
    HAS_C: tl.constexpr, HAS_Z: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
    PRECISION: tl.constexpr, EVEN_K: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    b0 = (batch // BATCH1).to(tl.int64)
    b1 = (batch % BATCH1).to(tl.int64)
    pid_m, pid_n = swizzle(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    if WIDE:
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
        ks = ks.to(tl.int64)
    a_tile = a + b0 * sa0 + b1 * sa1 + rows[:, None] * sam + ks[None, :] * sak
    b_tile = b + b0 * sb0 + b1 * sb1 + ks[:, None] * sbk + cols[None, :] * sbn
    # Edge masks on plain offsets keep Triton's contiguity analysis (vector loads along the unit stride).
    a_rows = rows[:, None] < M
    b_cols = cols[None, :] < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a_block = tl.load(a_tile, mask=a_rows, other=0.0)
            b_block = tl.load(b_tile, mask=b_cols, other=0.0)
        else:
            left = K - k * BLOCK_K
            a_block = tl.load(a_tile, mask=a_rows & (ks[None, :] < left), other=0.0)
            b_block = tl.load(b_tile, mask=b_cols & (ks[:, None] < left), other=0.0)
        acc = tl.dot(a_block, b_block, acc, input_precision=PRECISION)
        a_tile += BLOCK_K * sak
        b_tile += BLOCK_K * sbk

    inside = (rows[:, None] < M) & (cols[None, :] < N)
    acc = acc * alpha
    if HAS_C:
        c_tile = c + b0 * sc0 + b1 * sc1 + rows[:, None] * scm + cols[None, :] * scn
        acc += beta * tl.load(c_tile, mask=inside).to(tl.float32)
    narrow: tl.constexpr = y.dtype.element_ty.primitive_bitwidth <= 16
    acc = activate(acc, PRE, pre0, pre1, narrow)
    if HAS_Z:
        z_tile = z + b0 * sz0 + b1 * sz1 + rows[:, None] * szm + cols[None, :] * szn
        acc += tl.load(z_tile, mask=inside).to(tl.float32)
    acc = activate(acc, POST, post0, post1, narrow)
    y_tile = y + b0 * sy0 + b1 * sy1 + rows[:, None] * sym + cols[None, :] * syn
    tl.store(y_tile, acc.to(y.dtype.element_ty), mask=inside)


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
    pre: str = "",
    pre_params: Sequence[float] = (),
    post: str = "",
    post_params: Sequence[float] = (),
    input_precision: str = "ieee",
    out: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """`post(pre(alpha · op(a) @ op(b) + beta · c) + residual)` in `a`'s dtype, into `out` when given.

    `a` and `b` are float tensors of one dtype with at least two dims. `c` is skipped when `beta` is 0 (Gemm's
    rule). `input_precision` ("ieee", "tf32" or "tf32x3") applies to float32 inputs. `config` is one of
    `gemm_configs(effort)` (default: the first).
    """
    config = dict(gemm_configs(0)[0] if config is None else config)
    _check_operands(a, b, input_precision)
    _check_shared_memory(config, a, input_precision)
    a_mat = a.mT if trans_a else a
    b_mat = b.mT if trans_b else b
    m, k = a_mat.shape[-2:]
    k_b, n = b_mat.shape[-2:]
    if k != k_b:
        raise ValueError(
            f"gemm: inner dims differ: op(A) is {list(a_mat.shape)} and op(B) is {list(b_mat.shape)} "
            f"(trans_a={trans_a}, trans_b={trans_b})"
        )
    batch = _broadcast("A and B batch dims", a_mat.shape[:-2], b_mat.shape[:-2])
    shape = (*batch, m, n)
    y = _output(out, shape, a)
    if y.numel() == 0:
        return y
    has_c = c is not None and beta != 0.0
    operands = {
        "a": a_mat.broadcast_to((*batch, m, k)),
        "b": b_mat.broadcast_to((*batch, k, n)),
        "c": _expand("C", c, shape) if has_c else None,
        "z": _expand("residual", residual, shape),
        "y": y,
    }
    pre_args = activation_args(pre, pre_params)
    post_args = activation_args(post, post_params)
    for views in _launches(operands, len(batch)):
        _launch(views, k, alpha, beta, pre_args, post_args, input_precision, config)
    return y


def _check_operands(a: torch.Tensor, b: torch.Tensor, input_precision: str) -> None:
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(
            f"gemm: A and B need at least 2 dims, got {list(a.shape)} and {list(b.shape)}; "
            "reshape a vector to a 1-row or 1-column matrix first"
        )
    if a.dtype != b.dtype or a.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"gemm: A and B must share one of float16/bfloat16/float32, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"gemm: A is on {a.device} and B on {b.device}")
    if input_precision not in ("ieee", "tf32", "tf32x3"):
        raise ValueError(f"gemm: input_precision must be 'ieee', 'tf32' or 'tf32x3', not {input_precision!r}")


def shared_memory_bytes(config: dict[str, int], element_size: int) -> int:
    """Shared memory a tile configuration takes: an A and a B block per pipeline stage."""
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    return config["num_stages"] * (block_m * block_k + block_k * block_n) * element_size


@functools.cache
def _shared_memory_limit(device_index: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


def _check_shared_memory(config: dict[str, int], a: torch.Tensor, input_precision: str) -> None:
    """Refuse, before compiling, a tile whose tensor-core pipeline cannot fit `a`'s GPU (wide TF32 tiles on
    deep pipelines). float32 "ieee" products run on the FMA units without those stage buffers (measured: the
    same tiles launch there), so they are not refused."""
    if a.device.type != "cuda" or (a.dtype == torch.float32 and input_precision == "ieee"):
        return
    needed = shared_memory_bytes(config, a.element_size())
    limit = _shared_memory_limit(a.device.index if a.device.index is not None else torch.cuda.current_device())
    if needed > limit:
        tile = f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}, {config['num_stages']} stages"
        raise ValueError(
            f"gemm: the tile ({tile}) needs {needed} bytes of shared memory for {a.dtype} operands and the "
            f"device has {limit}: choose smaller blocks or fewer stages"
        )


def _broadcast(what: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(torch.broadcast_shapes(*[tuple(s) for s in shapes]))
    except RuntimeError:
        raise ValueError(f"gemm: {what} do not broadcast: {[list(s) for s in shapes]}") from None


def _expand(name: str, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
    """`tensor` as a stride-0 view of `shape` (unidirectional broadcast), or None."""
    if tensor is None:
        return None
    try:
        return tensor.broadcast_to(shape)
    except RuntimeError:
        raise ValueError(f"gemm: {name} of shape {list(tensor.shape)} does not broadcast to {list(shape)}") from None


def _output(out: torch.Tensor | None, shape: tuple[int, ...], a: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=a.dtype, device=a.device)
    if tuple(out.shape) != shape or out.device != a.device or not out.dtype.is_floating_point:
        raise ValueError(f"gemm: out is {out.dtype} {list(out.shape)} on {out.device}, needs a float {list(shape)}")
    return out


def _launches(operands: dict[str, torch.Tensor | None], batch_rank: int) -> Iterator[dict[str, torch.Tensor | None]]:
    """Per launch, every operand viewed as [batch0, batch1, rows, cols] (B as [batch0, batch1, K, N]).

    The batch dims and M form one row index space. Adjacent dims merge wherever every operand's strides let
    them (B's stride along M is 0, so a batch dim folds into M exactly when B is shared across it); the last
    two unmerged batch dims go to the grid, any before them are looped here."""
    present = {name: t for name, t in operands.items() if t is not None}
    sizes = list(present["y"].shape[: batch_rank + 1])
    strides = {name: [*t.stride()[:batch_rank], 0 if name == "b" else t.stride(-2)] for name, t in present.items()}
    sizes, strides = _fold(sizes, strides)
    while len(sizes) < _GPU_BATCH_DIMS + 1:
        sizes.insert(0, 1)
        for s in strides.values():
            s.insert(0, 0)
    looped = len(sizes) - _GPU_BATCH_DIMS - 1
    for index in itertools.product(*(range(size) for size in sizes[:looped])):
        views: dict[str, torch.Tensor | None] = dict.fromkeys(operands)
        for name, t in present.items():
            s = strides[name]
            offset = t.storage_offset() + sum(i * st for i, st in zip(index, s, strict=False))
            if name == "b":
                shape, view_strides = (*sizes[looped:-1], *t.shape[-2:]), (*s[looped:-1], *t.stride()[-2:])
            else:
                shape, view_strides = (*sizes[looped:], t.shape[-1]), (*s[looped:], t.stride(-1))
            views[name] = t.as_strided(shape, view_strides, offset)
        yield views


def _fold(sizes: list[int], strides: dict[str, list[int]]) -> tuple[list[int], dict[str, list[int]]]:
    """Drop size-1 batch dims (the last dim, M, always stays) and merge dim i into dim i+1 where, for every
    operand, stride[i] == stride[i+1] · size[i+1]."""
    keep = [i for i in range(len(sizes) - 1) if sizes[i] != 1] + [len(sizes) - 1]
    out_sizes = [sizes[keep[0]]]
    out_strides = {name: [s[keep[0]]] for name, s in strides.items()}
    for i in keep[1:]:
        if all(out[-1] == strides[name][i] * sizes[i] for name, out in out_strides.items()):
            out_sizes[-1] *= sizes[i]
            for name, out in out_strides.items():
                out[-1] = strides[name][i]
        else:
            out_sizes.append(sizes[i])
            for name, out in out_strides.items():
                out.append(strides[name][i])
    return out_sizes, out_strides


def _launch(views, k, alpha, beta, pre_args, post_args, input_precision, config) -> None:
    a, b, c, z, y = (views[name] for name in ("a", "b", "c", "z", "y"))
    m, n = y.shape[-2:]
    batch0, batch1 = y.shape[0], y.shape[1]
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    wide = any(_max_offset(t) >= _INT32_LIMIT for t in (a, b, c, z, y) if t is not None)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), batch0 * batch1)
    precision = input_precision if a.dtype == torch.float32 else "ieee"
    if config.get("TMA") and _tma_gemm(views, alpha, beta, pre_args, post_args, precision, config):
        return
    _gemm_kernel[grid](
        a, b, c if c is not None else y, z if z is not None else y, y,
        m, n, k, batch1,
        *a.stride(), *b.stride(),
        *(c.stride() if c is not None else (0, 0, 0, 0)),
        *(z.stride() if z is not None else (0, 0, 0, 0)),
        *y.stride(),
        float(alpha), float(beta), pre_args[1], pre_args[2], post_args[1], post_args[2],
        HAS_C=c is not None, HAS_Z=z is not None, PRE=pre_args[0], POST=post_args[0],
        PRECISION=precision, EVEN_K=k % block_k == 0, WIDE=wide,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=config["GROUP_M"],
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )  # fmt: skip


def _tma_gemm(views, alpha, beta, pre_args, post_args, precision, config) -> bool:
    """Run one launch's product through `conv_tma.gemm_rows` when it is one 2-D GEMM (every batch folded into
    M), alpha 1 and C absent or a bias row added with beta 1; whether it ran."""
    a, b, c, z, y = (views[name] for name in ("a", "b", "c", "z", "y"))
    if y.shape[0] * y.shape[1] != 1 or alpha != 1.0:
        return False
    if c is not None and (beta != 1.0 or (c.stride(-2) != 0 and c.shape[-2] > 1)):
        return False
    tile = tuple(config[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"))
    bias = c[0, 0, 0] if c is not None else None
    rows = z[0, 0] if z is not None else None
    persistent = config.get("PERSISTENT", 0)
    return (
        conv_tma.gemm_rows(
            a[0, 0], b[0, 0], bias, rows, y[0, 0], pre_args, post_args, tile, precision, persistent=persistent
        )
        is None
    )


def _max_offset(t: torch.Tensor) -> int:
    """The largest element offset (in elements) a tile address of `t` can reach."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True)) + 1
