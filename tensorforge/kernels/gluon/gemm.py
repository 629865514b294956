"""A warp-specialized, persistent GEMM for Hopper in Gluon: `y = epilogue(a @ bᵀ)` with a fused epilogue, over pixel
rows (`gemm_ws`) or over boxes of pixels (`conv_ws`: a stride-1 convolution, each tap a shifted box of the input).

a is [M, K] and b is [N, K], both K-major (a 1×1 convolution over NHWC activations is this product with the
pixels as rows), of fp16, bf16, int8 or float8 E4M3; accumulation in float32 (int32 for int8; E4M3 products
promoted into it after every K step, or, with `GemmConfig.promote` off, left to the tensor cores' own
accumulation, whose error grows with K: the autotuner's check decides where it is good enough). The epilogue, in
order: the per-column scale (a quantized product's w_scale·x_scale), the bias, the PRE activation, the residual z
(fp16, bf16 or the quantized type, times z_scale), the POST activation, then the output: cast to y's type, or
quantized (× y_inv_scale, rounded onto int8's or E4M3's grid).

Why Gluon: Triton's own pipeliner on sm_90 puts the operand loads, the tensor-core loop and the epilogue in the
same warps, one after the other. Here one producer warp does nothing but issue TMA loads — the A and B tiles of
the K steps, several tiles ahead, and each tile's residual block — into rings of shared buffers guarded by
mbarriers, while the consumer warps only multiply and finish tiles; the tiles' results leave by TMA stores that
the consumers do not wait for. With CONSUMERS = 2 two consumer warpgroups take alternate tiles and turns at the
tensor cores (a ping-pong), so one's epilogue runs while the other's products run. Programs are persistent (one a
multiprocessor), walking the tiles in GROUP_M-row bands so that the b columns they share stay in L2.

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

from ..triton.conv_tma import spatial_box
from ..triton.epilogue import RELU, activate, quantize, widen

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
def _box_origin(pid_m, boxes_h, boxes_w, BI: gl.constexpr, BH: gl.constexpr, BW: gl.constexpr):
    """Row block `pid_m` of a convolution as its box's first (image, row, column) in the output."""
    return (pid_m // (boxes_h * boxes_w)) * BI, (pid_m // boxes_w % boxes_h) * BH, (pid_m % boxes_w) * BW


@gluon.jit
def _phase(offset, pad, STRIDE: gl.constexpr):
    """Where a tap `offset` = k·dilation − pad along one axis reads in a stride-STRIDE convolution: input pixel
    STRIDE·o + offset of output pixel o is pixel o + shift of the input's phase `offset mod STRIDE` (its every
    STRIDE-th pixel from there). Returns (phase, shift); the offset is made non-negative first (offset ≥ −pad),
    so that Triton's truncating division and Python's floor division agree."""
    lifted = offset + STRIDE * pad
    return lifted % STRIDE, lifted // STRIDE - pad


@gluon.jit
def _producer(
    a_desc, b_desc, z_desc, a01_desc, a10_desc, a11_desc, a_bufs, b_bufs, z_bufs, ready, empty, z_ready, z_empty,
    num_m, num_n, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW,
    HAS_RES: gl.constexpr, GROUP_M: gl.constexpr, BOXED: gl.constexpr, KW: gl.constexpr, STRIDE: gl.constexpr,
):  # fmt: skip
    """One warp: TMA loads of every K step's A and B tiles into the ring, and of each tile's residual block.

    K step k is tap k // c_steps (row-major over KH × KW) and channels (k % c_steps)·BLOCK_K on; a product is one
    tap. A box of output pixels reads the same box of input pixels shifted by the tap (coordinates off the input
    read zeros: the padding); the weight's K runs over (tap, channel), so its tile starts at tap·C + channels.
    With STRIDE = 2 the input comes as its four phases (a_desc the even rows' even columns, a01_desc their odd
    columns, a10_desc and a11_desc the odd rows'): a tap reads a shifted box of one phase (`_phase`)."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[len(a_desc.block_type.shape) - 1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    Z_STAGES: gl.constexpr = z_bufs.type.shape[0]
    step = 0
    local = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_m, num_n, GROUP_M)
        off_n = pid_n * BLOCK_N
        if BOXED:
            box: gl.constexpr = a_desc.block_type.shape
            n0, h0, w0 = _box_origin(pid_m, boxes_h, boxes_w, box[0], box[1], box[2])
        else:
            off_m = pid_m * a_desc.block_type.shape[0]
        if HAS_RES:
            slot = local % Z_STAGES
            mbarrier.wait(z_empty.index(slot), ((local // Z_STAGES) & 1) ^ 1)
            mbarrier.expect(z_ready.index(slot), z_desc.block_type.nbytes)
            if BOXED:
                _tma_load(z_desc, [n0, h0, w0, off_n], z_ready.index(slot), z_bufs.index(slot))
            else:
                _tma_load(z_desc, [off_m, off_n], z_ready.index(slot), z_bufs.index(slot))
        for k in range(k_steps):
            tap = k // c_steps
            channel = (k % c_steps) * BLOCK_K
            s = step % STAGES
            mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1 at once
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            if BOXED:
                row = (tap // KW) * DH - PH
                column = (tap % KW) * DW - PW
                if STRIDE == 1:
                    _tma_load(a_desc, [n0, h0 + row, w0 + column, channel], ready.index(s), a_bufs.index(s))
                else:
                    row_phase, row_shift = _phase(row, PH, STRIDE)
                    column_phase, column_shift = _phase(column, PW, STRIDE)
                    h = h0 + row_shift
                    w = w0 + column_shift
                    if row_phase == 0:
                        if column_phase == 0:
                            _tma_load(a_desc, [n0, h, w, channel], ready.index(s), a_bufs.index(s))
                        else:
                            _tma_load(a01_desc, [n0, h, w, channel], ready.index(s), a_bufs.index(s))
                    else:
                        if column_phase == 0:
                            _tma_load(a10_desc, [n0, h, w, channel], ready.index(s), a_bufs.index(s))
                        else:
                            _tma_load(a11_desc, [n0, h, w, channel], ready.index(s), a_bufs.index(s))
            else:
                _tma_load(a_desc, [off_m, channel], ready.index(s), a_bufs.index(s))
            _tma_load(b_desc, [off_n, tap * C + channel], ready.index(s), b_bufs.index(s))
            step += 1
        local += 1


@gluon.constexpr_function
def _folds_output_scale(quant_y, has_scale, pre, post):
    """Whether a quantized output's 1 / y_scale goes into the column factors, the bias and z_scale (one multiply
    a column instead of one an output: the int8 layers' epilogue is what bounds them): exact up to float32
    rounding when both activations commute with a positive factor (none or ReLU)."""
    return bool(quant_y) and bool(has_scale) and pre in (0, RELU.value) and post in (0, RELU.value)


@gluon.jit
def _consumer(
    y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn,
    scale, bias, num_m, num_n, N, k_steps, boxes_h, boxes_w,
    pre0, pre1, post0, post1, z_scale, y_inv_scale,
    CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr, HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
    HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr, QUANT_Y: gl.constexpr, GROUP_M: gl.constexpr,
    BOXED: gl.constexpr, WARPS: gl.constexpr, PROMOTE: gl.constexpr,
):  # fmt: skip
    """One warpgroup (WARPS = 4) or two: the products and the epilogue of every CONSUMERS-th of this program's
    tiles, starting at its CONSUMER-th. Boxed tiles ([images, rows, columns, channels] in shared memory) are the
    same [BLOCK_M, ·] matrices viewed flat. Two consumers take turns at the tensor cores: a tile's products start
    once the previous tile's (the other consumer's) are done, signalled on `turn`, so that one consumer's
    epilogue runs while the other multiplies (a tile waits only for a tile before it: no cycle)."""
    Y_BLOCK: gl.constexpr = y_desc.block_type.shape
    BLOCK_N: gl.constexpr = Y_BLOCK[len(Y_BLOCK) - 1]
    BLOCK_M: gl.constexpr = Y_BLOCK[0] * Y_BLOCK[1] * Y_BLOCK[2] if BOXED else Y_BLOCK[0]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[len(a_bufs.type.shape) - 1]
    FOLD: gl.constexpr = _folds_output_scale(QUANT_Y, HAS_SCALE, PRE, POST)
    z_factor = z_scale
    if FOLD:
        z_factor = z_scale * y_inv_scale
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    Z_STAGES: gl.constexpr = z_bufs.type.shape[0]
    ACC: gl.constexpr = gl.int32 if a_bufs.dtype == gl.int8 else gl.float32
    # E4M3 products add in the tensor cores' reduced precision: with PROMOTE, promoted into the float32 sums after
    # every K step (as the Triton kernels' `max_num_imprecise_acc=BLOCK_K`); without (UNPROMOTED), never: the
    # compiler's default on sm_90, the tensor cores' own accumulation over the whole K, where no FADD reads an
    # accumulator in flight, so ptxas keeps the pipeline. Other operands have nothing to promote.
    IMPRECISE: gl.constexpr = BLOCK_K if a_bufs.dtype == gl.float8e4nv else 0
    UNPROMOTED: gl.constexpr = a_bufs.dtype == gl.float8e4nv and not PROMOTE
    K_WIDTH: gl.constexpr = 256 // a_bufs.dtype.primitive_bitwidth
    NARROW: gl.constexpr = y_desc.dtype.primitive_bitwidth <= 16  # a GELU to 16-bit precision (`activate`)
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, _instr_n(BLOCK_N, a_bufs.dtype), K_WIDTH]
    )
    columns: gl.constexpr = gl.SliceLayout(0, layout)
    y_buf = y_bufs.index(CONSUMER)
    local = CONSUMER
    for t in range(gl.program_id(0) + CONSUMER * gl.num_programs(0), num_m * num_n, CONSUMERS * gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_m, num_n, GROUP_M)
        off_n = pid_n * BLOCK_N
        acc = gl.zeros([BLOCK_M, BLOCK_N], ACC, layout)
        if CONSUMERS == 2 and local > 0:
            mbarrier.wait(turn.index((local - 1) % 2), ((local - 1) // 2) & 1)
        step = local * k_steps  # every tile has k_steps steps: the ring position of this tile's first
        previous = step % STAGES
        for k in range(k_steps):
            s = step % STAGES
            mbarrier.wait(ready.index(s), (step // STAGES) & 1)
            if BOXED:
                a = a_bufs.index(s).reshape([BLOCK_M, BLOCK_K])
            else:
                a = a_bufs.index(s)
            b = b_bufs.index(s).permute((1, 0))
            if UNPROMOTED:
                acc = warpgroup_mma(a, b, acc, is_async=True)
            else:
                acc = warpgroup_mma(a, b, acc, is_async=True, max_num_imprecise_acc=IMPRECISE)
            acc, a, b = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, b))
            if k > 0:  # the step before this one has finished reading its buffers
                mbarrier.arrive(empty.index(previous), count=1)
            previous = s
            step += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(previous), count=1)
        if CONSUMERS == 2:
            mbarrier.arrive(turn.index(local % 2), count=1)

        v = acc.to(gl.float32)
        cols = off_n + gl.arange(0, BLOCK_N, layout=columns)
        if HAS_SCALE:
            column_scale = gl.load(scale + cols, mask=cols < N, other=0.0)
            if FOLD:
                column_scale = column_scale * y_inv_scale
            v = v * column_scale[None, :]
        if HAS_BIAS:
            column_bias = gl.load(bias + cols, mask=cols < N, other=0.0).to(gl.float32)
            if FOLD:
                column_bias = column_bias * y_inv_scale
            v = v + column_bias[None, :]
        v = activate(v, PRE, pre0, pre1, NARROW)
        if HAS_RES:
            slot = local % Z_STAGES
            mbarrier.wait(z_ready.index(slot), (local // Z_STAGES) & 1)
            if BOXED:
                z = z_bufs.index(slot).reshape([BLOCK_M, BLOCK_N]).load(layout)
            else:
                z = z_bufs.index(slot).load(layout)
            mbarrier.arrive(z_empty.index(slot), count=1)
            v = v + widen(z) * z_factor
        v = activate(v, POST, post0, post1, NARROW)
        if QUANT_Y:
            out = quantize(v, y_inv_scale, QUANT_Y, NONNEG=POST == RELU, FOLDED=FOLD)
        else:
            out = v.to(y_desc.dtype)
        tma.store_wait(pendings=0)  # this consumer's previous tile has left its buffer
        if BOXED:
            y_buf.reshape([BLOCK_M, BLOCK_N]).store(out)
            fence_async_shared()
            n0, h0, w0 = _box_origin(pid_m, boxes_h, boxes_w, Y_BLOCK[0], Y_BLOCK[1], Y_BLOCK[2])
            _tma_store(y_desc, [n0, h0, w0, off_n], y_buf)
        else:
            y_buf.store(out)
            fence_async_shared()
            _tma_store(y_desc, [pid_m * BLOCK_M, off_n], y_buf)
        local += CONSUMERS
    tma.store_wait(pendings=0)


@gluon.constexpr_function
def _instr_n(block_n, dtype):
    """The widest wgmma N that divides BLOCK_N (int8's come from a fixed list)."""
    n = min(block_n, 256)
    while block_n % n or (dtype.is_int() and n > 224):
        n -= 8 if not dtype.is_int() else 16
    return n


# The partitions' entry points: the workers all take the same arguments (the kernel's `_WORKER` tuple).


@gluon.jit
def _second_consumer(
    y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn,
    scale, bias, num_m, num_n, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW,
    pre0, pre1, post0, post1, z_scale, y_inv_scale, a_desc, b_desc, z_desc, a01_desc, a10_desc, a11_desc,
    HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr,
    QUANT_Y: gl.constexpr, GROUP_M: gl.constexpr, BOXED: gl.constexpr, KW: gl.constexpr, STRIDE: gl.constexpr,
    PROMOTE: gl.constexpr,
):  # fmt: skip
    _consumer(
        y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn, scale, bias, num_m, num_n, N,
        k_steps, boxes_h, boxes_w, pre0, pre1, post0, post1, z_scale, y_inv_scale,
        1, 2, HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M, BOXED, 4, PROMOTE,
    )  # fmt: skip


@gluon.jit
def _producer_worker(
    y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn,
    scale, bias, num_m, num_n, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW,
    pre0, pre1, post0, post1, z_scale, y_inv_scale, a_desc, b_desc, z_desc, a01_desc, a10_desc, a11_desc,
    HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr,
    QUANT_Y: gl.constexpr, GROUP_M: gl.constexpr, BOXED: gl.constexpr, KW: gl.constexpr, STRIDE: gl.constexpr,
    PROMOTE: gl.constexpr,
):  # fmt: skip
    _producer(
        a_desc, b_desc, z_desc, a01_desc, a10_desc, a11_desc, a_bufs, b_bufs, z_bufs, ready, empty, z_ready, z_empty,
        num_m, num_n, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW, HAS_RES, GROUP_M, BOXED, KW, STRIDE,
    )  # fmt: skip


@gluon.jit
def gemm_ws_kernel(
    a_desc, b_desc, z_desc, y_desc, scale, bias,
    num_m, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW,
    pre0, pre1, post0, post1, z_scale, y_inv_scale, a01_desc, a10_desc, a11_desc,
    HAS_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, PRE: gl.constexpr, POST: gl.constexpr,
    QUANT_Y: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, GROUP_M: gl.constexpr,
    BOXED: gl.constexpr, KW: gl.constexpr, STRIDE: gl.constexpr, PROMOTE: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """y = epilogue(a @ bᵀ) over tiles of the descriptors' block shapes, persistent programs.

    A product: a [M, K], b [N, K], y and z [M, N], num_m row blocks, k_steps = c_steps K steps, C = K. A boxed
    convolution: a the input [N, H, W, C] in boxes [BI, BH, BW, BLOCK_K], y and z the output
    [N, OH, OW, C_out] in boxes [BI, BH, BW, BLOCK_N], b the weight [C_out, KH·KW·C]; num_m = the boxes (images
    × boxes_h × boxes_w), k_steps = KH·KW·c_steps, (PH, PW) the padding and (DH, DW) the dilation; of stride
    STRIDE (1 or 2 along both axes), with a and a01 / a10 / a11 the input's four phases when it is 2 (`_phase`;
    all a_desc otherwise, never read). z_desc is y_desc again when there is no residual (never read). The default
    partition (num_warps warps) is the first consumer; the workers are the producer (one warp) and, with
    CONSUMERS = 2, the second consumer (four).
    """
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
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(Z_STAGES):
        mbarrier.init(z_ready.index(i), count=1)
        mbarrier.init(z_empty.index(i), count=1)
    num_n = gl.cdiv(N, b_desc.block_type.shape[0])
    # The partitions' arguments are spelled out in each call: a tuple of them held in a variable reaches the
    # partitions with its constexpr flags turned into run-time values (Triton 3.6 and 3.9).
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn, scale, bias, num_m,
                     num_n, N, k_steps, boxes_h, boxes_w, pre0, pre1, post0, post1, z_scale, y_inv_scale,
                     0, 2, HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M, BOXED, num_warps, PROMOTE),
                ),
                (
                    _producer_worker,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn, scale, bias, num_m,
                     num_n, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW, pre0, pre1, post0, post1, z_scale,
                     y_inv_scale, a_desc, b_desc, z_desc, a01_desc, a10_desc, a11_desc, HAS_SCALE, HAS_BIAS, HAS_RES,
                     PRE, POST, QUANT_Y, GROUP_M, BOXED, KW, STRIDE, PROMOTE),
                ),
                (
                    _second_consumer,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn, scale, bias, num_m,
                     num_n, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW, pre0, pre1, post0, post1, z_scale,
                     y_inv_scale, a_desc, b_desc, z_desc, a01_desc, a10_desc, a11_desc, HAS_SCALE, HAS_BIAS, HAS_RES,
                     PRE, POST, QUANT_Y, GROUP_M, BOXED, KW, STRIDE, PROMOTE),
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
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn, scale, bias, num_m,
                     num_n, N, k_steps, boxes_h, boxes_w, pre0, pre1, post0, post1, z_scale, y_inv_scale,
                     0, 1, HAS_SCALE, HAS_BIAS, HAS_RES, PRE, POST, QUANT_Y, GROUP_M, BOXED, num_warps, PROMOTE),
                ),
                (
                    _producer_worker,
                    (y_desc, a_bufs, b_bufs, z_bufs, y_bufs, ready, empty, z_ready, z_empty, turn, scale, bias, num_m,
                     num_n, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW, pre0, pre1, post0, post1, z_scale,
                     y_inv_scale, a_desc, b_desc, z_desc, a01_desc, a10_desc, a11_desc, HAS_SCALE, HAS_BIAS, HAS_RES,
                     PRE, POST, QUANT_Y, GROUP_M, BOXED, KW, STRIDE, PROMOTE),
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
    promote: bool = True  # E4M3 sums promoted into float32 after every K step (False: the tensor cores' own)

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


def _operands_problem(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if a.dtype not in (torch.float16, torch.bfloat16, torch.int8, torch.float8_e4m3fn) or b.dtype != a.dtype:
        return f"operands must be one of fp16, bf16, int8, float8 E4M3 alike; got {a.dtype} and {b.dtype}"
    return None


def _tma_problem(tensors: dict[str, torch.Tensor | None]) -> str | None:
    """Why a TMA descriptor cannot read or write one of `tensors` (any rank): the last dimension contiguous, the
    other strides and the base 16-byte aligned."""
    for name, t in tensors.items():
        if t is None:
            continue
        strides = t.stride()
        if strides[-1] != 1 or any(s * t.element_size() % 16 for s in strides[:-1]) or t.data_ptr() % 16:
            return f"{name} must have unit column stride and 16-byte aligned rows for TMA"
        if t.dtype not in _GL_DTYPES:
            return f"no Gluon type for {name}'s {t.dtype}"
    return None


def _config_problem(operands: torch.dtype, y: torch.dtype, z: torch.dtype | None, config: GemmConfig) -> str | None:
    if config.consumers not in (1, 2) or (config.consumers == 2 and config.num_warps != 4):
        return "one consumer of 4 or 8 warps, or two of 4"
    if config.num_warps not in (4, 8) or config.block_m < 16 * config.num_warps:
        return f"{config.num_warps} consumer warps need BLOCK_M ≥ {16 * config.num_warps}"
    if operands == torch.int8 and config.block_n % 16:
        return "int8 wgmma needs BLOCK_N a multiple of 16"
    if config.block_k * operands.itemsize < 32:
        return "BLOCK_K must span at least 32 bytes (one wgmma K step)"
    need = config.shared_bytes(operands, y, z)
    if need > SHARED_LIMIT:
        return f"{need} bytes of shared memory, more than {SHARED_LIMIT}"
    return None


def problem(
    a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, z: torch.Tensor | None, config: GemmConfig
) -> str | None:
    """Why `config` cannot run y = epilogue(a @ bᵀ) (with residual z) on these tensors, or None."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        return _operands_problem(a, b) or f"a [M, K] and b [N, K] expected; got {tuple(a.shape)} and {tuple(b.shape)}"
    if y.shape != (a.shape[0], b.shape[0]) or (z is not None and z.shape != y.shape):
        return _operands_problem(a, b) or "y (and z) must be [M, N]"
    return (
        _operands_problem(a, b)
        or _tma_problem({"a": a, "b": b, "y": y, "z": z})
        or _config_problem(a.dtype, y.dtype, None if z is None else z.dtype, config)
    )


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype]))


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _launch(
    a_descs: list, b_desc, z_desc, y_desc, y, config: GemmConfig, geometry: tuple, boxed: bool, kw: int,
    scale, bias, z_scale, pre, post, quant_y, y_inv_scale,
) -> None:  # fmt: skip
    """One launch over `geometry` = (num_m, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW): a program
    a multiprocessor, at most one a tile. `a_descs`: the input's one descriptor, or its four phases' (stride 2)."""
    tiles = geometry[0] * triton.cdiv(geometry[1], config.block_n)
    grid = (min(tiles, _multiprocessors(y.device.index or 0)),)
    phases = a_descs if len(a_descs) == 4 else a_descs * 4
    gemm_ws_kernel[grid](
        phases[0], b_desc, z_desc, y_desc, scale if scale is not None else y, bias if bias is not None else y,
        *geometry, float(pre[1]), float(pre[2]), float(post[1]), float(post[2]), float(z_scale), float(y_inv_scale),
        *phases[1:], HAS_SCALE=scale is not None, HAS_BIAS=bias is not None, HAS_RES=z_desc is not y_desc,
        PRE=pre[0], POST=post[0], QUANT_Y=quant_y, STAGES=config.stages, CONSUMERS=config.consumers, GROUP_M=8,
        BOXED=boxed, KW=kw, STRIDE=2 if len(a_descs) == 4 else 1, PROMOTE=config.promote, num_warps=config.num_warps,
        maxnreg=config.maxnreg(),
    )  # fmt: skip


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
    z_desc = y_desc if z is None else _descriptor(z, [bm, bn])
    steps = triton.cdiv(k, bk)
    geometry = (triton.cdiv(m, bm), n, steps, steps, k, 1, 1, 0, 0, 1, 1)
    _launch(
        [_descriptor(a, [bm, bk])], _descriptor(b, [bn, bk]), z_desc, y_desc, y, config, geometry, False, 1,
        scale, bias, z_scale, pre, post, quant_y, y_inv_scale,
    )  # fmt: skip
    return y


def pack_conv_weight(w: torch.Tensor) -> torch.Tensor:
    """A [C_out, C, KH, KW] weight as `conv_ws` takes it: [C_out, KH·KW·C], K ordered (row, column, channel)."""
    return w.permute(0, 2, 3, 1).reshape(w.shape[0], -1).contiguous()


def conv_ws(
    x: torch.Tensor,
    w: torch.Tensor,
    y: torch.Tensor,
    config: GemmConfig,
    *,
    kernel: tuple[int, int],
    strides: tuple[int, int] = (1, 1),
    pads: tuple[int, int] = (0, 0),
    dilations: tuple[int, int] = (1, 1),
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    z_scale: float = 1.0,
    pre: tuple[int, float, float] = (0, 0.0, 0.0),
    post: tuple[int, float, float] = (0, 0.0, 0.0),
    quant_y: int = 0,
    y_inv_scale: float = 1.0,
) -> torch.Tensor:
    """A convolution of one group over channels_last tensors: x [N, C, H, W], w from `pack_conv_weight`, y (and
    z) [N, C_out, OH, OW]; each tile a box of output pixels (`spatial_box`) whose taps read the same box of input
    pixels shifted (TMA reads zeros off the input: the padding `pads`, the beginning's). Stride 1; or 2 along both
    axes, where each tap reads a shifted box of one of the input's four phases (every other row and column from
    (0, 0), (0, 1), (1, 0) or (1, 1): strided views, read by TMA through their strides); or any stride for an
    unpadded 1×1 (the input's every s-th pixel, a view). An unpadded 1×1 layer over dense tensors is `gemm_ws`
    over the pixel rows instead (no box lanes past the map's edges). The epilogue as `gemm_ws`'s. Returns y."""
    channels = x.shape[1]
    if w.shape[1] != kernel[0] * kernel[1] * channels:
        raise ValueError(
            f"conv_ws: the packed weight has {w.shape[1]} columns, not KH·KW·C = {kernel[0] * kernel[1] * channels}"
        )
    outputs = (y,) + ((z,) if z is not None else ())
    if any(t.stride(1) != 1 for t in (x, *outputs)):
        raise ValueError("conv_ws: channels_last tensors only")
    unpadded_1x1 = tuple(kernel) == (1, 1) and tuple(pads) == (0, 0)
    if unpadded_1x1 and tuple(strides) != (1, 1):  # every s-th pixel: a stride-1 convolution of a view
        x, strides = x[:, :, :: strides[0], :: strides[1]], (1, 1)
    if tuple(strides) not in ((1, 1), (2, 2)):
        raise ValueError(f"conv_ws: strides {tuple(strides)}: 1 or 2 along both axes only (or an unpadded 1×1)")
    rows = lambda t: t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])  # noqa: E731 - the pixels as a matrix
    if unpadded_1x1 and all(t.is_contiguous(memory_format=torch.channels_last) for t in (x, *outputs)):
        # a product over pixel rows, no box lanes wasted; rows(y) of a dense tensor is a view: written in place
        gemm_ws(
            rows(x), w, rows(y), config, scale=scale, bias=bias, z=None if z is None else rows(z), z_scale=z_scale,
            pre=pre, post=post, quant_y=quant_y, y_inv_scale=y_inv_scale,
        )  # fmt: skip
        return y
    nhwc = x.permute(0, 2, 3, 1)  # a view; TMA takes its strides
    if tuple(strides) == (2, 2):
        if min(nhwc.shape[1:3]) < 2:
            raise ValueError(f"conv_ws: a stride-2 input needs 2 rows and columns at least, not {tuple(x.shape[2:])}")
        sources = [nhwc[:, row::2, column::2] for row in (0, 1) for column in (0, 1)]
    else:
        sources = [nhwc]
    views = {f"x phase {i}": source for i, source in enumerate(sources)}
    written = {"y": y.permute(0, 2, 3, 1), "z": None if z is None else z.permute(0, 2, 3, 1)}  # views, NHWC
    reason = (
        _operands_problem(x, w)
        or _tma_problem({**views, "w": w, **written})
        or _config_problem(x.dtype, y.dtype, None if z is None else z.dtype, config)
    )
    if reason is not None:
        raise ValueError(f"conv_ws {config}: {reason}")
    n, _, oh, ow = y.shape
    box = spatial_box(config.block_m, (n, oh, ow))
    bk, bn = config.block_k, config.block_n
    y_desc = _descriptor(written["y"], [*box, bn])
    z_desc = y_desc if z is None else _descriptor(written["z"], [*box, bn])
    boxes_h, boxes_w = triton.cdiv(oh, box[1]), triton.cdiv(ow, box[2])
    c_steps = triton.cdiv(channels, bk)
    geometry = (
        triton.cdiv(n, box[0]) * boxes_h * boxes_w, y.shape[1], kernel[0] * kernel[1] * c_steps, c_steps, channels,
        boxes_h, boxes_w, pads[0], pads[1], dilations[0], dilations[1],
    )  # fmt: skip
    _launch(
        [_descriptor(source, [*box, bk]) for source in sources], _descriptor(w, [bn, bk]), z_desc, y_desc, y,
        config, geometry, True, kernel[1], scale, bias, z_scale, pre, post, quant_y, y_inv_scale,
    )  # fmt: skip
    return y
