"""2-D convolution as an implicit GEMM over channels_last activations, with FusedConv's epilogue inside.

Per group g the convolution is a matrix product, `Y_g[m, n] = Σ_k A_g[m, k] · B_g[k, n]`, where
m = (image, oh, ow) runs over the N·OH·OW output pixels, n over the Cout/G output channels of the group,
k = (kh, kw, c) over KH·KW·Cin/G, and

    A_g[m, k] = X[image, g·Cin/G + c, oh·SH − PH + kh·DH, ow·SW − PW + kw·DW]   (0 outside X: the padding)
    B_g[k, n] = W[g·Cout/G + n, c, kh, kw]                                      (`pack_weight`'s layout)

A is gathered from X one [BLOCK_M, BLOCK_K] tile at a time (no im2col buffer): with channels innermost (NHWC
strides) a tile row is one contiguous run of channels. The K loop walks filter taps × blocks of channels
("tap" order); when the channels of a group fill a block poorly (the 3-channel stem) it walks the flattened
k instead ("dense" order, every element gathered by its own tap). A 1×1 filter skips the tap arithmetic, an
unpadded window every bounds test. Products accumulate in float32 (`tl.dot`; float32 inputs in TF32 or in full
IEEE float32), then the epilogue runs on the accumulator: `Y = post(pre(acc + bias) + Z)`, rounded once to
Y's type and stored through Y's strides, so it writes into any caller-provided buffer.

Split-K (for few output tiles over a long K, e.g. batch 1 with 3×3×512 filters) cuts the K loop into
`splits` ranges whose float32 partial sums go to a workspace; a second kernel adds them and applies the
epilogue once, so the result is the same sum rounded once.

The same kernel computes quantized convolutions (`QUANT`: 1 int8, 2 float8 E4M3; `conv2d_nhwc_quantized`).
B is the quantized weight, A the input quantized per tensor, either already (int8 / E4M3 X) or as it is loaded
(QuantizeLinear fused into the gather): `q = clip(round(x · (1/s_x)))` in float32, int8 rounding half to even
and saturating to [−128, 127], E4M3 clipping to ±448 and rounding to nearest even. Padding loads 0, which
quantizes to 0. int8 products accumulate exactly in int32 (split-K partials too: int32 workspace, summed
exactly), E4M3 ones in float32; the epilogue first dequantizes, `acc · (s_x · s_w[n])`, then runs as above.
With an output scale s_y (`QUANT_Y`) the epilogue's float32 result is requantized as it is stored,
`clip(round(y · (1/s_y)))` onto the grid of the kernel's type (the rounding of the quantize-on-load), so the
next quantized layer reads int8 (or E4M3) bytes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import triton
import triton.language as tl

from . import conv_tma
from .epilogue import QUANT_CODES, RELU, activate, activation_args, dequantize_bias_pre, quantize, widen
from .tiles import swizzle, wave_slots

Activation = tuple[int, float, float]  # (code, p0, p1) as `epilogue.activation_args` gives them
NO_ACTIVATION: Activation = activation_args("")
_FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_GRID_YZ = 65535  # CUDA's limit on the second and third grid axes
_REDUCE_BLOCK_M, _REDUCE_BLOCK_N = 32, 64
# "dense" K order once "tap" order would pad the K loop with more than this factor of wasted lanes
_DENSE_K_WASTE = 1.5
_MIN_K_TILES_PER_SPLIT = 4
_MAX_SPLITS = 16


@triton.jit
def _epilogue(
    acc, rows, cols, g, M, OH, OW, KG,
    bias, res, srn, src, srh, srw,
    y, syn, syc, syh, syw,
    pre0, pre1, post0, post1, w_scale, x_scale, y_inv_scale, z_scale,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, QUANT: tl.constexpr,
    QUANT_Y: tl.constexpr,
):  # fmt: skip
    """Store `post(pre(acc + bias) + Z · z_scale)` for output pixels `rows` × channels `cols` of group g (z_scale
    1 for a float Z, its scale for a quantized one); a quantized product (`QUANT` 1 or 2) is first dequantized,
    `acc · (x_scale · w_scale[channel])`; with `QUANT_Y` (1 int8, 2 E4M3) the result is stored quantized,
    multiplied by y_inv_scale."""
    ow = rows % OW
    pixel = rows // OW
    oh = pixel % OH
    image = (pixel // OH).to(tl.int64)
    channels = g * KG + cols
    col_ok = cols < KG
    mask = (rows < M)[:, None] & col_ok[None, :]
    narrow: tl.constexpr = QUANT_Y != 0 or y.dtype.element_ty.primitive_bitwidth <= 16
    acc = dequantize_bias_pre(acc, channels, col_ok, w_scale, x_scale, bias, pre0, pre1, QUANT, HAS_BIAS, PRE, narrow)
    if HAS_RES:
        res_rows = image * srn + oh * srh + ow * srw
        z = tl.load(res + res_rows[:, None] + (channels * src)[None, :], mask=mask, other=0.0)
        acc += widen(z) * z_scale
    acc = activate(acc, POST, post0, post1, narrow)
    out_rows = image * syn + oh * syh + ow * syw
    if QUANT_Y != 0:
        out = quantize(acc, y_inv_scale, QUANT_Y, NONNEG=POST == RELU)
    else:
        out = acc.to(y.dtype.element_ty)
    tl.store(y + out_rows[:, None] + (channels * syc)[None, :], out, mask=mask)


@triton.jit
def _conv2d_igemm(
    x, w, bias, res, y, partial, w_scale, x_inv,
    M, H, W, OH, OW, CG, KG,
    SH, SW, PH, PW, DH, DW,
    sxn, sxc, sxh, sxw,
    srn, src, srh, srw,
    syn, syc, syh, syw,
    pre0, pre1, post0, post1, x_scale, x_inv_scale, y_inv_scale, z_scale,
    K_TILES_PER_SPLIT,
    KH: tl.constexpr, KW: tl.constexpr,
    DENSE_K: tl.constexpr, EVEN_K: tl.constexpr, PADDED: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, QUANT: tl.constexpr, QUANTIZE_X: tl.constexpr,
    X_CHANNELS: tl.constexpr, QUANT_Y: tl.constexpr, PROMOTE: tl.constexpr,
    W_K_MAJOR: tl.constexpr, ALIGN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] tile of group `program_id(2)` over the K tiles of split `program_id(1)`.

    CG, KG: input and output channels per group; they and the N, H, W strides are passed divided by ALIGN.
    Programs along axis 0 are swizzled: GROUP_M row tiles sweep the column tiles together, so the weight columns
    they share stay in L2.
    QUANT: 0 float, 1 int8, 2 float8 E4M3 (w is then quantized, w_scale its per-channel scales, x_scale the
    input's); QUANTIZE_X: x is float and is quantized as it is loaded, multiplied by x_inv_scale, or with
    X_CHANNELS by x_inv[channel] (float32, one per input channel); QUANT_Y: y is
    of the quantized type and the result is quantized as it is stored, multiplied by y_inv_scale.
    """
    # The channel counts and pixel strides arrive divided by ALIGN: multiplied back here, their divisibility is
    # known to the compiler (vector loads along channels), which Triton's own specialization gives only for 16.
    CG = CG * ALIGN
    KG = KG * ALIGN
    sxn, sxh, sxw = sxn * ALIGN, sxh * ALIGN, sxw * ALIGN
    srn, srh, srw = srn * ALIGN, srh * ALIGN, srw * ALIGN
    syn, syh, syw = syn * ALIGN, syh * ALIGN, syw * ALIGN
    pid = tl.program_id(0)
    split = tl.program_id(1)
    g = tl.program_id(2)
    pid_m, pid_n = swizzle(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(KG, BLOCK_N), GROUP_M)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    safe_rows = rows % M  # rows past M repeat real pixels, so loads need no row mask (stores are masked)
    ow = safe_rows % OW
    pixel = safe_rows // OW
    oh = pixel % OH
    image = pixel // OH
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    x_rows = x + (image.to(tl.int64) * sxn + ih0 * sxh + iw0 * sxw + (g * CG).to(tl.int64) * sxc)
    col_ok = cols < KG
    k_total = KH * KW * CG
    if W_K_MAJOR:  # stored as (G, Cout/G, KH, KW, Cin/G)
        w_group = w + g.to(tl.int64) * k_total * KG + (cols * k_total)[None, :]
    else:
        w_group = w + g.to(tl.int64) * k_total * KG + cols[None, :]

    if DENSE_K:
        k_tiles = tl.cdiv(k_total, BLOCK_K)
    else:
        k_tiles = KH * KW * tl.cdiv(CG, BLOCK_K)
    c_tiles = tl.cdiv(CG, BLOCK_K)
    first = split * K_TILES_PER_SPLIT
    last = tl.minimum(first + K_TILES_PER_SPLIT, k_tiles)
    if QUANT == 1:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kt in range(first, last):
        if DENSE_K:
            k = kt * BLOCK_K + rk
            tap = k // CG
            c = k - tap * CG
            kh = tap // KW
            kw = tap - kh * KW
            a_ptrs = x_rows[:, None] + (kh * DH * sxh + kw * DW * sxw + c * sxc)[None, :]
            if PADDED:
                ih = ih0[:, None] + (kh * DH)[None, :]
                iw = iw0[:, None] + (kw * DW)[None, :]
                a_mask = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                if not EVEN_K:
                    a_mask = a_mask & (k < k_total)[None, :]
            elif not EVEN_K:
                a_mask = (k < k_total)[None, :]
            w_rows = k
            w_mask = (k < k_total)[:, None] & col_ok[None, :]
        else:
            if KH * KW == 1:
                c = kt * BLOCK_K + rk
                tap_offset = 0
                w_rows = c
                ih = ih0
                iw = iw0
            else:
                tap = kt // c_tiles
                c = (kt - tap * c_tiles) * BLOCK_K + rk
                kh = tap // KW
                kw = tap - kh * KW
                tap_offset = kh * DH * sxh + kw * DW * sxw
                w_rows = tap * CG + c
                ih = ih0 + kh * DH
                iw = iw0 + kw * DW
            a_ptrs = x_rows[:, None] + tap_offset + (c * sxc)[None, :]
            if PADDED:
                inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                a_mask = inside[:, None] if EVEN_K else inside[:, None] & (c < CG)[None, :]
            elif not EVEN_K:
                a_mask = (c < CG)[None, :]
            w_mask = col_ok[None, :] if EVEN_K else (c < CG)[:, None] & col_ok[None, :]
        if PADDED or not EVEN_K:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        else:
            a = tl.load(a_ptrs)  # an unpadded window over whole blocks of channels: every element is inside
        if QUANTIZE_X and X_CHANNELS:
            inv = tl.load(x_inv + g * CG + c, mask=c < CG, other=0.0)
            a = quantize(a, inv[None, :], QUANT, OPERAND=True)
        elif QUANTIZE_X:
            a = quantize(a, x_inv_scale, QUANT, OPERAND=True)  # after the masked load: padding quantizes to 0
        if W_K_MAJOR:
            b = tl.load(w_group + w_rows[:, None], mask=w_mask, other=0.0)
        else:
            b = tl.load(w_group + (w_rows * KG)[:, None], mask=w_mask, other=0.0)
        if QUANT == 1:
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        elif QUANT == 2 and PROMOTE:
            # Hopper's float8 MMA adds in reduced precision; promoting each K tile's sum into the float32
            # accumulator keeps the error that of a BLOCK_K-long sum.
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        elif QUANT == 2:
            acc = tl.dot(a, b, acc)  # the sums left to the tensor cores (`ConvConfig.promote`)
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    if SPLIT:
        slab = (split * tl.num_programs(2) + g).to(tl.int64) * M
        offsets = (slab + rows)[:, None] * KG + cols[None, :]
        tl.store(partial + offsets, acc, mask=(rows < M)[:, None] & col_ok[None, :])
    else:
        _epilogue(
            acc, rows, cols, g, M, OH, OW, KG, bias, res, srn, src, srh, srw, y, syn, syc, syh, syw,
            pre0, pre1, post0, post1, w_scale, x_scale, y_inv_scale, z_scale, HAS_BIAS, HAS_RES, PRE, POST, QUANT,
            QUANT_Y,
        )  # fmt: skip


