"""Winograd convolution F(m×m, 3×3), m = 2 or 4, for 3×3 one-group layers at stride 1 on the CPU, in C++ with
AVX-512, float32, channels_last, with the whole FusedConv epilogue inside.

For an output tile Y (m×m) of one image, its input tile d (a×a, a = m + 2, zeros in the padding) and the filter g
(3×3) of an (input, output) channel pair:

    Y = Aᵀ [ Σ_c (G g Gᵀ) ⊙ (Bᵀ d B) ] A

(Lavin & Gray's minimal filtering; `TRANSFORMS` holds Bᵀ, G and Aᵀ). The products become a² independent GEMMs,
M_ξ [tiles, K] = V_ξ [tiles, C] · U_ξ [C, K] for ξ = 0 … a² − 1: a² multiplications per tile and channel pair
instead of 9m² — 2.25× fewer for m = 2, 4× for m = 4 — at the price of the transforms and of a weight a²/9 times
larger (U, packed once). F(4×4, 3×3) uses the points 0, ±1, ±2: its float32 error is a few times the direct
sum's (about 1e-6 of the output's range on ResNet's layers, within the fp32 tolerance of 1e-4).

A call works on items of `tiles` output tiles × a range of output channels, each on one thread, with everything
it touches in the core's L2: the input transform of its tiles (V, a² × tiles × C), then, per block of `vectors`
× 16 output channels, the a² products (`accumulate`, the 1×1 kernel's register tile: `rows` tiles × `vectors`
vectors) into a scratch M (a² × tiles × 16·vectors), then the output transform of each tile with the bias, the
activations and the residual, stored. With fewer tile blocks than twice the threads, the output channels are
split between items too (each then transforms its tiles' input again: a² loads and adds a tile, against C·K·a²
multiplications). Where it loses: few pixels and many channels (ResNet's 7×7 layers at batch 1), where U (a²·C·K
floats, 37.7 MB for 512 → 512 at m = 4) is streamed from memory for little work; the autotuner decides.

In bf16 (a bf16 weight; AVX512-BF16) the activations, V and U are bf16 and the products `vdpbf16ps` over pairs of
input channels (`accumulate_pairs`), into float32 sums; the transforms, bias and epilogue stay float32. Only
F(2×2, 3×3): F(4×4)'s transforms amplify the rounding of V and U to about 3e-2 of the output's range, where F(2×2)
stays near the output's own rounding (4e-3); F(2×2) in bf16 runs about as fast as F(4×4) in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from fractions import Fraction as F

import torch

from ..activations import ACTIVATION_CODES
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic
from .avx512 import (
    check_activations,
    kernel_dtype,
    load_vector,
    module_source,
    pack_bias,
    paired_rows,
    register_tiles,
    rounded,
    tile_dispatch,
    vector_problem,
)
from .depthwise import convolution_operands

# Bᵀ (a×a), G (a×3) and Aᵀ (m×a) for each output tile size m.
TRANSFORMS = {
    2: (
        ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        ((1, 0, 0), (F(1, 2), F(1, 2), F(1, 2)), (F(1, 2), F(-1, 2), F(1, 2)), (0, 0, 1)),
        ((1, 1, 1, 0), (0, 1, -1, -1)),
    ),
    4: (
        (
            (4, 0, -5, 0, 1, 0),
            (0, -4, -4, 1, 1, 0),
            (0, 4, -4, -1, 1, 0),
            (0, -2, -1, 2, 1, 0),
            (0, 2, -1, -2, 1, 0),
            (0, 4, 0, -5, 0, 1),
        ),
        (
            (F(1, 4), 0, 0),
            (F(-1, 6), F(-1, 6), F(-1, 6)),
            (F(-1, 6), F(1, 6), F(-1, 6)),
            (F(1, 24), F(1, 12), F(1, 6)),
            (F(1, 24), F(-1, 12), F(1, 6)),
            (0, 0, 1),
        ),
        ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1)),
    ),
}
# (output tiles of a product's register tile, vectors of 16 output channels), for AVX-512's 32 registers and for
# AVX2's 16
TILES = register_tiles(((8, 3), (6, 4)), ((6, 1), (3, 2)))
SCRATCH_BYTES = 512 << 10  # an item's V and M together, at most (at least `rows` tiles an item)

CORE = r"""

