"""Stride-1 convolutions of one group as GEMMs whose operands the Tensor Memory Accelerator moves (Hopper's TMA).

A stride-1 convolution over channels_last tensors needs no gather: for filter tap (kh, kw), the input pixels
that output pixels (n, oh, ow) read are X[n, oh + kh − PH, ow + kw − PW, :], the same box of the input shifted.
So each operand is a tensor descriptor, and a K tile (one tap, BLOCK_K channels) arrives in shared memory as one
bulk copy, already in the swizzled layout the tensor cores read, with no address arithmetic or per-element
masks in the loop: coordinates outside the tensor (the padding, ragged tiles, channels past Cin) read as zeros,
and stores outside it are dropped. The result leaves through shared memory in whole rows. The pointer-gathering
kernel of `kernels.triton.conv` spends its issue slots on addresses and masks and stores each thread's few
scattered elements of the MMA layout.

Two tilings, by geometry:
- rows (an unpadded 1×1 layer whose operands' pixels sit at one stride: a dense NHWC tensor or a channel slice
  of one): a plain GEMM, X [M, Cin] · W [Cin, Cout] with M = N·H·W; BLOCK_M consecutive pixels per tile, no waste.
- boxes (any filter, any padding): 4-D descriptors over (N, H, W, C); a tile is a box of BI images × BH rows ×
  BW columns of output pixels (BLOCK_M of them, powers of two fitted to the output, `spatial_box`), and the K loop
  walks taps × channel blocks, loading the input box shifted by each tap. A box that does not divide the output
  wastes its lanes past the edge, so the box is the one that wastes least: at batch 256 a 7×7 map goes in boxes of
  128 images × 1 × 1 pixel, all lanes busy (one image's 8×8 boxes would be 77% busy). An unpadded strided 1×1
  layer (a ResNet downsample) reads its input through a view of every s-th pixel (`subsampled`), whose strides a
  descriptor takes.

K order: tap-major, channels inside, as the packed weight (`conv.pack_weight`) stores K. When Cin is not a
multiple of BLOCK_K a tile's last channels are zeros read past Cin, so the weight rows they meet (the next tap's)
add nothing.

The epilogue is `kernels.triton.conv`'s: dequantization (`acc · x_scale · w_scale[n]` for int8 / E4M3), bias,
pre-activation, residual (read with its own descriptor, dequantized by z_scale when quantized), post-activation,
then a cast or a requantization (`y_scale`) as it is stored.

`gemm_rows` runs the rows tiling for a plain 2-D product with a bias row (`kernels.triton.gemm`'s "TMA"
configurations: a linear layer is a 1×1 convolution over its rows).

`launch` runs it when the geometry (`tma_problem`) and every operand allow: channels innermost, the other
strides and the base 16-byte aligned, a residual of the output's shape (`launch` says what does not);
`conv`'s launcher falls back to the gathering kernel with the same tiles otherwise, so a `tma` configuration is
valid for every call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .epilogue import RELU, activate, dequantize_bias_pre, quantize, widen
from .tiles import swizzle, wave_slots

_ALIGN_BYTES = 16  # TMA: global addresses and every stride but the last in multiples of 16 bytes
_MAX_BOX = 256  # TMA: at most 256 elements along each box dimension


@triton.jit
def _conv_tma(
    a_desc, b_desc, z_desc, y_desc, bias, w_scale,
    M, IMAGES, OH, OW, N, CIN,
    pre0, pre1, post0, post1, x_scale, x_inv_scale, y_inv_scale, z_scale,
    KH: tl.constexpr, KW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    BOXES: tl.constexpr, BI: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
    QUANT: tl.constexpr, QUANTIZE_X: tl.constexpr, QUANT_Y: tl.constexpr, W_K_MAJOR: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PERSISTENT: tl.constexpr, SWAP: tl.constexpr, PROMOTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """[BLOCK_M, BLOCK_N] output tiles: BLOCK_M pixels (M of them with rows, BI·BH·BW boxes of the (IMAGES, OH,
    OW) output with BOXES) × BLOCK_N of the N output channels; K = KH·KW·CIN. The weight through b_desc ([N, K]
    when W_K_MAJOR, else [K, N]). Tiles are swizzled (`tiles.swizzle`); one per program, or with PERSISTENT a
    grid-stride walk over all of them in one flattened loop, so the next tile's loads are issued while this one's
    epilogue runs (a 1×1 layer of 64 input channels is one K step: without it, each program waits for its loads,
    then for its stores). With SWAP each tile is computed transposed, Yᵀ = W · Xᵀ: the weight's
    BLOCK_N rows are the product's M and the BLOCK_M pixels its N, so a layer of 64 output channels runs
    instructions as wide as its pixel tile allows (m64n128 against m64n64: less shared memory read a product;
    8-bit operands K-major, as wgmma needs them); the epilogue reads the tile back in the usual orientation.
    PROMOTE (E4M3 products): each BLOCK_K step's tensor-core sum added into the float32 accumulator
    (`max_num_imprecise_acc`); without, the sums are left to the tensor cores (`conv.ConvConfig.promote`)."""
    if BOXES:
        m_tiles = tl.cdiv(IMAGES, BI) * tl.cdiv(OH, BH) * tl.cdiv(OW, BW)
    else:
        m_tiles = tl.cdiv(M, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), m_tiles * n_tiles, tl.num_programs(0), flatten=True):
            _conv_tile(
                tile, m_tiles, n_tiles, a_desc, b_desc, z_desc, y_desc, bias, w_scale, OH, OW, N, CIN,
                pre0, pre1, post0, post1, x_scale, x_inv_scale, y_inv_scale, z_scale, KH, KW, PH, PW, BOXES, BI, BH,
                BW, HAS_BIAS, HAS_RES, PRE, POST, QUANT, QUANTIZE_X, QUANT_Y, W_K_MAJOR, DOT_PRECISION, SWAP,
                PROMOTE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
            )  # fmt: skip
    else:
        _conv_tile(
            tl.program_id(0), m_tiles, n_tiles, a_desc, b_desc, z_desc, y_desc, bias, w_scale, OH, OW, N, CIN,
            pre0, pre1, post0, post1, x_scale, x_inv_scale, y_inv_scale, z_scale, KH, KW, PH, PW, BOXES, BI, BH, BW,
            HAS_BIAS, HAS_RES, PRE, POST, QUANT, QUANTIZE_X, QUANT_Y, W_K_MAJOR, DOT_PRECISION, SWAP, PROMOTE,
            BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
        )  # fmt: skip


@triton.jit
def _conv_tile(
    tile, m_tiles, n_tiles, a_desc, b_desc, z_desc, y_desc, bias, w_scale, OH, OW, N, CIN,
    pre0, pre1, post0, post1, x_scale, x_inv_scale, y_inv_scale, z_scale,
    KH: tl.constexpr, KW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    BOXES: tl.constexpr, BI: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
    QUANT: tl.constexpr, QUANTIZE_X: tl.constexpr, QUANT_Y: tl.constexpr, W_K_MAJOR: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SWAP: tl.constexpr, PROMOTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Output tile number `tile` of `_conv_tma`."""
    pid_m, pid_n = swizzle(tile, m_tiles, n_tiles, GROUP_M)
    off_n = pid_n * BLOCK_N
    if BOXES:
        h_tiles = tl.cdiv(OH, BH)
        w_tiles = tl.cdiv(OW, BW)
        i0 = (pid_m // (h_tiles * w_tiles)) * BI
        oh0 = ((pid_m // w_tiles) % h_tiles) * BH
        ow0 = (pid_m % w_tiles) * BW
    else:
        off_m = pid_m * BLOCK_M

    if SWAP and QUANT == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32)
    elif SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    elif QUANT == 1:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    c_tiles = tl.cdiv(CIN, BLOCK_K)
    for kt in range(0, KH * KW * c_tiles):
        tap = kt // c_tiles
        c0 = (kt - tap * c_tiles) * BLOCK_K
        if BOXES:
            kh = tap // KW
            a = a_desc.load([i0, oh0 + kh - PH, ow0 + (tap - kh * KW) - PW, c0])  # zeros outside: the padding
            a = tl.reshape(a, [BLOCK_M, BLOCK_K])
        else:
            a = a_desc.load([off_m, c0])
        if QUANTIZE_X:
            a = quantize(a, x_inv_scale, QUANT, OPERAND=True)  # zeros quantize to 0
        k = tap * CIN + c0
        if SWAP:  # Yᵀ += W[n, k] · X[m, k]ᵀ
            b = a.T
            if W_K_MAJOR:
                a = b_desc.load([off_n, k])
            else:
                a = b_desc.load([k, off_n]).T
        elif W_K_MAJOR:
            b = b_desc.load([off_n, k]).T
        else:
            b = b_desc.load([k, off_n])
        if QUANT == 1:
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        elif QUANT == 2 and PROMOTE:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)  # see conv._conv2d_igemm
        elif QUANT == 2:
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if SWAP:
        acc = acc.T

    cols = off_n + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    narrow: tl.constexpr = QUANT_Y != 0 or y_desc.dtype.primitive_bitwidth <= 16
    acc = dequantize_bias_pre(acc, cols, col_ok, w_scale, x_scale, bias, pre0, pre1, QUANT, HAS_BIAS, PRE, narrow)
    if HAS_RES:
        if BOXES:
            z = tl.reshape(z_desc.load([i0, oh0, ow0, off_n]), [BLOCK_M, BLOCK_N])
        else:
            z = z_desc.load([off_m, off_n])
        acc += widen(z) * z_scale
    acc = activate(acc, POST, post0, post1, narrow)
    if QUANT_Y != 0:
        out = quantize(acc, y_inv_scale, QUANT_Y, NONNEG=POST == RELU)
    else:
        out = acc.to(y_desc.dtype)
    if BOXES:  # pixels and channels outside the output are not written
        y_desc.store([i0, oh0, ow0, off_n], tl.reshape(out, [BI, BH, BW, BLOCK_N]))
    else:
        y_desc.store([off_m, off_n], out)


def spatial_box(block_m: int, out_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """(BI, BH, BW): images × rows × columns of output pixels in a tile of `block_m` (a power of two) over an
    output of `out_shape` (images, rows, columns): powers of two (at most 256 each, TMA's largest box side)
    whose boxes cover the output with the fewest lanes past its edges, then with the fewest images. ResNet's maps
    at batch 256 and 128 pixels a tile: 56² in boxes of 2 × 8 × 8 (all lanes busy; 8 × 16 boxes of one image
    would leave an eighth idle), 28² in 8 × 4 × 4, 14² in 32 × 2 × 2, 7² in 128 × 1 × 1 (77% busy in 8 × 8)."""
    sides = [1 << i for i in range(block_m.bit_length()) if (1 << i) <= _MAX_BOX]

    def covered(side: int, extent: int) -> int:
        return -(-extent // side) * side

    boxes = [(block_m // (bh * bw), bh, bw) for bh in sides for bw in sides if block_m // (bh * bw) in sides]
    return min(
        boxes,
        key=lambda box: (
            covered(box[0], out_shape[0]) * covered(box[1], out_shape[1]) * covered(box[2], out_shape[2]),
            box[0],
            -box[2],
        ),
    )


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


def _descriptor(t: torch.Tensor, pixels: list[int], block_c: int) -> TensorDescriptor | str:
    """The descriptor of a 4-D (N, C, H, W) operand in boxes of `pixels` × `block_c` channels: with one pixel
    extent (rows mode) over its [pixels, channels] matrix, with three (BI, BH, BW) over its (N, H, W, C) view;
    or why there is none."""
    size = t.element_size()
    if t.shape[1] > 1 and t.stride(1) != 1:
        return f"its channels are not contiguous (strides {list(t.stride())})"
    if t.data_ptr() % _ALIGN_BYTES:
        return f"its data at {t.data_ptr():#x} is not 16-byte aligned"
    if len(pixels) == 1:
        rows = _rows(t)
        if rows is None:
            return f"its pixels are not rows at one stride (strides {list(t.stride())})"
        m, c, row = rows
        shape, strides = [m, c], [row, 1]
    else:
        n, c, h, w = t.shape
        shape, strides = [n, h, w, c], [t.stride(0), t.stride(2), t.stride(3), 1]
    strides = _settled(shape, strides)
    if any((s * size) % _ALIGN_BYTES for s in strides[:-1]):
        return f"its strides {list(t.stride())} of {size}-byte elements are not multiples of 16 bytes"
    return TensorDescriptor(t, shape, strides, [*pixels, block_c])


def _settled(shape: list[int], strides: list[int]) -> list[int]:
    """`strides` with each extent-1 axis's (never used to address, but checked by TMA like the others) replaced
    by the one a contiguous tensor would have there."""
    settled = list(strides)
    for axis in range(len(shape) - 2, -1, -1):
        if shape[axis] == 1:
            settled[axis] = settled[axis + 1] * shape[axis + 1]
    return settled


def _weight_matrix(weight: torch.Tensor, k_major: bool, block_n: int, block_k: int) -> TensorDescriptor | str:
    """The packed (1, KH, KW, Cin, Cout) weight as an [N, K] (K-major) or [K, N] matrix descriptor."""
    _, kh, kw, cin, cout = weight.shape
    k_total = kh * kw * cin
    if k_major:
        shape, strides, block = [cout, k_total], [weight.stride(4), 1], [block_n, block_k]
    else:
        shape, strides, block = [k_total, cout], [weight.stride(3), 1], [block_k, block_n]
    if weight.data_ptr() % _ALIGN_BYTES or (strides[0] * weight.element_size()) % _ALIGN_BYTES:
        return "the packed weight's rows are not 16-byte aligned (K or Cout × element size a multiple of 16)"
    return TensorDescriptor(weight, shape, strides, block)


def subsampled(x: torch.Tensor, weight: torch.Tensor, geometry: tuple, out_hw) -> tuple[torch.Tensor, tuple]:
    """A strided 1×1 convolution without padding is a stride-1 one over every s-th pixel of its input: `x` as
    that view (its pixel strides s times the input's, which TMA reads in boxes) and the geometry of stride 1.
    Any other call (or one whose output is not that view's size) as given."""
    strides, pads_begin, dilations = geometry
    if tuple(weight.shape[1:3]) != (1, 1) or tuple(strides) == (1, 1) or any(pads_begin):
        return x, geometry
    view = x[:, :, :: strides[0], :: strides[1]]
    if tuple(view.shape[2:]) != tuple(out_hw):
        return x, geometry
    return view, ((1, 1), pads_begin, dilations)


def tma_problem(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, geometry: tuple) -> str | None:
    """Why the call's geometry rules the TMA kernel out; None when only the operands' strides remain to check.
    `geometry`: (strides, pads_begin, dilations) as `conv._launch` has them."""
    strides, _, dilations = geometry
    if weight.shape[0] != 1:
        return f"one group only (weight of {weight.shape[0]} groups)"
    if tuple(strides) != (1, 1) or tuple(dilations) != (1, 1):
        return "stride 1 and dilation 1 only"
    if residual is not None and any(s == 0 for s, n in zip(residual.stride(), residual.shape, strict=True) if n > 1):
        return "the residual is broadcast"
    return hopper_problem(x.device)


def hopper_problem(device: torch.device) -> str | None:
    """Why `device` cannot run this module's kernels: tensor descriptors need Hopper (compute capability 9.0) or
    newer; None on such a GPU, and on the CPU (Triton's interpreter)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        return "tensor descriptors need compute capability 9.0 (Hopper) or newer"
    return None


def launch(
    x: torch.Tensor, weight: torch.Tensor, k_major: bool, bias: torch.Tensor | None, residual: torch.Tensor | None,
    y: torch.Tensor, geometry: tuple, pre, post, cfg, *, dot_precision: str, quant: int,
    weight_scale: torch.Tensor | None, x_scale: float, y_scale: float, z_scale: float,
) -> str | None:  # fmt: skip
    """Run the TMA kernel into `y` (operands checked by `conv`'s callers; `geometry` as `tma_problem` takes it);
    returns why it did not run (`tma_problem`'s reason, or which operand's strides or address TMA cannot
    take), None when it ran."""
    x, geometry = subsampled(x, weight, geometry, y.shape[2:])
    problem = tma_problem(x, weight, residual, geometry)
    if problem:
        return problem
    _, pads_begin, _ = geometry
    _, kh, kw, cin, cout = weight.shape
    n, _, oh, ow = y.shape
    operands = {"x": x, "residual": residual, "y": y}
    plain = (
        (kh, kw) == (1, 1)
        and not any(pads_begin)
        and all(_rows(t) is not None for t in operands.values() if t is not None)
    )
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    box = None if plain else spatial_box(bm, (n, oh, ow))
    pixels = [bm] if box is None else list(box)
    descriptors = {
        name: _descriptor(t, pixels, bk if name == "x" else bn) for name, t in operands.items() if t is not None
    }
    descriptors["weight"] = _weight_matrix(weight, k_major, bn, bk)
    for name, descriptor in descriptors.items():
        if isinstance(descriptor, str):
            return f"{name}: {descriptor}"
    if box is None:
        m_tiles = triton.cdiv(n * oh * ow, bm)
    else:
        m_tiles = triton.cdiv(n, box[0]) * triton.cdiv(oh, box[1]) * triton.cdiv(ow, box[2])
    bi, bh, bw = box or (1, 1, 1)
    _run(
        descriptors["x"], descriptors["weight"], descriptors.get("residual"), descriptors["y"], bias,
        weight_scale, y, (n * oh * ow, n, oh, ow, cout, cin), (*pre[1:], *post[1:]), (x_scale, y_scale, z_scale),
        (m_tiles, bm, bn), cfg.group_m, cfg.num_warps, cfg.num_stages, cfg.persistent,
        KH=kh, KW=kw, PH=pads_begin[0], PW=pads_begin[1], BOXES=box is not None, BI=bi, BH=bh, BW=bw,
        PRE=pre[0], POST=post[0], QUANT=quant, QUANTIZE_X=quant != 0 and x.dtype != weight.dtype,
        QUANT_Y=quant if y_scale else 0, W_K_MAJOR=k_major, DOT_PRECISION=dot_precision, SWAP=cfg.swap,
        PROMOTE=cfg.promote, BLOCK_K=bk,
    )  # fmt: skip
    return None


def _run(
    a_desc, b_desc, z_desc, y_desc, bias, weight_scale, y, sizes, activations, scales, tiles, group_m, warps,
    stages, persistent, **constants,
) -> None:  # fmt: skip
    """Launch `_conv_tma`: `sizes` (M, IMAGES, OH, OW, N, CIN), `activations` (pre0, pre1, post0, post1),
    `scales` (x_scale, y_scale, z_scale; 0 for none), `tiles` (row tiles, BLOCK_M, BLOCK_N); `persistent`
    programs per multiprocessor walk the tiles when there are more tiles than that (0: a program per tile)."""
    x_scale, y_scale, z_scale = scales
    m_tiles, block_m, block_n = tiles
    count = m_tiles * triton.cdiv(sizes[4], block_n)
    programs = persistent * wave_slots(y.device)
    walk = 0 < programs < count
    _conv_tma[(programs if walk else count,)](
        a_desc, b_desc, z_desc if z_desc is not None else y_desc, y_desc, bias if bias is not None else y,
        weight_scale if weight_scale is not None else y, *sizes, *activations, x_scale, 1.0 / x_scale,
        1.0 / y_scale if y_scale else 1.0, z_scale if z_scale else 1.0,
        HAS_BIAS=bias is not None, HAS_RES=z_desc is not None, PERSISTENT=walk, BLOCK_M=block_m, BLOCK_N=block_n,
        GROUP_M=group_m, num_warps=warps, num_stages=stages, **constants,
    )  # fmt: skip


def gemm_rows(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, y: torch.Tensor,
    pre, post, tile: tuple[int, int, int, int, int, int], dot_precision: str = "ieee", *, quant: int = 0,
    weight_scale: torch.Tensor | None = None, x_scale: float = 1.0, y_scale: float = 0.0, z_scale: float = 0.0,
    persistent: int = 0,
) -> str | None:  # fmt: skip
    """`Y = post(pre(A · B + bias) + residual)` for 2-D A [M, K], B [K, N] (either of its axes contiguous: a
    weight stored [N, K] is read K-major), bias [N] (contiguous) and residual, Y [M, N] rows, through the rows
    kernel; `tile` (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages). Quantized (`quant` 1 int8, 2 E4M3: B of
    that type, A too or float and quantized on load by `x_scale`): `A · B · x_scale · weight_scale[n]`, and
    with `y_scale` Y requantized as it is stored, and a quantized residual added as residual · z_scale, as
    `conv2d_nhwc_quantized`. `persistent`: programs per
    multiprocessor walking the tiles (0: one per tile). Returns why TMA cannot take the operands, None when it
    ran."""
    problem = hopper_problem(a.device)
    if problem:
        return problem
    block_m, block_n, block_k, group_m, warps, stages = tile
    k_major = b.stride(0) == 1 and b.shape[0] > 1
    operands = {
        "a": (a, [block_m, block_k]),
        "b": (b.T, [block_n, block_k]) if k_major else (b, [block_k, block_n]),
        "residual": (residual, [block_m, block_n]),
        "y": (y, [block_m, block_n]),
    }
    descriptors = {name: _matrix(t, block) for name, (t, block) in operands.items() if t is not None}
    for name, descriptor in descriptors.items():
        if isinstance(descriptor, str):
            return f"{name}: {descriptor}"
    if bias is not None and bias.stride(-1) != 1:
        return "bias: not a contiguous row"
    (m, k), n = a.shape, y.shape[1]
    _run(
        descriptors["a"], descriptors["b"], descriptors.get("residual"), descriptors["y"], bias, weight_scale, y,
        (m, 1, 1, 1, n, k), (*pre[1:], *post[1:]), (x_scale, y_scale, z_scale),
        (triton.cdiv(m, block_m), block_m, block_n), group_m, warps, stages, persistent, KH=1, KW=1, PH=0, PW=0,
        BOXES=False, BI=1, BH=1, BW=1, PRE=pre[0], POST=post[0], QUANT=quant,
        QUANTIZE_X=quant != 0 and a.dtype != b.dtype, QUANT_Y=quant if y_scale else 0, W_K_MAJOR=k_major,
        DOT_PRECISION=dot_precision, SWAP=False, PROMOTE=True, BLOCK_K=block_k,
    )  # fmt: skip
    return None


def _matrix(t: torch.Tensor, block: list[int]) -> TensorDescriptor | str:
    """The descriptor of a 2-D tensor with a contiguous last axis, or why TMA cannot take it."""
    if t.stride(1) != 1 and t.shape[1] > 1:
        return f"its last axis is not contiguous (strides {list(t.stride())})"
    strides = _settled(list(t.shape), [t.stride(0), 1])
    if t.data_ptr() % _ALIGN_BYTES or (strides[0] * t.element_size()) % _ALIGN_BYTES:
        return f"its rows (stride {t.stride(0)} of {t.element_size()}-byte elements) are not 16-byte aligned"
    return TensorDescriptor(t, list(t.shape), strides, block)