@triton.jit
def _split_k_epilogue(
    partial, splits, M, OH, OW, KG,
    bias, res, srn, src, srh, srw,
    y, syn, syc, syh, syw,
    pre0, pre1, post0, post1, w_scale, x_scale, y_inv_scale, z_scale,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, QUANT: tl.constexpr,
    QUANT_Y: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Sum the `splits` partial products of one tile (float32 in split order; int8 products' int32 ones exactly)
    and apply the epilogue once."""
    g = tl.program_id(2)
    groups = tl.num_programs(2)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < KG)[None, :]
    if QUANT == 1:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in range(splits):
        slab = (s * groups + g).to(tl.int64) * M
        acc += tl.load(partial + (slab + rows)[:, None] * KG + cols[None, :], mask=mask, other=0)
    _epilogue(
        acc, rows, cols, g, M, OH, OW, KG, bias, res, srn, src, srh, srw, y, syn, syc, syh, syw,
        pre0, pre1, post0, post1, w_scale, x_scale, y_inv_scale, z_scale, HAS_BIAS, HAS_RES, PRE, POST, QUANT,
        QUANT_Y,
    )  # fmt: skip


# -- configurations --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvConfig:
    """One tuning point of the kernel. `split_k`: how many K ranges (1: none), or "auto" to split only when
    the output tiles would fill less than one wave of the device (see `split_k_for`). `tma`: a stride-1 call of
    one group whose operands allow it runs `conv_tma`'s kernel with these tiles (split-K aside), any other call
    the gathering kernel; `persistent` (TMA kernel only): that many programs per multiprocessor walk all the
    output tiles, overlapping one tile's epilogue with the next one's loads (0: a program per tile); `swap` (TMA
    kernel only): each tile computed transposed, its BLOCK_M pixels the product's N (`conv_tma`). `promote` (E4M3
    products only): each BLOCK_K step's sum added into the float32 accumulator, so the error stays that of one
    step's sum whatever K is; False leaves the sums to the tensor cores, faster (compiled for sm_90, a promoted
    256-pixel transposed tile spills registers) and less exact as K grows (`tactics.autotune.FP8_PRODUCTS_TOLERANCE`
    is what a candidate must meet)."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 4
    split_k: int | str = "auto"
    tma: bool = False
    persistent: int = 0
    swap: bool = False
    promote: bool = True

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> ConvConfig:
        if config is None:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown conv config keys {unknown}; known: {sorted(known)}")
        made = cls(**config)
        blocks = (made.block_m, made.block_n, made.block_k)
        if any(b < 16 or b & (b - 1) for b in blocks):
            raise ValueError(f"block sizes must be powers of two of at least 16 (tl.dot), got {blocks}")
        if made.split_k != "auto" and not (isinstance(made.split_k, int) and made.split_k >= 1):
            raise ValueError(f"split_k must be a positive integer or 'auto', got {made.split_k!r}")
        if not (isinstance(made.persistent, int) and made.persistent >= 0):
            raise ValueError(f"persistent: programs per multiprocessor (0: none), got {made.persistent!r}")
        if not isinstance(made.promote, bool):
            raise ValueError(f"promote: True or False, got {made.promote!r}")
        if made.swap and not made.tma:
            raise ValueError("swap: a transposed tile is the TMA kernel's (tma=True) only")
        return made


