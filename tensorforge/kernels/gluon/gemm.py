"""A warp-specialized, persistent GEMM for Hopper in Gluon: `y = epilogue(a @ bᵀ)` with a fused epilogue.

a is [M, K] and b is [N, K], both K-major (a 1×1 convolution over NHWC activations is this product with the
pixels as rows), of fp16, bf16, int8 or float8 E4M3; accumulation in float32 (int32 for int8). The epilogue, in
order: the per-column scale (a quantized product's w_scale·x_scale), the bias, the PRE activation, the residual
z (fp16, bf16 or the quantized type, times z_scale), the POST activation, then the output: cast to y's type, or
quantized (× y_inv_scale, rounded onto int8's or E4M3's grid).

Why Gluon: Triton's own pipeliner on sm_90 puts the operand loads, the tensor-core loop and the epilogue in the
same warps, one after the other. Here one producer warp does nothing but issue TMA loads — the A and B tiles of
the K steps, several tiles ahead, and each tile's residual block — into rings of shared buffers guarded by
mbarriers, while the consumer warps only multiply and finish tiles; the tiles' results leave by TMA stores that
the consumers do not wait for. With CONSUMERS = 2 two consumer warpgroups take alternate tiles (a ping-pong), so
one's epilogue runs while the other's products run. Programs are persistent (one or two a multiprocessor), walking
the tiles in GROUP_M-row bands so that the b columns they share stay in L2.

Runs on sm_90 and newer only (TMA, wgmma, setmaxnreg); Triton's interpreter does not run Gluon.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..triton.epilogue import activate, quantize

# Triton 3.7 renamed the TMA copies (3.6 is the oldest Gluon this kernel is written for).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _tile(t, num_m, num_n, GROUP_M: gl.constexpr):
    """Tile number `t`'s (row block, column block): bands of GROUP_M row blocks sweep the columns together."""
    per_band = GROUP_M * num_n
    band = t // per_band
    first_m = band * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (t % per_band) % rows, (t % per_band) // rows