// out[i·os] = Σ_k T[i][k] · in[k·is] for a constant R×S matrix T: the zero, one and minus one entries cost
// nothing or an add (the loops are unrolled, so the tests on T's entries fold away).
template <int R, int S>
[[gnu::always_inline]] inline void combine(const float (&T)[R][S], const __m512* in, int is, __m512* out, int os) {
  #pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    __m512 s = _mm512_setzero_ps();
    bool started = false;
    #pragma GCC unroll 8
    for (int k = 0; k < S; ++k) {
      const float c = T[i][k];
      if (c == 0.f) continue;
      const __m512 x = in[k * is];
      if (!started) s = c == 1.f ? x : c == -1.f ? _mm512_sub_ps(_mm512_setzero_ps(), x)
                                                  : _mm512_mul_ps(_mm512_set1_ps(c), x);
      else s = c == 1.f ? _mm512_add_ps(s, x) : c == -1.f ? _mm512_sub_ps(s, x)
                                                          : _mm512_fmadd_ps(_mm512_set1_ps(c), x, s);
      started = true;
    }
    out[i * os] = s;
  }
}

// T: float, or uint16_t for bf16 activations, transformed inputs V and weights U (the products in float32 sums,
// the transforms, bias and epilogue in float32 either way).
template <typename T>
struct ConvOf {
  int64_t C, Cp, H, W, K, Kp, ph, pw, OH, OW, TH, TW;
  int64_t xN, xH, xW, yN, yH, yW, zN, zH, zW;  // element strides (channels contiguous)
  const T* x;
  const T* u;  // per block of NV output vectors, a² matrices [weight_rows<T>(C), 16·nv] (nv: the block's vectors)
  const float* b;  // [Kp]
  const T* z;  // the residual, or null
  T* y;
  int64_t pre, post;
  __m512 pre0, pre1, post0, post1;
};

// Tile p's input transform, channels c0 … c0+15 (lanes past C masked): Bᵀ d B into v[ξ·stride], ξ = 0 … a²−1.
// A row of d at a time (its a loads, then d_i B), then a column of the rows at a time (Bᵀ, then the a stores), so
// that no more than a row and the a² products are live; a row in the padding is zeros, and so is its product.
template <int M, typename T>
inline void input_tile(const ConvOf<T>& q, int64_t p, int64_t c0, T* v, int64_t stride) {
  constexpr int A = M + 2;
  const int64_t tw = p % q.TW, th = (p / q.TW) % q.TH, n = p / (q.TW * q.TH);
  const int64_t h0 = th * M - q.ph, w0 = tw * M - q.pw;
  const bool columns_inside = w0 >= 0 && w0 + A <= q.W;
  const __mmask16 cm = mask_of(q.C - c0);
  __m512 t[A * A];
  #pragma GCC unroll 8
  for (int i = 0; i < A; ++i) {
    const int64_t h = h0 + i;
    if (h < 0 || h >= q.H) {
      #pragma GCC unroll 8
      for (int j = 0; j < A; ++j) t[i * A + j] = _mm512_setzero_ps();
      continue;
    }
    const T* row = q.x + n * q.xN + h * q.xH + w0 * q.xW + c0;
    __m512 d[A];
    #pragma GCC unroll 8
    for (int j = 0; j < A; ++j)
      d[j] = columns_inside || (w0 + j >= 0 && w0 + j < q.W) ? load16(cm, row + j * q.xW) : _mm512_setzero_ps();
    combine(Transform<M>::BT, d, 1, t + i * A, 1);  // d_i B
  }
  #pragma GCC unroll 8
  for (int j = 0; j < A; ++j) {
    __m512 o[A];
    combine(Transform<M>::BT, t + j, A, o, 1);  // Bᵀ (d B), column j
    #pragma GCC unroll 8
    for (int i = 0; i < A; ++i) store16(v + (i * A + j) * stride, cm, o[i]);
  }
}