def _config(
    bm, bn, bk, warps, stages, split_k="auto", group_m=8, tma=False, persistent=0, swap=False
) -> dict[str, Any]:
    """A tuning point as a dict; `promote` is left out (its default), as a float layer has nothing to promote
    (an E4M3 layer's tactics add the unpromoted twins: `tactics.triton_conv.accumulations`)."""
    config = asdict(ConvConfig(bm, bn, bk, group_m, warps, stages, split_k, tma, persistent, swap))
    del config["promote"]
    return config


# Effort 0: the shapes of ResNet / MobileNet layers on Hopper: wide tiles for the large layers, 64-wide ones
# for 64-channel layers, a 64×64 tile that with split-K also fills the device at batch 1.
_EFFORT_0 = [
    _config(128, 128, 64, 8, 3),
    _config(128, 64, 64, 4, 4),
    _config(64, 128, 64, 4, 4),
    _config(64, 64, 64, 4, 4),
]
_EFFORT_1 = [
    _config(128, 256, 64, 8, 3),
    _config(256, 128, 64, 8, 3),
    _config(128, 128, 32, 4, 4),
    _config(128, 32, 64, 4, 4),  # narrow layers (16-40 output channels)
    _config(64, 32, 64, 4, 5),
    _config(32, 64, 128, 4, 4),  # few pixels, long K
    _config(64, 64, 128, 4, 3),
]
_EFFORT_2 = [
    _config(128, 128, 64, 8, 4),
    _config(128, 128, 64, 4, 3),
    _config(128, 64, 32, 4, 5),
    _config(64, 128, 32, 4, 5),
    _config(64, 64, 32, 2, 5),
    _config(128, 64, 128, 8, 3),
    _config(32, 32, 64, 2, 4),
    _config(128, 128, 64, 8, 3, group_m=4),
    _config(64, 64, 64, 4, 4, split_k=1),
    _config(64, 64, 64, 4, 4, split_k=4),
    _config(64, 64, 64, 4, 4, split_k=8),
    _config(32, 64, 128, 4, 4, split_k=16),
    _config(128, 64, 64, 4, 4, split_k=2),
]


def conv_configs(effort: int) -> list[dict[str, Any]]:
    """The kernel configurations worth timing at `effort`: 4 at 0, 11 at 1, 24 at 2 (each level adds to the last)."""
    levels = [_EFFORT_0, _EFFORT_1, _EFFORT_2]
    return [dict(c) for c in itertools.chain.from_iterable(levels[: max(0, min(effort, 2)) + 1])]


