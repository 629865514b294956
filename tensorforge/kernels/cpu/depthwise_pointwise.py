"""A depthwise convolution and the 1×1 convolution that reads it, in one pass, on the CPU in C++ with AVX-512,
float32 or bf16 (a CPU with AVX512-BF16: bf16 activations and 1×1 weights, float32 sums), channels_last:

    h[n, oh, ow, c] = act(bd[c] + Σ_kh,kw wd[kh, kw, c] · x[n, oh·s_h − p_h + kh·d_h, ow·s_w − p_w + kw·d_w, c])
    y[n, oh, ow, k] = post(pre(bp[k] + Σ_c h[n, oh, ow, c] · wp[c, k]) + z[n, oh, ow, k])

The blocks of MobileNet-style networks. A thread takes output rows: it computes one row of h, every channel, into a
buffer of its own (`kernels.cpu.depthwise`'s row: register windows of 8 output pixels, masked borders), then the
1×1 tiles of `kernels.cpu.pointwise` read that row from the buffer and write the row of y with their epilogue. h,
the widest tensor of a block, never goes to memory: in an engine the two layers apart spent most of their time on
cache misses (the depthwise output written cold, then read back), not arithmetic (docs/design.md, "The CPU at
batch 1"). Both kernels' C++ is reused as it is (`CORE`, each in a namespace).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ..activations import ACTIVATION_CODES
from . import depthwise as dw
from . import pointwise as pw
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic
from .avx512 import (
    VECTOR_MATH,
    check_activations,
    kernel_dtype,
    load_vector,
    pack_bias,
    tile_dispatch,
    vector_problem,
)

# The 1×1 part's tiles (pixels, vectors of 16 output channels): the 1×1 kernel's that span a row of pixels; the
# depthwise part's is the depthwise kernel's widest that suits its window (`depthwise.ROW_TILE`, `WINDOW`).
TILES = pw.ROW_TILES

SOURCE = (
    VECTOR_MATH
    + "namespace dwk {\n"
    + dw.CORE
    + "}  // namespace dwk\nnamespace pwk {\n"
    + pw.CORE
    + "}  // namespace pwk\n"
    + r"""
namespace {

// Elem: float, or uint16_t for bf16 activations (x, the row buffer, z and y); the weights of the 1×1 part in Elem
// too (bf16: in pairs), the depthwise weights, biases, sums and epilogues float32.
template <typename Elem>
struct Fused {
  dwk::Geometry g;       // x into one row buffer: yW = Cp, yN = yH = 0
  int64_t N;
  const Elem* x;
  const float* wd;
  const float* bd;
  int64_t act;
  __m512 p0, p1;
  pwk::ProblemOf<Elem> q;  // the 1×1 part, but x (the buffer) and the row's y and z
  int64_t yN, yH, zN, zH;  // element strides of the output and the residual by image and row
};

template <int MR, int NV, typename Elem>
inline void pointwise_row(const pwk::ProblemOf<Elem>& q) {
  const int64_t tiles = (q.P + MR - 1) / MR, vectors = q.Kp / 16;
  for (int64_t t = 0; t < tiles; ++t) {
    int64_t v = 0;
    for (; v + NV <= vectors; v += NV) pwk::tile<MR, NV>(q, t * MR, 16 * v);
    pwk::narrower<MR, NV - 1>(q, t * MR, 16 * v, vectors - v);
  }
}

template <int KW, int S, int MR, int NV, typename Elem>
void run(const Fused<Elem>& f) {
  const dwk::Geometry& g = f.g;
  const int64_t blocks = g.Cp / 16, rows = f.N * g.OH;
  const int64_t lo = std::min<int64_t>(g.OW, (g.pw + g.sw - 1) / g.sw);
  const int64_t reach = g.W - 1 + g.pw - (g.KW - 1) * g.dw;
  const int64_t hi = reach < 0 ? lo : std::max<int64_t>(lo, std::min<int64_t>(g.OW, reach / g.sw + 1));
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    const std::unique_ptr<Elem[]> buffer(new Elem[g.OW * g.Cp]);  // uninitialized: written before read
    pwk::ProblemOf<Elem> q = f.q;
    q.x = buffer.get();
    q.xs = g.Cp;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      const dwk::BlockOf<Elem> k{f.x + n * g.xN, f.wd, f.bd, buffer.get(), oh * g.sh - g.ph, __mmask16(0xFFFF)};
      dwk::row<dwk::row_tile<KW, S>(), KW, S>(k, g, 0, blocks, lo, hi, f.act, f.p0, f.p1);
      q.y = f.q.y + n * f.yN + oh * f.yH;
      q.z = f.q.z ? f.q.z + n * f.zN + oh * f.zH : nullptr;
      pointwise_row<MR, NV>(q);
    }
  });
}