// Tile p's output transform for output channels k0 … k0+15 from m[ξ·stride]: Aᵀ m A, the bias, the epilogue; a
// row of m at a time (m_i A), then a column of output pixels at a time (Aᵀ, the epilogue, the stores).
template <int M, typename T>
inline void output_tile(const ConvOf<T>& q, int64_t p, int64_t k0, const float* m, int64_t stride) {
  constexpr int A = M + 2;
  const int64_t tw = p % q.TW, th = (p / q.TW) % q.TH, n = p / (q.TW * q.TH);
  const int64_t oh0 = th * M, ow0 = tw * M;
  const int rows = int(std::min<int64_t>(M, q.OH - oh0)), cols = int(std::min<int64_t>(M, q.OW - ow0));
  const __mmask16 km = mask_of(q.K - k0);
  __m512 u[A * M];
  #pragma GCC unroll 8
  for (int i = 0; i < A; ++i) {
    __m512 s[A];
    #pragma GCC unroll 8
    for (int j = 0; j < A; ++j) s[j] = _mm512_loadu_ps(m + (i * A + j) * stride);
    combine(Transform<M>::AT, s, 1, u + i * M, 1);  // m_i A
  }
  const __m512 bias = _mm512_loadu_ps(q.b + k0);
  const T* z = q.z ? q.z + n * q.zN + oh0 * q.zH + ow0 * q.zW + k0 : nullptr;
  T* y = q.y + n * q.yN + oh0 * q.yH + ow0 * q.yW + k0;
  #pragma GCC unroll 8
  for (int j = 0; j < M; ++j) {
    if (j >= cols) break;
    __m512 o[M];
    combine(Transform<M>::AT, u + j, M, o, 1);  // Aᵀ (m A), output column j
    #pragma GCC unroll 8
    for (int i = 0; i < M; ++i) o[i] = _mm512_add_ps(o[i], bias);
    activate_tile<M, sizeof(T) == 2>(o, rows, q.pre, q.pre0, q.pre1);
    if (z) {
      #pragma GCC unroll 8
      for (int i = 0; i < M; ++i)
        if (i < rows) o[i] = _mm512_add_ps(o[i], load16(km, z + i * q.zH + j * q.zW));
    }
    activate_tile<M, sizeof(T) == 2>(o, rows, q.post, q.post0, q.post1);
    #pragma GCC unroll 8
    for (int i = 0; i < M; ++i)
      if (i < rows) store16(y + i * q.yH + j * q.yW, km, o[i]);
  }
}

// The distance between V's (or M's) matrices for consecutive ξ, in elements of T: `count` rounded to whole cache
// lines, plus one line unless that makes an odd number of lines. A tile's a² values are one matrix apart, so at a
// distance of a multiple of 4 KB they would all fall in one set of the 8-way L1 (64 sets of 64 bytes): 36 stores a
// tile evicting each other (the input transform ran at a quarter of its speed so).
template <typename T = float>
inline int64_t skew(int64_t count) {
  constexpr int64_t per_line = 64 / sizeof(T);
  const int64_t lines = (count + per_line - 1) / per_line;
  return per_line * (lines % 2 ? lines : lines + 1);
}

// One block of NV output vectors from vector `vector` (U's block at u) for the item's `count` tiles from p0:
// the a² products into mm (a² × tiles × 16·stride_vectors), then each tile's output transform.
template <int M, int MR, int NV, typename T>
void block(const ConvOf<T>& q, int64_t p0, int64_t count, int64_t tiles, const T* v, float* mm,
           int64_t stride_vectors, const T* u, int64_t vector) {
  constexpr int A = M + 2;
  const int64_t C = q.C, row = 16 * stride_vectors, v_stride = skew<T>(tiles * q.Cp), m_stride = skew(tiles * row);
  for (int x = 0; x < A * A; ++x) {
    const T* w = u + x * weight_rows<T>(q.C) * 16 * NV;
    for (int64_t t0 = 0; t0 < count; t0 += MR) {
      __m512 acc[MR * NV];
      #pragma GCC unroll 32
      for (int i = 0; i < MR * NV; ++i) acc[i] = _mm512_setzero_ps();
      const T* a[MR];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) a[r] = v + x * v_stride + std::min<int64_t>(t0 + r, count - 1) * q.Cp;
      if constexpr (sizeof(T) == 4) accumulate<MR, NV>(acc, a, w, C);
      else accumulate_pairs<MR, NV>(acc, a, w, C);
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        if (t0 + r >= count) break;
        #pragma GCC unroll 8
        for (int i = 0; i < NV; ++i) _mm512_storeu_ps(mm + x * m_stride + (t0 + r) * row + 16 * i, acc[r * NV + i]);
      }
    }
  }
  for (int64_t t = 0; t < count; ++t)
    for (int i = 0; i < NV; ++i) output_tile<M>(q, p0 + t, 16 * (vector + i), mm + t * row + 16 * i, m_stride);
}