# Quantized products: 8-bit tiles take half the shared memory of 16-bit ones, so K tiles are longer; 8-bit
# tensor-core products take K in steps of 32. Every effort-0 config also fits when A is float32 quantized on load.
_QUANTIZED_EFFORT_0 = [
    _config(128, 128, 64, 8, 4),
    _config(128, 64, 64, 4, 4),
    _config(64, 128, 64, 4, 4),
    _config(64, 64, 128, 4, 3),
    # Short K (memory-bound 1×1 layers, K = 64-128: one or two K tiles): no pipeline buffers, more programs per
    # multiprocessor; the fastest of 84 configs for ResNet-50's int8 64→256 and 128→512 block-final layers on the
    # H200 (0.415 / 0.231 ms against the four above's best 0.496 / 0.251; bench/results/conv-configs-h200).
    _config(128, 64, 64, 4, 1),
]
_QUANTIZED_EFFORT_1 = [
    _config(128, 256, 64, 8, 3),
    _config(256, 128, 64, 8, 3),
    _config(128, 128, 128, 8, 3),  # 8- and 16-bit A only: float32 A tiles would need 240 KiB
    _config(128, 32, 64, 4, 4),  # narrow layers
    _config(64, 32, 64, 4, 5),
    _config(32, 64, 128, 4, 4),  # few pixels, long K
    _config(64, 64, 64, 4, 4),
]
_QUANTIZED_EFFORT_2 = [
    _config(128, 128, 64, 8, 3),
    _config(128, 128, 64, 4, 4),
    _config(128, 64, 128, 4, 4),
    _config(64, 128, 128, 4, 4),
    _config(64, 64, 32, 2, 5),
    _config(32, 32, 64, 2, 4),
    _config(128, 128, 64, 8, 4, group_m=4),
    _config(64, 64, 64, 4, 4, split_k=1),
    _config(64, 64, 64, 4, 4, split_k=4),
    _config(64, 64, 128, 4, 3, split_k=8),
    _config(32, 64, 128, 4, 4, split_k=16),
    _config(128, 64, 64, 4, 4, split_k=2),
    _config(128, 128, 128, 8, 4, split_k=1),
]
_QUANTIZED_MIN_BLOCK_K = 32

# Tiles of `conv_tma`'s kernel, for stride-1 layers of one group, by effort: 128-byte K rows, the widest swizzle
# of a TMA copy (64 16-bit channels; 8-bit products take K tiles twice as long); a persistent walk of narrow tiles,
# two programs per multiprocessor, for the memory-bound 1×1 layers of few input channels (one or two K steps: the
# next tile's loads overlap this one's epilogue); effort 1 adds the usual best Hopper GEMM tiles, those
# persistent, and a 256-pixel tile computed transposed for layers of 64 output channels (`swap`: 12% faster on
# ResNet-50's int8 stem on an H100, 10% on its 3×3 64 → 64 layers; `tactics.triton_conv.tiles_with_swap` offers it
# to such layers at every effort).
_TMA_EFFORT = [
    [
        _config(128, 128, 64, 8, 3, tma=True),
        _config(128, 64, 64, 4, 4, tma=True),
        _config(128, 64, 64, 4, 3, tma=True, persistent=2),
    ],
    [
        _config(128, 256, 64, 8, 3, tma=True),
        _config(64, 128, 64, 4, 4, tma=True),
        _config(128, 128, 64, 8, 3, tma=True, persistent=1),
        _config(256, 64, 64, 4, 3, tma=True, swap=True),
    ],
]


def tma_configs(effort: int, quantized: bool = False) -> list[dict[str, Any]]:
    """The `tma` configurations worth timing at `effort` for a stride-1 layer of one group: 3 at 0, 7 from 1."""
    configs = [dict(c) for c in itertools.chain.from_iterable(_TMA_EFFORT[: max(0, min(effort, 1)) + 1])]
    return [{**c, "block_k": 2 * c["block_k"]} for c in configs] if quantized else configs


def fit_configs(configs: Sequence[Mapping[str, Any]], cg: int, kg: int, min_block_k: int = 16) -> list[dict[str, Any]]:
    """`configs` for a layer of `cg` input and `kg` output channels per group: tiles no wider than the power of two
    that holds them (a 16-channel layer loads 16-wide K tiles, 32 contiguous bytes a pixel, rather than masking
    three quarters of 64-wide ones, and stores 16-wide N tiles), duplicates dropped, in order."""
    fitted: list[dict[str, Any]] = []
    for config in configs:
        fit = dict(config)
        fit["block_n"] = min(fit["block_n"], max(16, triton.next_power_of_2(kg)))
        fit["block_k"] = min(fit["block_k"], max(min_block_k, triton.next_power_of_2(cg)))
        if fit not in fitted:
            fitted.append(fit)
    return fitted


def quantized_conv_configs(effort: int) -> list[dict[str, Any]]:
    """The configurations of `conv2d_nhwc_quantized` worth timing at `effort`: 5 at 0, 12 at 1, 25 at 2 (each
    level adds to the last; K tiles of at least 32)."""
    levels = [_QUANTIZED_EFFORT_0, _QUANTIZED_EFFORT_1, _QUANTIZED_EFFORT_2]
    return [dict(c) for c in itertools.chain.from_iterable(levels[: max(0, min(effort, 2)) + 1])]


def _check_shared_memory(
    cfg: ConvConfig, a_bytes: int, b_bytes: int, device: torch.device, name: str = "conv2d_nhwc"
) -> None:
    """Refuse, before compiling, a config whose pipelined A and B tiles (of `a_bytes` and `b_bytes` elements)
    cannot fit in a block's shared memory (e.g. 128×256×64 tiles in 3 stages of float32 need 288 KiB):
    compiling it would only fail at launch."""
    if device.type != "cuda":
        return
    props = torch.cuda.get_device_properties(device)
    limit = getattr(props, "shared_memory_per_block_optin", 0) or 227 * 1024
    needed = cfg.num_stages * (cfg.block_m * cfg.block_k * a_bytes + cfg.block_k * cfg.block_n * b_bytes)
    if needed > limit:
        bits = f"{8 * a_bytes}-bit" if a_bytes == b_bytes else f"{8 * a_bytes}-bit A and {8 * b_bytes}-bit B"
        raise ValueError(
            f"{name}: config {cfg.block_m}x{cfg.block_n}x{cfg.block_k} in {cfg.num_stages} stages needs "
            f"{needed // 1024} KiB of shared memory at {bits}; a block gets {limit // 1024} KiB here"
        )


