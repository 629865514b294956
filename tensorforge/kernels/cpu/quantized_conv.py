"""An int8 one-group convolution of any window, stride, dilation and padding (ResNet's 3×3 and 7×7 layers in an
int8 engine) on the CPU in C++ with AVX-512 VNNI, with QuantizedConv's arithmetic and whole epilogue:

    y[n, oh, ow, k] = out(post(pre(x_scale · Ws[k] · Σ_(kh,kw,c) Q(x)[n, ih, iw, c] · Wq[k, c, kh, kw] + b[k]) + z))
    ih = oh·s_h − p_h + kh·d_h,  iw = ow·s_w − p_w + kw·d_w

The int8 1×1 kernel's tile (`kernels.cpu.quantized_pointwise`: offset uint8 inputs, `vpdpbusd`, sums started at
−128·ΣWq, the same epilogue) over the window's taps, as the float direct convolution (`kernels.cpu.conv`) repeats
the float 1×1 step: `rows` output pixels of one output row × `vectors` vectors of 16 output channels in registers,
each tap adding its quads of input channels. The offset inputs are written inside a frame of padding that holds 128s
— quantized zeros, offset — so that the start of the sums holds at the edges and no tap needs a bounds check; at
dilation 1 a window row's taps are contiguous bytes, one run of steps. The weight is packed once in column blocks
[KH·KW, C/4, 16·vectors, 4].
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ..activations import ACTIVATION_CODES
from . import quantized_pointwise as qp
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic
from .avx512 import check_activations, load_avx512, module_source, rounded

TILES = ((8, 3), (6, 4))  # (output pixels of a row, vectors of 16 output channels); the C++ instantiates these

CORE = r"""

struct Window {
  int64_t N, H, W, OH, OW, KH, KW, sh, sw, dh, dw;
  int64_t Hp, Wp;  // the offset inputs' image in its frame of padding (q.x: [N, Hp, Wp, Cq])
};

// Output pixels ow0 .. ow0+count-1 of row oh of image n (the tile's other rows repeat the last pixel and are not
// stored) × output vectors from k0, NV of them; the outputs dense rows. The inputs sit in a frame of padding, so no
// tap needs a bounds check, and at dilation 1 a window row's KW taps are KW·Cq contiguous bytes, the weight's
// quads for them consecutive too: one run of KW·Cq/4 steps a row.
template <int MR, int NV>
inline void conv_tile(const Problem& q, const Window& g, int64_t n, int64_t oh, int64_t ow0, int count, int64_t k0) {
  __m512i acc[MR * NV];
  start_sums<MR, NV>(q, acc, k0);
  const int64_t quads = q.Cq / 4, tap = q.Cq * 16 * NV;  // a tap's steps and its weight's bytes
  const int8_t* block = q.w + k0 * g.KH * g.KW * q.Cq;
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    const uint8_t* row = q.x + (n * g.Hp + oh * g.sh + kh * g.dh) * g.Wp * q.Cq;
    const uint8_t* a[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) a[r] = row + (ow0 + std::min(r, count - 1)) * g.sw * q.Cq;
    if (g.dw == 1) {
      accumulate_quads<MR, NV>(acc, a, block + kh * g.KW * tap, g.KW * quads);
      continue;
    }
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const uint8_t* shifted[MR];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) shifted[r] = a[r] + kw * g.dw * q.Cq;
      accumulate_quads<MR, NV>(acc, shifted, block + (kh * g.KW + kw) * tap, quads);
    }
  }
  finish<MR, NV>(q, acc, (n * g.OH + oh) * g.OW + ow0, count, k0);
}

template <int MR, int R>
inline void conv_narrower(const Problem& q, const Window& g, int64_t n, int64_t oh, int64_t ow0, int count,
                          int64_t k0, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) conv_tile<MR, R>(q, g, n, oh, ow0, count, k0);
    else conv_narrower<MR, R - 1>(q, g, n, oh, ow0, count, k0, left);
  }
}