// The block of output vectors from `vector`, `left` of them (fewer than NV: the last block): that width's block.
template <int M, int MR, int R, typename T>
void narrower(const ConvOf<T>& q, int64_t p0, int64_t count, int64_t tiles, const T* v, float* mm,
              int64_t stride_vectors, const T* u, int64_t vector, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) block<M, MR, R>(q, p0, count, tiles, v, mm, stride_vectors, u, vector);
    else narrower<M, MR, R - 1>(q, p0, count, tiles, v, mm, stride_vectors, u, vector, left);
  }
}

// Items: `tiles` consecutive output tiles (over images, tile rows, tile columns) × a chunk of blocks of NV output
// vectors; an item's V and M live in a scratch of its thread.
template <int M, int MR, int NV, typename T>
void run(const ConvOf<T>& q, int64_t N, int64_t tiles) {
  constexpr int A = M + 2;
  const int64_t P = N * q.TH * q.TW, groups = (P + tiles - 1) / tiles;
  const int64_t vectors = q.Kp / 16, blocks = (vectors + NV - 1) / NV;
  const int64_t chunks = std::min(blocks, std::max<int64_t>(1, (2 * at::get_num_threads() + groups - 1) / groups));
  const int64_t per_chunk = (blocks + chunks - 1) / chunks;
  at::parallel_for(0, groups * chunks, 1, [&](int64_t first, int64_t last) {
    static thread_local std::vector<float> scratch;  // V (of T, whole cache lines), then M (float)
    const int64_t v_stride = skew<T>(tiles * q.Cp), v_floats = A * A * v_stride * int64_t(sizeof(T)) / 4;
    const size_t need = size_t(v_floats + A * A * skew(tiles * 16 * NV));
    if (scratch.size() < need) scratch.resize(need);
    T* v = reinterpret_cast<T*>(scratch.data());
    float* mm = scratch.data() + v_floats;
    for (int64_t item = first; item < last; ++item) {
      const int64_t group = item / chunks, chunk = item % chunks;
      const int64_t p0 = group * tiles, count = std::min(tiles, P - p0);
      const int64_t b0 = chunk * per_chunk, b1 = std::min(blocks, b0 + per_chunk);
      if (b0 >= b1) continue;
      for (int64_t t = 0; t < count; ++t)
        for (int64_t c0 = 0; c0 < q.C; c0 += 16) input_tile<M>(q, p0 + t, c0, v + t * q.Cp + c0, v_stride);
      for (int64_t b = b0; b < b1; ++b) {
        const T* u = q.u + b * A * A * weight_rows<T>(q.C) * 16 * NV;
        const int64_t vector = b * NV;
        if (vectors - vector >= NV) block<M, MR, NV>(q, p0, count, tiles, v, mm, NV, u, vector);
        else narrower<M, MR, NV - 1>(q, p0, count, tiles, v, mm, NV, u, vector, vectors - vector);
      }
    }
  });
}

"""

ENTRY = (
    r"""