@gluon.jit
def _producer(
    a_desc, b_desc, z_desc, a_bufs, b_bufs, z_bufs, ready, empty, z_ready, z_empty,
    num_m, num_n, k_steps, HAS_RES: gl.constexpr, GROUP_M: gl.constexpr,
):  # fmt: skip
    """One warp: TMA loads of every K step's A and B tiles into the ring, and of each tile's residual block."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    Z_STAGES: gl.constexpr = z_bufs.type.shape[0]
    step = 0
    local = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if HAS_RES:
            slot = local % Z_STAGES
            mbarrier.wait(z_empty.index(slot), ((local // Z_STAGES) & 1) ^ 1)
            mbarrier.expect(z_ready.index(slot), z_desc.block_type.nbytes)
            _tma_load(z_desc, [off_m, off_n], z_ready.index(slot), z_bufs.index(slot))
        for k in range(k_steps):
            s = step % STAGES
            mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1 at once
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [off_m, k * BLOCK_K], ready.index(s), a_bufs.index(s))
            _tma_load(b_desc, [off_n, k * BLOCK_K], ready.index(s), b_bufs.index(s))
            step += 1
        local += 1


@gluon.jit
def _consumer(
    y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty,
    scale, bias, num_m, num_n, N, k_steps,
    pre0, pre1, post0, post1, z_scale, y_inv_scale,
    CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr, HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
    HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr, QUANT_Y: gl.constexpr, GROUP_M: gl.constexpr,
    WARPS: gl.constexpr,
):  # fmt: skip
    """One warpgroup (WARPS = 4) or two: the products and the epilogue of every CONSUMERS-th of this program's
    tiles, starting at its CONSUMER-th."""
    BLOCK_M: gl.constexpr = y_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = y_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    Z_STAGES: gl.constexpr = z_bufs.type.shape[0]
    ACC: gl.constexpr = gl.int32 if a_bufs.dtype == gl.int8 else gl.float32
    K_WIDTH: gl.constexpr = 256 // a_bufs.dtype.primitive_bitwidth
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, _instr_n(BLOCK_N, a_bufs.dtype), K_WIDTH]
    )
    columns: gl.constexpr = gl.SliceLayout(0, layout)
    y_buf = y_bufs.index(CONSUMER)
    local = CONSUMER
    for t in range(gl.program_id(0) + CONSUMER * gl.num_programs(0), num_m * num_n, CONSUMERS * gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = gl.zeros([BLOCK_M, BLOCK_N], ACC, layout)
        step = local * k_steps  # every tile has k_steps steps: the ring position of this tile's first
        previous = step % STAGES
        for k in range(k_steps):
            s = step % STAGES
            mbarrier.wait(ready.index(s), (step // STAGES) & 1)
            a = a_bufs.index(s)
            b = b_bufs.index(s).permute((1, 0))
            acc = warpgroup_mma(a, b, acc, is_async=True)
            acc, a, b = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, b))
            if k > 0:  # the step before this one has finished reading its buffers
                mbarrier.arrive(empty.index(previous), count=1)
            previous = s
            step += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(previous), count=1)

        v = acc.to(gl.float32)
        cols = off_n + gl.arange(0, BLOCK_N, layout=columns)
        if HAS_SCALE:
            v = v * gl.load(scale + cols, mask=cols < N, other=0.0)[None, :]
        if HAS_BIAS:
            v = v + gl.load(bias + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
        v = activate(v, PRE, pre0, pre1)
        if HAS_RES:
            slot = local % Z_STAGES
            mbarrier.wait(z_ready.index(slot), (local // Z_STAGES) & 1)
            z = z_bufs.index(slot).load(layout).to(gl.float32)
            mbarrier.arrive(z_empty.index(slot), count=1)
            v = v + z * z_scale
        v = activate(v, POST, post0, post1)
        if QUANT_Y:
            out = quantize(v, y_inv_scale, QUANT_Y)
        else:
            out = v.to(y_desc.dtype)
        tma.store_wait(pendings=0)  # this consumer's previous tile has left its buffer
        y_buf.store(out)
        fence_async_shared()
        _tma_store(y_desc, [off_m, off_n], y_buf)
        local += CONSUMERS
    tma.store_wait(pendings=0)


@gluon.constexpr_function
def _instr_n(block_n, dtype):
    """The widest wgmma N that divides BLOCK_N (int8's come from a fixed list)."""
    n = min(block_n, 256)
    while block_n % n or (dtype.is_int() and n > 224):
        n -= 8 if not dtype.is_int() else 16
    return n


@gluon.jit
def _second_consumer(
    y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty,
    scale, bias, num_m, num_n, N, k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale,
    a_desc, b_desc, z_desc,
    HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr,
    QUANT_Y: gl.constexpr, GROUP_M: gl.constexpr,
):  # fmt: skip
    _consumer(
        y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, scale, bias, num_m, num_n, N,
        k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale,
        1, 2, HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M, 4,
    )  # fmt: skip


@gluon.jit
def _producer_worker(
    y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty,
    scale, bias, num_m, num_n, N, k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale,
    a_desc, b_desc, z_desc,
    HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr,
    QUANT_Y: gl.constexpr, GROUP_M: gl.constexpr,
):  # fmt: skip
    _producer(
        a_desc,
        b_desc,
        z_desc,
        a_bufs,
        b_bufs,
        z_bufs,
        ready,
        empty,
        z_ready,
        z_empty,
        num_m,
        num_n,
        k_steps,
        HAS_RES,
        GROUP_M,
    )


@gluon.jit
def gemm_ws_kernel(
    a_desc, b_desc, z_desc, y_desc, scale, bias,
    M, N, K, pre0, pre1, post0, post1, z_scale, y_inv_scale,
    HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr,
    QUANT_Y: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, GROUP_M: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """y = epilogue(a @ bᵀ) over [BLOCK_M, BLOCK_N] tiles (the descriptors' block shapes), persistent programs.

    z_desc is y_desc again when there is no residual (never read). The default partition (num_warps warps) is the
    first consumer; the workers are the producer (one warp) and, with CONSUMERS = 2, the second consumer (four).
    """
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)  # noqa: RUF005 - no starred lists in Gluon
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)  # noqa: RUF005 - no starred lists in Gluon
    Z_STAGES: gl.constexpr = 2 if HAS_RES else 1
    if HAS_RES:
        z_bufs = gl.allocate_shared_memory(z_desc.dtype, [Z_STAGES] + z_desc.block_type.shape, z_desc.layout)  # noqa: RUF005 - no starred lists in Gluon
    else:  # never read: a token buffer, so that every partition has the same arguments
        z_bufs = gl.allocate_shared_memory(gl.int8, [1, 8, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    y_bufs = gl.allocate_shared_memory(y_desc.dtype, [CONSUMERS] + y_desc.block_type.shape, y_desc.layout)  # noqa: RUF005 - no starred lists in Gluon
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    z_ready = gl.allocate_shared_memory(gl.int64, [Z_STAGES, 1], mbarrier.MBarrierLayout())
    z_empty = gl.allocate_shared_memory(gl.int64, [Z_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(Z_STAGES):
        mbarrier.init(z_ready.index(i), count=1)
        mbarrier.init(z_empty.index(i), count=1)
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, a_desc.block_type.shape[1])
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, scale, bias, num_m, num_n,
                     N, k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale,
                     0, 2, HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M, num_warps),
                ),
                (
                    _producer_worker,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, scale, bias, num_m, num_n,
                     N, k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale, a_desc, b_desc, z_desc,
                     HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M),
                ),
                (
                    _second_consumer,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, scale, bias, num_m, num_n,
                     N, k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale, a_desc, b_desc, z_desc,
                     HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M),
                ),
            ],
            [1, 4],
            [40, 232],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, scale, bias, num_m, num_n,
                     N, k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale,
                     0, 1, HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M, num_warps),
                ),
                (
                    _producer_worker,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, scale, bias, num_m, num_n,
                     N, k_steps, pre0, pre1, post0, post1, z_scale, y_inv_scale, a_desc, b_desc, z_desc,
                     HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M),
                ),
            ],
            [1],
            [40],
        )  # fmt: skip