// Work items: a tile of an output row × a block of NV output vectors; a tile's blocks in turn, or, where the weight
// outweighs the inputs (the deep layers), a block's tiles, so that each block is read from memory once.
template <int MR, int NV>
void conv_run(const Problem& q, const Window& g) {
  const int64_t vectors = q.Kp / 16, blocks = (vectors + NV - 1) / NV, tiles = (g.OW + MR - 1) / MR;
  const int64_t pixels = g.N * g.OH * tiles;
  const bool by_block = g.KH * g.KW * q.Kp > g.N * g.H * g.W;  // weight bytes against the inputs', per channel quad
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, MR * g.KH * g.KW * q.Cq * 16 * NV));
  at::parallel_for(0, pixels * blocks, grain, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t block = by_block ? i / pixels : i % blocks, at = by_block ? i % pixels : i / blocks;
      const int64_t v = block * NV, row = at / tiles, ow0 = at % tiles * MR;
      const int64_t n = row / g.OH, oh = row % g.OH;
      const int count = int(std::min<int64_t>(MR, g.OW - ow0));
      if (vectors - v >= NV) conv_tile<MR, NV>(q, g, n, oh, ow0, count, 16 * v);
      else conv_narrower<MR, NV - 1>(q, g, n, oh, ow0, count, 16 * v, vectors - v);
    }
  });
}

"""

SOURCE = module_source(
    qp.CORE + CORE,
    r"""