def split_k_for(tiles: int, k_tiles: int, slots: int) -> int:
    """How many K ranges bring `tiles` output tiles up to about one wave of `slots` programs (the SM count),
    each range keeping at least `_MIN_K_TILES_PER_SPLIT` K tiles; 1 when the tiles already fill half a wave."""
    if 2 * tiles >= slots:
        return 1
    return max(1, min(triton.cdiv(slots, tiles), k_tiles // _MIN_K_TILES_PER_SPLIT, _MAX_SPLITS))


# -- host side --------------------------------------------------------------------------------------------


def pack_weight(w: torch.Tensor, groups: int, *, k_major: bool = False) -> torch.Tensor:
    """W (Cout, Cin/G, KH, KW) as the kernel's B operand: a (G, KH, KW, Cin/G, Cout/G) tensor. Contiguous by
    default, so a [BLOCK_K, BLOCK_N] tile reads rows of contiguous output channels; with `k_major` the same
    tensor is a view of a contiguous (G, Cout/G, KH, KW, Cin/G) one, K innermost: 8-bit tensor cores (Hopper's
    wgmma) read B only K-major, so a quantized weight packed so loads straight into shared memory instead of
    being transposed byte by byte. Done once per weight."""
    if w.dim() != 4:
        raise ValueError(f"pack_weight: a 2-D convolution weight has 4 axes (Cout, Cin/G, KH, KW), got {list(w.shape)}")
    cout, cg, kh, kw = w.shape
    if groups < 1 or cout % groups:
        raise ValueError(f"pack_weight: {cout} output channels do not split into {groups} groups")
    grouped = w.reshape(groups, cout // groups, cg, kh, kw)
    if k_major:
        return grouped.permute(0, 1, 3, 4, 2).contiguous().permute(0, 2, 3, 4, 1)
    return grouped.permute(0, 3, 4, 2, 1).contiguous()


def _k_major(name: str, weight: torch.Tensor) -> bool:
    """Whether a packed weight is stored K-major (`pack_weight(k_major=True)`) rather than contiguous;
    ValueError for any other strides."""
    _, kh, kw, cg, kg = weight.shape
    k_total = kh * kw * cg
    layouts = {False: (k_total * kg, kw * cg * kg, cg * kg, kg, 1), True: (k_total * kg, kw * cg, cg, 1, k_total)}
    for k_major, strides in layouts.items():
        if all(
            size == 1 or got == want for size, got, want in zip(weight.shape, weight.stride(), strides, strict=True)
        ):
            return k_major
    raise ValueError(
        f"{name}: the weight must come from pack_weight (contiguous or k_major), got strides {list(weight.stride())}"
    )


@dataclass(frozen=True)
class _Plan:
    """How one call runs: K order, masks, split."""

    dense_k: bool
    even_k: bool
    padded: bool
    k_tiles: int
    k_tiles_per_split: int
    splits: int


def _plan(
    shape: Sequence[int], weight_shape: Sequence[int], out_hw, strides, pads_begin, dilations, m: int, cfg, device
) -> _Plan:
    _, _, h, w = shape
    groups, kh, kw, cg, kg = weight_shape
    bk = cfg.block_k
    tap_k = kh * kw * triton.cdiv(cg, bk) * bk
    dense_k_padded = triton.cdiv(kh * kw * cg, bk) * bk
    dense = kh * kw > 1 and tap_k > _DENSE_K_WASTE * dense_k_padded
    even_k = (kh * kw * cg) % bk == 0 if dense else cg % bk == 0
    padded = window_padded((h, w), out_hw, strides, pads_begin, dilations, (kh, kw))
    k_tiles = triton.cdiv(kh * kw * cg, bk) if dense else kh * kw * triton.cdiv(cg, bk)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(kg, cfg.block_n) * groups
    wanted = split_k_for(tiles, k_tiles, wave_slots(device)) if cfg.split_k == "auto" else cfg.split_k
    per_split = triton.cdiv(k_tiles, max(1, min(wanted, k_tiles)))
    return _Plan(dense, even_k, padded, k_tiles, per_split, triton.cdiv(k_tiles, per_split))


def _check_geometry(name: str, x, weight, bias, residual, out_hw) -> tuple[int, int, int, int]:
    """The output shape, after checking the operands' shapes and devices against it (ValueError naming the
    operand); the caller has checked the types."""
    if len(out_hw) != 2 or min(out_hw) < 0:
        raise ValueError(f"{name}: out_hw must be two sizes >= 0, got {list(out_hw)}")
    groups, _, _, cg, kg = weight.shape
    out_shape = (x.shape[0], groups * kg, int(out_hw[0]), int(out_hw[1]))
    if x.shape[1] != groups * cg:
        raise ValueError(f"{name}: x has {x.shape[1]} channels, the packed weight expects {groups} × {cg}")
    if groups > _MAX_GRID_YZ:
        raise ValueError(f"{name}: at most {_MAX_GRID_YZ} groups (a grid axis), got {groups}")
    if bias is not None and (tuple(bias.shape) != (groups * kg,) or bias.device != x.device):
        raise ValueError(f"{name}: bias must have shape [{groups * kg}] on {x.device}, got {list(bias.shape)}")
    if residual is not None and residual.device != x.device:
        raise ValueError(f"{name}: the residual is on {residual.device}, x on {x.device}")
    return out_shape


def _check_out(name: str, out, out_shape, dtype: torch.dtype, device: torch.device) -> None:
    if out is not None and (tuple(out.shape) != out_shape or out.dtype != dtype or out.device != device):
        raise ValueError(
            f"{name}: out is {out.dtype} {list(out.shape)} on {out.device}, needs {dtype} {list(out_shape)}"
        )


def broadcast_residual(name: str, residual: torch.Tensor | None, out_shape: Sequence[int]) -> torch.Tensor | None:
    """`residual` expanded to the output's shape (a view: stride 0 along broadcast axes); ValueError naming `name`
    when it does not broadcast."""
    if residual is None:
        return None
    try:
        return residual.expand(tuple(out_shape))
    except RuntimeError:
        raise ValueError(
            f"{name}: the residual {list(residual.shape)} does not broadcast to the output {list(out_shape)}"
        ) from None


def window_padded(
    hw: Sequence[int], out_hw: Sequence[int], strides, pads_begin, dilations, kernel_hw: Sequence[int]
) -> bool:
    """Whether some output pixel's window reaches outside the input (padding before, or past the end)."""
    windows = zip(hw, out_hw, strides, pads_begin, dilations, kernel_hw, strict=True)
    return any(
        pad > 0 or (out - 1) * stride - pad + (k - 1) * dilation >= size
        for size, out, stride, pad, dilation, k in windows
    )


def _check(x, weight, bias, residual, out_hw, out) -> tuple[int, int, int, int]:
    """The output shape, after checking every operand against it (ValueError naming the operand)."""
    if x.dim() != 4 or x.dtype not in _FLOAT_TYPES:
        raise ValueError(f"conv2d_nhwc: x must be a 4-D float16/bfloat16/float32 tensor, got {x.dtype} {list(x.shape)}")
    if weight.dim() != 5 or weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(
            f"conv2d_nhwc: the weight must come from pack_weight (5-D, x's dtype and device), "
            f"got {weight.dtype} {list(weight.shape)} on {weight.device}"
        )
    out_shape = _check_geometry("conv2d_nhwc", x, weight, bias, residual, out_hw)
    _check_out("conv2d_nhwc", out, out_shape, x.dtype, x.device)
    return out_shape


_FP8_CAPABILITY = (8, 9)
# E4M3 configs quantizing a float input on load from this many rows up fault on the GPU (an illegal instruction,
# which also ends the process's CUDA context): refused before launch.
_FP8_FAULTY_BLOCK_M = 256


def _check_quantized(
    x, weight, weight_scale, x_scale, bias, residual, out_hw, out, out_dtype, y_scale=0.0, z_scale=0.0
):  # fmt: skip
    """(output shape, QUANT code, output type), after checking every operand (ValueError naming it)."""
    name = "conv2d_nhwc_quantized"
    if weight.dim() != 5 or weight.dtype not in QUANT_CODES or weight.device != x.device:
        raise ValueError(
            f"{name}: the weight must be pack_weight of an int8 or float8_e4m3fn weight (5-D, on x's device), "
            f"got {weight.dtype} {list(weight.shape)} on {weight.device}"
        )
    if x.dim() != 4 or x.dtype not in (*_FLOAT_TYPES, weight.dtype):
        raise ValueError(
            f"{name}: x must be a 4-D float16/bfloat16/float32 tensor or already {weight.dtype} (the weight's type), "
            f"got {x.dtype} {list(x.shape)}"
        )
    out_shape = _check_geometry(name, x, weight, bias, residual, out_hw)
    cout = out_shape[1]
    scale_ok = weight_scale.dtype == torch.float32 and tuple(weight_scale.shape) == (cout,)
    if not scale_ok or not weight_scale.is_contiguous() or weight_scale.device != x.device:
        raise ValueError(
            f"{name}: weight_scale must be a contiguous float32 [{cout}] on {x.device} (one scale per output "
            f"channel), got {weight_scale.dtype} {list(weight_scale.shape)} on {weight_scale.device}"
        )
    if isinstance(x_scale, torch.Tensor) or not (math.isfinite(x_scale) and x_scale > 0):
        raise ValueError(f"{name}: x_scale must be a positive finite Python float (per tensor), got {x_scale!r}")
    if isinstance(y_scale, torch.Tensor) or not (math.isfinite(y_scale) and y_scale >= 0):
        raise ValueError(f"{name}: y_scale must be a finite Python float >= 0 (0: float output), got {y_scale!r}")
    if isinstance(z_scale, torch.Tensor) or not (math.isfinite(z_scale) and z_scale >= 0):
        raise ValueError(f"{name}: z_scale must be a finite Python float >= 0 (0: float residual), got {z_scale!r}")
    if residual is not None and (residual.dtype == weight.dtype) != bool(z_scale):
        raise ValueError(
            f"{name}: a {weight.dtype} residual needs its z_scale and a float one none; got a {residual.dtype} "
            f"residual with z_scale {z_scale!r}"
        )
    if residual is not None and residual.dtype not in (*_FLOAT_TYPES, weight.dtype):
        raise ValueError(f"{name}: the residual must be float or {weight.dtype}, got {residual.dtype}")
    if y_scale:
        if out_dtype not in (None, weight.dtype):
            raise ValueError(f"{name}: with y_scale the output is {weight.dtype} (the weight's type), not {out_dtype}")
        out_dtype = weight.dtype
    else:
        if out_dtype is None:
            out_dtype = out.dtype if out is not None else x.dtype
        if out_dtype not in _FLOAT_TYPES:
            raise ValueError(f"{name}: out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    _check_out(name, out, out_shape, out_dtype, x.device)
    quant = QUANT_CODES[weight.dtype]
    if quant == 2:
        _check_fp8_device(x.device)
    return out_shape, quant, out_dtype


def _check_fp8_device(device: torch.device) -> None:
    """ValueError on a CUDA device without float8 tensor cores (before compute capability 8.9)."""
    if device.type != "cuda":
        return  # the interpreter
    capability = tuple(torch.cuda.get_device_capability(device))
    if capability < _FP8_CAPABILITY:
        raise ValueError(
            f"conv2d_nhwc_quantized: float8 E4M3 products need compute capability 8.9 or newer (Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}"
        )


def _alignment(*values: int) -> int:
    """The largest of 16, 8, 4, 2, 1 that divides every value."""
    return next(a for a in (16, 8, 4, 2, 1) if all(v % a == 0 for v in values))


def _scaled(strides: Sequence[int], align: int) -> tuple[int, ...]:
    """(N, C, H, W) strides with the N, H and W ones divided by `align` (the kernel multiplies them back)."""
    n, c, h, w = strides
    return n // align, c, h // align, w // align


def _launch(
    name: str, x, weight, bias, residual, y, out_shape, strides, pads_begin, dilations, pre, post, cfg, *,
    dot_precision: str = "ieee", quant: int = 0, weight_scale: torch.Tensor | None = None, x_scale: float = 1.0,
    x_inv_channels: torch.Tensor | None = None, y_scale: float = 0.0, z_scale: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """Run the kernel (and with split-K the epilogue kernel) into `y`; operands checked by the caller."""
    n, _, oh, ow = out_shape
    groups, kh, kw, cg, kg = weight.shape
    m = n * oh * ow
    if m == 0 or kg == 0:
        return y
    residual = broadcast_residual(name, residual, out_shape)
    _check_shared_memory(cfg, x.element_size(), weight.element_size(), x.device, name)
    if cfg.tma and x_inv_channels is None:  # per-channel input scales: the gathering kernel's alone
        problem = conv_tma.launch(
            x, weight, _k_major(name, weight), bias, residual, y, (strides, pads_begin, dilations), pre, post, cfg,
            dot_precision=dot_precision, quant=quant, weight_scale=weight_scale, x_scale=x_scale, y_scale=y_scale,
            z_scale=z_scale,
        )  # fmt: skip
        if problem is None:
            return y
    plan = _plan(x.shape, weight.shape, (oh, ow), strides, pads_begin, dilations, m, cfg, x.device)
    res = residual if residual is not None else y
    res_strides = residual.stride() if residual is not None else (0, 0, 0, 0)
    partial = y
    if plan.splits > 1:
        partial_type = torch.int32 if quant == 1 else torch.float32
        partial = torch.empty((plan.splits, groups, m, kg), dtype=partial_type, device=x.device)
    scales = weight_scale if weight_scale is not None else y
    quant_y = quant if y_scale else 0
    y_inv_scale = 1.0 / y_scale if y_scale else 1.0
    z_factor = z_scale if z_scale else 1.0  # a float residual adds as it is
    epilogue_args = (*pre[1:], *post[1:], scales, x_scale, y_inv_scale, z_factor)  # the split-K epilogue's
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(kg, cfg.block_n)
    pixel_strides = [t[i] for t in (x.stride(), res_strides, y.stride()) for i in (0, 2, 3)]
    align = _alignment(cg, kg, *pixel_strides)
    _conv2d_igemm[(tiles, plan.splits, groups)](
        x, weight, bias if bias is not None else y, res, y, partial, scales,
        x_inv_channels if x_inv_channels is not None else scales,
        m, x.shape[2], x.shape[3], oh, ow, cg // align, kg // align,
        strides[0], strides[1], pads_begin[0], pads_begin[1], dilations[0], dilations[1],
        *_scaled(x.stride(), align), *_scaled(res_strides, align), *_scaled(y.stride(), align),
        *pre[1:], *post[1:], x_scale, 1.0 / x_scale, y_inv_scale, z_factor,
        plan.k_tiles_per_split,
        KH=kh, KW=kw, DENSE_K=plan.dense_k, EVEN_K=plan.even_k, PADDED=plan.padded,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, PRE=pre[0], POST=post[0],
        SPLIT=plan.splits > 1, DOT_PRECISION=dot_precision,
        QUANT=quant, QUANTIZE_X=quant != 0 and x.dtype != weight.dtype, X_CHANNELS=x_inv_channels is not None,
        QUANT_Y=quant_y, PROMOTE=cfg.promote,
        W_K_MAJOR=_k_major(name, weight), ALIGN=align,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if plan.splits > 1:
        grid = (triton.cdiv(m, _REDUCE_BLOCK_M), triton.cdiv(kg, _REDUCE_BLOCK_N), groups)
        _split_k_epilogue[grid](
            partial, plan.splits, m, oh, ow, kg,
            bias if bias is not None else y, res, *res_strides,
            y, *y.stride(), *epilogue_args,
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, PRE=pre[0], POST=post[0], QUANT=quant,
            QUANT_Y=quant_y, BLOCK_M=_REDUCE_BLOCK_M, BLOCK_N=_REDUCE_BLOCK_N, num_warps=4,
        )  # fmt: skip
    return y


def conv2d_nhwc(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    out_hw: Sequence[int],
    strides: Sequence[int] = (1, 1),
    pads_begin: Sequence[int] = (0, 0),
    dilations: Sequence[int] = (1, 1),
    pre: Activation = NO_ACTIVATION,
    post: Activation = NO_ACTIVATION,
    tf32: bool = False,
    out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """`post(pre(conv2d(x, W) + bias) + residual)` into (N, Cout, *out_hw), channels_last, or into `out`.

    `x`: (N, Cin, H, W) in any strides (channels_last reads contiguously); `weight`: `pack_weight(W, groups)`
    in x's dtype; `bias`: (Cout,); `residual`: broadcastable to the output, read through its own strides.
    The input is zero-padded by `pads_begin` before and as far as `out_hw` needs after (ONNX pads and auto_pad
    resolve to these through `ops.pool.window_geometry`). `pre` / `post`: `epilogue.activation_args` triples.
    `tf32`: float32 inputs multiply in TF32 (else in full float32). `config`: a `conv_configs` entry.
    """
    out_shape = _check(x, weight, bias, residual, out_hw, out)
    y = out
    if y is None:
        y = torch.empty(out_shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return _launch(
        "conv2d_nhwc", x, weight, bias, residual, y, out_shape, strides, pads_begin, dilations, pre, post,
        ConvConfig.of(config), dot_precision="tf32" if tf32 and x.dtype == torch.float32 else "ieee",
    )  # fmt: skip


def conv2d_nhwc_quantized(
    x: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    x_scale: float,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    out_hw: Sequence[int],
    strides: Sequence[int] = (1, 1),
    pads_begin: Sequence[int] = (0, 0),
    dilations: Sequence[int] = (1, 1),
    pre: Activation = NO_ACTIVATION,
    post: Activation = NO_ACTIVATION,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
    y_scale: float = 0.0,
    z_scale: float = 0.0,
    x_inv_channels: torch.Tensor | None = None,
) -> torch.Tensor:
    """The int8 or float8 E4M3 convolution `post(pre(Σ q_x·q_w · (x_scale · weight_scale[c]) + bias) + residual)`
    into (N, Cout, *out_hw) of `out_dtype`, channels_last, or into `out`.

    `weight_q`: `pack_weight(W_q, groups)` of an int8 or float8_e4m3fn weight (its type picks the arithmetic),
    best packed `k_major=True` (8-bit tensor cores read B K-major; the contiguous packing works, slower).
    `weight_scale`: float32 (Cout,), per output channel; `x_scale`: the input's scale, a Python float.
    `x`: (N, Cin, H, W) in any strides, either float16/bfloat16/float32, quantized as it is loaded, or
    already of weight_q's type (x_scale is then its scale; this skips the quantizing ALU work every program
    reading x does). On load, `q_x = clip(round(x · (1/x_scale)))` in float32: int8 rounds half to even and
    saturates to [−128, 127] (QuantizeLinear, zero point 0), E4M3 clips to ±448 and rounds to nearest even;
    dividing by x_scale, as the reference QuantizedConv does, differs only within one float32 rounding of a
    tie. Padding is q_x = 0.

    int8 products accumulate exactly in int32; split-K stays exact (int32 partials, summed as integers).
    E4M3 products accumulate in float32: on Hopper each K tile's tensor-core sum is added into float32, but
    the tensor cores add an instruction's 32 products in reduced precision (on an H200, 1.1e-3 normwise
    relative error on a 3×3×64 ResNet layer into float32, against 1e-7 for int8); they need compute
    capability 8.9 or newer on CUDA (ValueError otherwise). The dequantized sum runs through the float32
    epilogue of `conv2d_nhwc` and is rounded once to `out_dtype` (default: out's type, else x's when x is
    float). `config`: a `quantized_conv_configs` entry (K tiles of at least 32).
    `y_scale` > 0: the output is requantized as it is stored, `clip(round(y · (1/y_scale)))` in weight_q's type
    (as x is quantized on load), so the next quantized layer can read it as its already quantized x.
    `z_scale` > 0: the residual is quantized (of weight_q's type) and adds `residual · z_scale`.
    `x_inv_channels`: a float x quantized per channel, `q_x = clip(round(x · x_inv_channels[c]))` (float32 [Cin],
    contiguous, on x's device) instead of `x · (1/x_scale)`; the dequantization stays `x_scale · weight_scale[o]`,
    so the channels' scales belong in weight_scale: exact for a depthwise convolution, whose output channel o
    reads input channel o // (Cout / Cin) alone (`ops.fused.dequantize_scales`).

    How to call it, for a Conv with weight `w` (Cout, Cin/G, KH, KW), input scale `s_x` and NHWC `x`::

        w_q, w_scale = quantize_weight(w, "int8")          # kernels.quantize; once per weight
        packed = pack_weight(w_q, groups, k_major=True)    # once per weight
        begin, _, out_hw = window_geometry(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
        y = conv2d_nhwc_quantized(x, packed, w_scale.to(x.device), s_x, bias, residual, out_hw=out_hw,
                                  strides=strides, pads_begin=begin, dilations=dilations,
                                  pre=activation_args("Relu"), out_dtype=torch.float16)
    """
    out_shape, quant, out_dtype = _check_quantized(
        x, weight_q, weight_scale, x_scale, bias, residual, out_hw, out, out_dtype, y_scale, z_scale
    )
    cfg = ConvConfig.of(config)
    if cfg.block_k < _QUANTIZED_MIN_BLOCK_K:
        raise ValueError(
            f"conv2d_nhwc_quantized: 8-bit tensor-core products take K in steps of {_QUANTIZED_MIN_BLOCK_K}; "
            f"block_k is {cfg.block_k}"
        )
    if quant == 2 and x.dtype != weight_q.dtype and x.device.type == "cuda" and cfg.block_m >= _FP8_FAULTY_BLOCK_M:
        raise ValueError(
            f"conv2d_nhwc_quantized: E4M3 tiles {cfg.block_m} rows tall quantizing a {x.dtype} input as it is "
            "loaded compile (Triton 3.6) into code that stops the GPU with an illegal instruction (seen on an "
            f"H200 with 256x128x64 tiles); use block_m < {_FP8_FAULTY_BLOCK_M} or quantize the input first"
        )
    y = out
    if y is None:
        y = torch.empty(out_shape, dtype=out_dtype, device=x.device, memory_format=torch.channels_last)
    return _launch(
        "conv2d_nhwc_quantized", x, weight_q, bias, residual, y, out_shape, strides, pads_begin, dilations,
        pre, post, cfg, quant=quant, weight_scale=weight_scale, x_scale=float(x_scale), y_scale=float(y_scale),
        z_scale=float(z_scale), x_inv_channels=_check_channels(x, weight_q, x_inv_channels),
    )  # fmt: skip


def _check_channels(
    x: torch.Tensor, weight_q: torch.Tensor, x_inv_channels: torch.Tensor | None
) -> torch.Tensor | None:
    """`x_inv_channels` after checking it (ValueError naming it): per-channel quantization of a float x."""
    if x_inv_channels is None:
        return None
    name = "conv2d_nhwc_quantized"
    if x.dtype == weight_q.dtype:
        raise ValueError(f"{name}: x is already {x.dtype}; x_inv_channels quantizes a float x, give one or the other")
    channels = x.shape[1]
    ok = x_inv_channels.dtype == torch.float32 and tuple(x_inv_channels.shape) == (channels,)
    if not ok or not x_inv_channels.is_contiguous() or x_inv_channels.device != x.device:
        raise ValueError(
            f"{name}: x_inv_channels must be a contiguous float32 [{channels}] on {x.device} (one per input "
            f"channel), got {x_inv_channels.dtype} {list(x_inv_channels.shape)} on {x_inv_channels.device}"
        )
    return x_inv_channels


def conv_epilogue_nhwc(
    acc: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    pre: Activation = NO_ACTIVATION,
    post: Activation = NO_ACTIVATION,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FusedConv's epilogue `post(pre(acc + bias) + residual)` in one pass over a convolution's result `acc`
    (N, C, H, W, channels_last and contiguous: another library's convolution without its bias), in float32,
    rounded once into `out` (any strides, acc's shape; `acc` itself works) or a new channels_last tensor of
    acc's type. `residual` broadcasts to acc's shape and is read through its own strides."""
    name = "conv_epilogue_nhwc"
    if acc.dim() != 4 or acc.dtype not in _FLOAT_TYPES or not acc.is_contiguous(memory_format=torch.channels_last):
        raise ValueError(
            f"{name}: acc must be a 4-D float16/bfloat16/float32 channels_last tensor, got {acc.dtype} "
            f"{list(acc.shape)} with strides {list(acc.stride())}"
        )
    n, channels, oh, ow = acc.shape
    if bias is not None and (tuple(bias.shape) != (channels,) or bias.device != acc.device):
        raise ValueError(f"{name}: bias must be [{channels}] on {acc.device}, got {list(bias.shape)} on {bias.device}")
    if out is None:
        out = torch.empty_like(acc, memory_format=torch.channels_last)
    _check_out(name, out, tuple(acc.shape), out.dtype, acc.device)
    residual = broadcast_residual(name, residual, acc.shape)
    m = n * oh * ow
    if m == 0 or channels == 0:
        return out
    res = residual if residual is not None else out
    grid = (triton.cdiv(m, _REDUCE_BLOCK_M), triton.cdiv(channels, _REDUCE_BLOCK_N), 1)
    _split_k_epilogue[grid](
        acc, 1, m, oh, ow, channels,
        bias if bias is not None else out, res, *(residual.stride() if residual is not None else (0, 0, 0, 0)),
        out, *out.stride(), *pre[1:], *post[1:], out, 1.0, 1.0, 1.0,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, PRE=pre[0], POST=post[0], QUANT=0, QUANT_Y=0,
        BLOCK_M=_REDUCE_BLOCK_M, BLOCK_N=_REDUCE_BLOCK_N, num_warps=4,
    )  # fmt: skip
    return out