namespace {

// The call on x, u, z and y of T (their data pointers as T).
template <typename T>
void launch(torch::Tensor x, torch::Tensor u, torch::Tensor b, torch::Tensor z, torch::Tensor y, int64_t m,
            int64_t ph, int64_t pw, int64_t pre, double pre0, double pre1, int64_t post, double post0, double post1,
            int64_t rows, int64_t vectors, int64_t tiles) {
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1, "winograd: channels must be contiguous (channels_last)");
  TORCH_CHECK(!z.numel() || z.stride(1) == 1, "winograd: the residual's channels must be contiguous");
  const int64_t C = x.size(1), a = m + 2;
  TORCH_CHECK(m == 2 || m == 4, "winograd: output tiles of 2×2 or 4×4, not ", m);
  TORCH_CHECK(u.numel() == a * a * weight_rows<T>(C) * b.size(0), "winograd: a weight of ", u.numel(),
              " values for ", C, " input channels and ", a, "×", a, " input tiles");
  const auto data = [](const torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); };
  const int64_t OH = y.size(2), OW = y.size(3);
  const ConvOf<T> q{C, (C + 15) / 16 * 16, x.size(2), x.size(3), y.size(1), b.size(0), ph, pw, OH, OW,
                    (OH + m - 1) / m, (OW + m - 1) / m,
                    x.stride(0), x.stride(2), x.stride(3), y.stride(0), y.stride(2), y.stride(3),
                    z.numel() ? z.stride(0) : 0, z.numel() ? z.stride(2) : 0, z.numel() ? z.stride(3) : 0,
                    data(x), data(u), b.data_ptr<float>(), z.numel() ? data(z) : nullptr, data(y), pre, post,
                    _mm512_set1_ps(float(pre0)), _mm512_set1_ps(float(pre1)), _mm512_set1_ps(float(post0)),
                    _mm512_set1_ps(float(post1))};
  const int64_t N = x.size(0);
  TORCH_CHECK(tiles >= rows, "winograd: at least ", rows, " tiles an item, not ", tiles);
  """
    + tile_dispatch(
        [(m, *t) for m in (4, 2) for t in TILES], ("m", "rows", "vectors"), "run<{tile}>(q, N, tiles)", "winograd"
    )
    + r"""
}

}  // namespace

// x [N, C, H, W] and y [N, K, OH, OW] channels_last (any pixel strides, channels contiguous), z as y or empty;
// u packed (`pack_weight`) for the output tile m, b [Kp]. x, u, z and y all float32, or all bf16 (u in bf16 pairs;
// V in bf16, the products in float32 sums). Writes y.
void winograd(torch::Tensor x, torch::Tensor u, torch::Tensor b, torch::Tensor z, torch::Tensor y, int64_t m,
              int64_t ph, int64_t pw, int64_t pre, double pre0, double pre1, int64_t post, double post0,
              double post1, int64_t rows, int64_t vectors, int64_t tiles) {
  by_type("winograd", x, {u, y, z}, [&](auto e) {
    launch<decltype(e)>(x, u, b, z, y, m, ph, pw, pre, pre0, pre1, post, post0, post1, rows, vectors, tiles);
  });
}
"""
)


def _matrix(name: str, rows: tuple) -> str:
    """A constant matrix as a C++ static constexpr member."""
    body = ", ".join("{" + ", ".join(f"{float(c)!r}f" for c in row) + "}" for row in rows)
    return f"  static constexpr float {name}[{len(rows)}][{len(rows[0])}] = {{{body}}};\n"


def _transform_source() -> str:
    """`Transform<m>::BT` and `::AT` for each output tile size m (from `TRANSFORMS`)."""
    parts = ["template <int M> struct Transform;\n"]
    for m, (bt, _, at) in TRANSFORMS.items():
        parts.append(f"template <> struct Transform<{m}> {{\n" + _matrix("BT", bt) + _matrix("AT", at) + "};\n")
    return "\n" + "".join(parts)


SOURCE = module_source(_transform_source() + CORE, ENTRY)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("Winograd convolution")


def pack_weight(w: torch.Tensor, m: int, vectors: int) -> torch.Tensor:
    """A 3×3 convolution's weight [K, C, 3, 3] transformed, U = G g Gᵀ (in float64, then float32), as blocks of
    `vectors` × 16 output channels (the last narrower; zeros past K), each a² matrices [C, 16·vectors] (ξ = 0 …
    a²−1) one after the other: flat, a²·C · K rounded up to 16. A bf16 weight gives bf16 U (rounded once, from
    float64), each matrix's rows interleaved in pairs (`paired_rows`) for the bf16 dot product."""
    k, c = w.shape[:2]
    half = w.dtype == torch.bfloat16
    g = torch.tensor([[float(v) for v in row] for row in TRANSFORMS[m][1]], dtype=torch.float64)
    a = g.shape[0]
    u = torch.einsum("ai,kcij,bj->abck", g, w.detach().double(), g).reshape(a * a, c, k)  # [ξ, C, K]
    padded = torch.zeros(a * a, c, rounded(k), dtype=torch.bfloat16 if half else torch.float32)
    padded[:, :, :k] = u
    blocks = padded.split(16 * vectors, dim=2)
    return torch.cat([(paired_rows(block) if half else block).reshape(-1) for block in blocks])