// x [N, C, H, W] float32, bf16 or int8 with contiguous channels (pixel (n, h, w) at n·sn + h·sh + w·sw), quantized
// with x_inverse (a float x); w packed by `pack_weight`, start [Kp] int32, scale and b [Kp] float32; z and y [N, K,
// OH, OW] channels_last (dense), z float32, bf16 or int8 (times z_scale) or empty, y float32, bf16 or int8
// (quantized with y_inverse); `window` (KH, KW, stride h, w, leading padding h, w, dilation h, w).
void quantized_conv(torch::Tensor x, int64_t sn, int64_t sh, int64_t sw, double x_inverse, torch::Tensor w,
                    torch::Tensor start, torch::Tensor scale, torch::Tensor b, torch::Tensor z, double z_scale,
                    torch::Tensor y, double y_inverse, std::vector<int64_t> window, int64_t pre, double pre0,
                    double pre1, int64_t post, double post0, double post1, int64_t rows, int64_t vectors) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), Cq = (C + 3) / 4 * 4;
  const int64_t K = y.size(1), Kp = start.size(0), OH = y.size(2), OW = y.size(3);
  TORCH_CHECK(window.size() == 8, "quantized_conv: window (KH, KW, sh, sw, ph, pw, dh, dw)");
  TORCH_CHECK(w.scalar_type() == at::kChar && w.numel() == window[0] * window[1] * Cq * Kp,
              "quantized_conv: an int8 weight of ", window[0] * window[1] * Cq * Kp, " values expected, not ",
              w.numel());
  const int64_t KH = window[0], KW = window[1], ph = window[4], pw = window[5];
  // the frame: the leading padding, and after the input as far as the last output's window reaches
  const int64_t Hp = std::max(ph + H, (OH - 1) * window[2] + (KH - 1) * window[6] + 1);
  const int64_t Wp = std::max(pw + W, (OW - 1) * window[3] + (KW - 1) * window[7] + 1);
  torch::Tensor fresh;
  const uint8_t* offset = offset_input("quantized_conv", x, sn, sh, sw, Cq, x_inverse, ph, pw, Hp, Wp, fresh);
  const Problem q = problem_of("quantized_conv", N * OH * OW, C, K, Cq, offset, w, start, scale, b, z, K, z_scale, y,
                               K, y_inverse, pre, pre0, pre1, post, post0, post1);
  const Window g{N, H, W, OH, OW, KH, KW, window[2], window[3], window[6], window[7], Hp, Wp};
  if (rows == 8 && vectors == 3) conv_run<8, 3>(q, g);
  else if (rows == 6 && vectors == 4) conv_run<6, 4>(q, g);
  else TORCH_CHECK(false, "quantized_conv: no tile of ", rows, " pixels by ", vectors, " vectors (8×3 or 6×4)");
}
""",
)


def pack_weight(wq: torch.Tensor, vectors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 weight [K, C, KH, KW] as column blocks of `vectors` × 16 output channels, each [KH·KW, C/4,
    16·vectors, 4] (C rounded up to 4, K up to 16, zeros past them), flat; and the sums' start −128·ΣWq over every
    tap and input channel, int32 [K rounded up to 16]."""
    k, c, kh, kw = wq.shape
    columns = torch.zeros(kh * kw, -(-c // 4) * 4, rounded(k), dtype=torch.int8)
    columns[:, :c, :k] = wq.detach().permute(2, 3, 1, 0).reshape(kh * kw, c, k)
    blocks = columns.split(16 * vectors, dim=2)
    packed = torch.cat([block.unflatten(1, (-1, 4)).transpose(2, 3).reshape(-1) for block in blocks])
    start = -128 * columns.sum(dim=(0, 1), dtype=torch.int32)
    return packed, start


class QuantizedConv:
    """An int8 convolution ready to run: its weight [K, C, KH, KW] (int8), the dequantizing factors x_scale · Ws[k]
    and the bias packed, its window, epilogue (activations by name, `ACTIVATIONS`) and tile checked, once."""

    __slots__ = (
        "_bias", "_dilations", "_epilogue", "_module", "_scale", "_start", "_strides", "_weight", "channels",
        "in_channels", "kernel", "x_scale",
    )  # fmt: skip

    def __init__(
        self,
        wq: torch.Tensor,
        w_scale: torch.Tensor,
        x_scale: float,
        bias: torch.Tensor | None = None,
        strides: Sequence[int] = (1, 1),
        dilations: Sequence[int] = (1, 1),
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] = (8, 3),
    ) -> None:
        check_activations("int8 convolution", pre, post)
        if tuple(tile) not in TILES:
            raise ValueError(f"the CPU int8 convolution kernel tiles {TILES} (pixels, vectors), not {tile}")
        if wq.dtype != torch.int8 or wq.dim() != 4:
            raise ValueError(f"the weight must be an int8 [K, C, KH, KW] tensor, not {wq.dtype} {tuple(wq.shape)}")
        self.channels, self.in_channels, self.kernel = wq.shape[0], wq.shape[1], tuple(wq.shape[2:])
        self.x_scale = float(x_scale)
        self._strides, self._dilations = [int(s) for s in strides], [int(d) for d in dilations]
        self._weight, self._start = pack_weight(wq, tile[1])
        self._scale, self._bias = qp.pack_factors(w_scale, self.x_scale, bias, self.channels)
        self._epilogue = (ACTIVATION_CODES[pre], *pre_params, ACTIVATION_CODES[post], *post_params, *tile)
        self._module = module()

    def __call__(
        self,
        x: torch.Tensor,
        pads: Sequence[int],
        out_hw: Sequence[int],
        residual: torch.Tensor | None = None,
        z_scale: float = 0.0,
        y_scale: float = 0.0,
        float_type: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The layer on x [N, C, H, W] (float32 or bf16, quantized here with x_scale, or int8 already quantized;
        channels contiguous, any pixel strides) with leading padding `pads` (h, w) into `out_hw` output pixels, a
        residual [N, K, OH, OW] (float32 or bf16, or int8 times `z_scale`); int8 out quantized with `y_scale` when it
        is positive, else float (`float_type`, by default `quantized_pointwise.output_type`'s): a new channels_last
        tensor."""
        x = qp.input_operand(x, self.in_channels, "convolution")
        shape = (x.shape[0], self.channels, *out_hw)
        dtype, y_inverse = qp.output_type(y_scale, x, residual, float_type)
        out = torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)
        z, z_scale = qp.residual_operand(residual, z_scale, shape)
        window = [*self.kernel, *self._strides, *pads, *self._dilations]
        self._module.quantized_conv(
            x, x.stride(0), x.stride(2), x.stride(3), 1.0 / self.x_scale, self._weight, self._start, self._scale,
            self._bias, z, z_scale, out, y_inverse, window, *self._epilogue,
        )  # fmt: skip
        return out


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache); RuntimeError without VNNI."""
    reason = qp.problem()
    if reason:
        raise RuntimeError(reason)
    return load_avx512("quantized_conv", SOURCE, "int8 convolution")