template <int MR, int NV, typename Elem>
void dispatch(const Fused<Elem>& f) {
  switch (f.g.dw == 1 ? f.g.KW * 10 + f.g.sw : 0) {
    case 31: run<3, 1, MR, NV>(f); break;
    case 32: run<3, 2, MR, NV>(f); break;
    case 51: run<5, 1, MR, NV>(f); break;
    case 52: run<5, 2, MR, NV>(f); break;
    case 71: run<7, 1, MR, NV>(f); break;
    case 72: run<7, 2, MR, NV>(f); break;
    default: run<0, 1, MR, NV>(f);
  }
}

template <typename Elem>
void launch(torch::Tensor x, torch::Tensor wd, torch::Tensor bd, torch::Tensor wp, torch::Tensor bp, torch::Tensor z,
            torch::Tensor y, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
            int64_t dw, int64_t act, double p0, double p1, int64_t pre, double pre0, double pre1, int64_t post,
            double post0, double post1, int64_t rows, int64_t vectors) {
  const int64_t C = x.size(1), K = y.size(1), Cp = wd.size(1), Kp = bp.size(0);
  TORCH_CHECK(wp.numel() == weight_rows<Elem>(C) * Kp, "depthwise_pointwise: a 1×1 weight of ", wp.numel(),
              " values for ", C, " channels");
  const auto data = [](const torch::Tensor& t) { return reinterpret_cast<Elem*>(t.data_ptr()); };
  Fused<Elem> f;
  f.g = dwk::Geometry{x.size(2), x.size(3), C, Cp, KH, KW, sh, sw, ph, pw, dh, dw, y.size(2), y.size(3),
                      x.stride(0), x.stride(2), x.stride(3), 0, 0, Cp};
  f.N = x.size(0);
  f.x = data(x);
  f.wd = wd.data_ptr<float>();
  f.bd = bd.data_ptr<float>();
  f.act = act;
  f.p0 = _mm512_set1_ps(float(p0));
  f.p1 = _mm512_set1_ps(float(p1));
  f.q = pwk::ProblemOf<Elem>{y.size(3), C, K, Kp, nullptr, 0, data(wp), bp.data_ptr<float>(),
                             z.numel() ? data(z) : nullptr, z.numel() ? z.stride(3) : 0, data(y), y.stride(3), pre,
                             post, _mm512_set1_ps(float(pre0)), _mm512_set1_ps(float(pre1)),
                             _mm512_set1_ps(float(post0)), _mm512_set1_ps(float(post1))};
  f.yN = y.stride(0);
  f.yH = y.stride(2);
  f.zN = z.numel() ? z.stride(0) : 0;
  f.zH = z.numel() ? z.stride(2) : 0;
  """
    + tile_dispatch(TILES, ("rows", "vectors"), "dispatch<{tile}>(f)", "depthwise_pointwise")
    + r"""
}

}  // namespace