# -- launcher --------------------------------------------------------------------------------------------------------

_GL_DTYPES = {
    torch.float16: gl.float16,
    torch.bfloat16: gl.bfloat16,
    torch.int8: gl.int8,
    torch.float8_e4m3fn: gl.float8e4nv,
    torch.float32: gl.float32,
}
SHARED_LIMIT = 232448 - 2048  # sm_90's opt-in shared memory a block, less the barriers and the compiler's own
REGISTERS = 65536  # a multiprocessor's 32-bit registers, shared by the warpgroups


@dataclass(frozen=True)
class GemmConfig:
    """A tile shape and its pipeline: BLOCK_K-deep steps in a ring of `stages` buffers; `consumers` warpgroups
    (one: `num_warps` 4 or 8 share each tile; two: 4 warps each, alternate tiles)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    consumers: int = 1
    num_warps: int = 4

    def shared_bytes(self, a: torch.dtype, y: torch.dtype, z: torch.dtype | None) -> int:
        """The shared memory this config takes: the operand ring, the residual pair and one output tile a
        consumer."""
        ring = self.stages * (self.block_m + self.block_n) * self.block_k * a.itemsize
        residual = 2 * self.block_m * self.block_n * z.itemsize if z is not None else 64
        return ring + residual + self.consumers * self.block_m * self.block_n * y.itemsize

    def maxnreg(self) -> int:
        """Registers a thread at launch: the warpgroups (the producer's warp takes a whole one) share the file;
        the compiler's setmaxnreg then moves them from the producer to the consumers."""
        groups = 1 + (self.consumers if self.consumers == 2 else self.num_warps // 4)
        return min(256, REGISTERS // (groups * 128) // 8 * 8)


def problem(
    a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, z: torch.Tensor | None, config: GemmConfig
) -> str | None:
    """Why `config` cannot run y = epilogue(a @ bᵀ) (with residual z) on these tensors, or None."""
    if a.dtype not in (torch.float16, torch.bfloat16, torch.int8, torch.float8_e4m3fn) or b.dtype != a.dtype:
        return f"operands must be one of fp16, bf16, int8, float8 E4M3 alike; got {a.dtype} and {b.dtype}"
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        return f"a [M, K] and b [N, K] expected; got {tuple(a.shape)} and {tuple(b.shape)}"
    if y.shape != (a.shape[0], b.shape[0]) or (z is not None and z.shape != y.shape):
        return "y (and z) must be [M, N]"
    for name, t in (("a", a), ("b", b), ("y", y), ("z", z)):
        if t is not None and (t.stride(1) != 1 or t.stride(0) * t.element_size() % 16 or t.data_ptr() % 16):
            return f"{name} must have unit column stride and 16-byte aligned rows for TMA"
    if y.dtype not in _GL_DTYPES or (z is not None and z.dtype not in _GL_DTYPES):
        return f"no Gluon type for y {y.dtype} or z {None if z is None else z.dtype}"
    if config.consumers not in (1, 2) or (config.consumers == 2 and config.num_warps != 4):
        return "one consumer of 4 or 8 warps, or two of 4"
    if config.num_warps not in (4, 8) or config.block_m < 16 * config.num_warps:
        return f"{config.num_warps} consumer warps need BLOCK_M ≥ {16 * config.num_warps}"
    if a.dtype == torch.int8 and config.block_n % 16:
        return "int8 wgmma needs BLOCK_N a multiple of 16"
    if config.block_k * a.element_size() < 32:
        return "BLOCK_K must span at least 32 bytes (one wgmma K step)"
    need = config.shared_bytes(a.dtype, y.dtype, None if z is None else z.dtype)
    if need > SHARED_LIMIT:
        return f"{need} bytes of shared memory, more than {SHARED_LIMIT}"
    return None


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype]))


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def gemm_ws(
    a: torch.Tensor,
    b: torch.Tensor,
    y: torch.Tensor,
    config: GemmConfig,
    *,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    z_scale: float = 1.0,
    pre: tuple[int, float, float] = (0, 0.0, 0.0),
    post: tuple[int, float, float] = (0, 0.0, 0.0),
    quant_y: int = 0,
    y_inv_scale: float = 1.0,
) -> torch.Tensor:
    """y = quantize_or_cast(post(pre(a @ bᵀ · scale + bias) + z · z_scale)), written into y; returns y.

    scale: float32 [N] or None; bias: [N] (any float type) or None; pre / post: (activation code, p0, p1) as
    `kernels.activations.activation_args` gives them; quant_y: 0 (cast to y's type), 1 (int8) or 2 (E4M3) with
    y_inv_scale. Check `problem` first: a config it refuses raises here."""
    reason = problem(a, b, y, z, config)
    if reason is not None:
        raise ValueError(f"gemm_ws {config}: {reason}")
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    y_desc = _descriptor(y, [bm, bn])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = (min(tiles, _multiprocessors(a.device.index or 0)),)
    gemm_ws_kernel[grid](
        _descriptor(a, [bm, bk]), _descriptor(b, [bn, bk]), y_desc if z is None else _descriptor(z, [bm, bn]), y_desc,
        scale if scale is not None else y, bias if bias is not None else y,
        m, n, k, float(pre[1]), float(pre[2]), float(post[1]), float(post[2]), float(z_scale), float(y_inv_scale),
        HAS_SCALE=scale is not None, HAS_BIAS=bias is not None, HAS_RES=z is not None, PRE=pre[0], POST=post[0],
        QUANT_Y=quant_y, STAGES=config.stages, CONSUMERS=config.consumers, GROUP_M=8,
        num_warps=config.num_warps, maxnreg=config.maxnreg(),
    )  # fmt: skip
    return y