def tiles_per_item(m: int, channels: int, vectors: int, rows: int) -> int:
    """Output tiles an item works on: as many whole register tiles (`rows` tiles) as keep its input transform
    (a² × tiles × C) and products (a² × tiles × 16·vectors) within `SCRATCH_BYTES`, at least one."""
    a = m + 2
    fit = SCRATCH_BYTES // (4 * a * a * (rounded(channels) + 16 * vectors))
    return max(rows, fit // rows * rows)


class WinogradConv:
    """A 3×3 one-group convolution at stride 1 ready to run by Winograd's F(m×m, 3×3): its weight [K, C, 3, 3]
    transformed and packed, its bias, epilogue (activations by name, `ACTIVATIONS`, with their parameters as
    `kernels.activations.activation_args` gives them) and register tile checked, once; calls give the input, its
    padding and the output's size."""

    __slots__ = (
        "_bias",
        "_epilogue",
        "_module",
        "_tiles",
        "_weight",
        "channels",
        "dtype",
        "in_channels",
        "kernel",
        "m",
    )

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        m: int = 4,
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] | None = None,
    ) -> None:
        check_activations("Winograd convolution", pre, post)
        if m not in TRANSFORMS:
            raise ValueError(f"the CPU Winograd kernel computes output tiles of {tuple(TRANSFORMS)} pixels, not {m}")
        tile = TILES[0] if tile is None else tuple(tile)
        if tile not in TILES:
            raise ValueError(f"the CPU Winograd kernel tiles {TILES} (tiles, vectors), not {tile}")
        if weight.dim() != 4 or tuple(weight.shape[2:]) != (3, 3):
            raise ValueError(f"Winograd F(m×m, 3×3) takes a 3×3 weight [K, C, 3, 3], not {tuple(weight.shape)}")
        self.channels, self.in_channels = weight.shape[:2]
        self.kernel, self.m = (3, 3), m
        self.dtype = kernel_dtype(weight)
        if self.dtype == torch.bfloat16 and m != 2:
            raise ValueError(
                f"F({m}×{m}, 3×3) in bf16: its transforms amplify the 8-bit rounding of V and U to about 3e-2 of the "
                "output (F(2×2, 3×3) stays near one rounding of the output); bf16 runs m = 2 only"
            )
        self._weight, self._bias = pack_weight(weight, m, tile[1]), pack_bias(bias, self.channels)
        self._tiles = tiles_per_item(m, self.in_channels, tile[1], tile[0])
        self._epilogue = (ACTIVATION_CODES[pre], *pre_params, ACTIVATION_CODES[post], *post_params, *tile)
        self._module = module()

    def __call__(
        self,
        x: torch.Tensor,
        pads: Sequence[int],
        out_hw: Sequence[int],
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """post(pre(conv(x) + bias) + residual) for x [N, C, H, W] of the convolution's dtype (float32, or bf16 for a
        bf16 weight; made channels_last unless its channels are contiguous), `pads` the leading (top, left) padding,
        `out_hw` the output's size (which fixes the trailing padding) and the residual [N, K, OH, OW] or None (of the
        same dtype); into `out` (contiguous channels) or a new channels_last tensor, which is returned."""
        x, z, out = convolution_operands(
            x, pads, out_hw, self.in_channels, self.channels, residual, out, dtype=self.dtype
        )
        self._module.winograd(x, self._weight, self._bias, z, out, self.m, *pads, *self._epilogue, self._tiles)
        return out


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("winograd", SOURCE, "Winograd convolution")