// x, z and y channels_last (z empty without a residual), all float32 or all bf16; wd packed [KH·KW, Cp] float32,
// bd [Cp]; wp packed in blocks of `vectors` (`pointwise.pack_weight`, of x's type), bp [Kp].
void depthwise_pointwise(torch::Tensor x, torch::Tensor wd, torch::Tensor bd, torch::Tensor wp, torch::Tensor bp,
                         torch::Tensor z, torch::Tensor y, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph,
                         int64_t pw, int64_t dh, int64_t dw, int64_t act, double p0, double p1, int64_t pre,
                         double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows,
                         int64_t vectors) {
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && (!z.numel() || z.stride(1) == 1),
              "depthwise_pointwise: channels must be contiguous (channels_last)");
  by_type("depthwise_pointwise", x, {wp, y, z}, [&](auto e) {
    launch<decltype(e)>(x, wd, bd, wp, bp, z, y, KH, KW, sh, sw, ph, pw, dh, dw, act, p0, p1, pre, pre0, pre1, post,
                        post0, post1, rows, vectors);
  });
}
"""
)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("depthwise + 1×1 convolution")


class DepthwisePointwise:
    """A depthwise convolution and the 1×1 convolution after it, ready to run: both weights and biases packed,
    the depthwise strides, dilations and activation, the 1×1 epilogue (`pre`, `post`, activations by name,
    `ACTIVATIONS`, with their parameters as `kernels.activations.activation_args` gives them) and tile checked,
    once; calls give the input, its padding and the residual. A bf16 1×1 weight makes a bf16 block (bf16 input,
    residual and output; the depthwise weight, sums and epilogues in float32)."""

    __slots__ = ("_dw", "_epilogue", "_module", "_pw", "_strides", "channels", "dtype", "in_channels", "kernel")

    def __init__(
        self,
        dw_weight: torch.Tensor,
        dw_bias: torch.Tensor | None,
        strides: Sequence[int],
        dilations: Sequence[int],
        act: str,
        act_params: tuple[float, float],
        pw_weight: torch.Tensor,
        pw_bias: torch.Tensor | None = None,
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] | None = None,
    ) -> None:
        check_activations("depthwise + 1×1", act, pre, post)
        tile = TILES[0] if tile is None else tuple(tile)
        if tile not in TILES:
            raise ValueError(f"the CPU depthwise + 1×1 kernel tiles {TILES} (pixels, vectors), not {tile}")
        if pw_weight.shape[1] != dw_weight.shape[0] or tuple(pw_weight.shape[2:]) != (1, 1):
            raise ValueError(f"the 1×1 weight {list(pw_weight.shape)} does not read the depthwise convolution's "
                             f"{dw_weight.shape[0]} channels")  # fmt: skip
        self.channels, self.in_channels = pw_weight.shape[0], dw_weight.shape[0]
        self.kernel = tuple(dw_weight.shape[2:])
        self.dtype = kernel_dtype(pw_weight)
        self._dw = (dw.pack_weight(dw_weight), pack_bias(dw_bias, dw_weight.shape[0]))
        self._pw = (pw.pack_weight(pw_weight, tile[1]), pack_bias(pw_bias, self.channels))
        self._strides = (*strides, *dilations)
        self._epilogue = (
            ACTIVATION_CODES[act], *act_params, ACTIVATION_CODES[pre], *pre_params, ACTIVATION_CODES[post],
            *post_params, *tile,
        )  # fmt: skip
        self._module = module()

    def __call__(
        self,
        x: torch.Tensor,
        pads: Sequence[int],
        out_hw: Sequence[int],
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The block's output for x [N, C, H, W] in the block's dtype, `pads` the depthwise convolution's leading
        (top, left) padding, `out_hw` its output size, and the residual [N, K, OH, OW] of that dtype or None (x and
        the residual made channels_last unless their channels are contiguous, as in a channel slice of a channels_last
        tensor); into `out` (contiguous channels) or a new channels_last tensor, which is returned."""
        x, z, out = dw.convolution_operands(
            x, pads, out_hw, self.in_channels, self.channels, residual, out, "depthwise convolution", self.dtype
        )
        sh, sw, dh, dwl = self._strides
        self._module.depthwise_pointwise(
            x, *self._dw, *self._pw, z, out, *self.kernel, sh, sw, *pads, dh, dwl, *self._epilogue
        )
        return out


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("depthwise_pointwise", SOURCE, "depthwise + 1×1 convolution")
