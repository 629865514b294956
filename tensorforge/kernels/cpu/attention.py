"""Attention (`ops.fused` Attention: `softmax(Q·Kᵀ·scale + B)·V` over the last axis) on the CPU in one C++ call
with AVX-512 (or AVX2, float32 only), float32 or bf16, on [batch, heads, rows, head size] tensors as the graph
hands them (strided views of the QKV projection's output: no copy first):

    S = Q_blk·Kᵀ·scale + B_blk  →  P = exp(S − max S)  →  O_blk = (P·V) / Σ P          (a block of query rows)

Each (batch, head) has K and V packed once, by one thread, into the layout the products read: K transposed,
[D, keys] (float32), or in bf16 pairs of its features, [D/2, keys, 2], for `vdpbf16ps`; V in bf16 as pairs of
keys, [keys/2, Dv, 2] (float32 V is read in place, its rows contiguous). Threads then take blocks of query rows:
a block's scores (rows × keys, float32) stay in cache, the softmax makes them exponentials in place, and the
product with V keeps rows × Dv accumulators in registers; the division by each row's sum comes last. In bf16 the
exponentials are rounded to bf16 for that product, as flash attention does on GPUs (sums stay float32).
On AVX2 the tiles are 6 rows × one vector (`tile_rows`), every loop over a tile's rows unrolled whole, and V read
without masks where its head size is whole vectors: with AVX-512's 4 × 4 tiles, a partial unroll of the rows and
V's masked loads (a branch on AVX2) the accumulators lived in memory, and BERT-base's attention (12 heads of 128 ×
64) took 1.9 ms against torch's 0.8; now 0.67.

Why our own: the reference's float32 products, softmax and casts are six passes over the score matrix, and torch's
fused CPU attention was slower still; ViT-S/16's twelve attention layers took a third of its bf16 engine's time at
batch 1 (docs/design.md, "Attention on the CPU").
"""

from __future__ import annotations

import torch

from .avx512 import ABSENT, load_vector, module_source, vector_problem

MAX_VALUE_SIZE = 128  # V's head size: the accumulators of a block of rows are 16-lane vectors of it, in registers

_CORE = r"""
constexpr int TILES = 4;  // register tiles of rows in a block of query rows (a thread's task)
#ifdef __AVX512F__
constexpr int KEY_VECTORS = 4;  // a score tile's width: 64 keys
// The rows of a register tile: MR rows × DV vectors of V's features fit the 32 vector registers with their V loads.
template <int DV>
constexpr int tile_rows() { return DV <= 4 ? 4 : 2; }
template <int DV>
constexpr int value_vectors() { return DV; }  // of V's features a value tile takes at once: all of them
#else
// AVX2's 16 registers hold 8 vectors of 16 float32: tiles of 6 rows × one vector (12 registers of accumulators), of
// keys for the scores and of V's features for the product, which takes V's vectors one at a time. The AVX-512 tiles
// (4 rows × 4 vectors) spilled here: BERT-base's attention ran at 2.3× torch's.
constexpr int KEY_VECTORS = 1;
template <int DV>
constexpr int tile_rows() { return 6; }
template <int DV>
constexpr int value_vectors() { return 1; }
#endif

inline int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

struct Views {  // strides in elements; K rows (keys) have their D features contiguous, as Q's, V's and out's rows
  int64_t qb, qh, qi, kb, kh, kk, vb, vh, vk, bb, bh, bi, ob, oh, oi, H;
};

// K of one (batch, head) as the score product reads it: float32 [D, Kp] (Kp: keys rounded up to 16, zeros past
// them), bf16 [ceil(D/2), Kp, 2] (a zero feature pairs an odd last one).
inline void pack_keys(const float* k, int64_t kk, int64_t keys, int64_t D, float* out) {
  const int64_t Kp = round16(keys);
  std::fill(out, out + D * Kp, 0.f);
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t d = 0; d < D; ++d) out[d * Kp + j] = k[j * kk + d];
}
inline void pack_keys(const uint16_t* k, int64_t kk, int64_t keys, int64_t D, uint16_t* out) {
  const int64_t Kp = round16(keys), D2 = (D + 1) / 2;
  std::fill(out, out + D2 * Kp * 2, uint16_t(0));
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t d = 0; d < D; ++d) out[((d / 2) * Kp + j) * 2 + d % 2] = k[j * kk + d];
}

// V of one (batch, head) in bf16 as pairs of keys, [ceil(keys/2), Dp, 2] (Dp: Dv rounded up to 16, zeros past).
inline void pack_values(const uint16_t* v, int64_t vk, int64_t keys, int64_t Dv, uint16_t* out) {
  const int64_t Dp = round16(Dv), K2 = (keys + 1) / 2;
  std::fill(out, out + K2 * Dp * 2, uint16_t(0));
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t d = 0; d < Dv; ++d) out[((j / 2) * Dp + d) * 2 + j % 2] = v[j * vk + d];
}

// NV vectors of 16 keys' scores from key `first` for each of a tile's MR rows, times `scale`, stored to scores
// [MR, Kp].
template <int MR, int NV>
[[gnu::always_inline]] inline void score_tile(float* scores, const float* const* q, const float* kp, int64_t Kp,
                                              int64_t D, int64_t first, __m512 scale) {
  __m512 acc[MR * NV];
  #pragma GCC unroll 16
  for (int t = 0; t < MR * NV; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 kv[NV];
    #pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) kv[v] = _mm512_loadu_ps(kp + d * Kp + first + 16 * v);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r][d]);
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_fmadd_ps(qv, kv[v], acc[r * NV + v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(scores + r * Kp + first + 16 * v, _mm512_mul_ps(acc[r * NV + v], scale));
}
// In bf16: q as pairs of features (32-bit words), K as [D/2, Kp, 2].
template <int MR, int NV>
[[gnu::always_inline]] inline void score_tile(float* scores, const uint32_t* const* q, const uint16_t* kp,
                                              int64_t Kp, int64_t D, int64_t first, __m512 scale) {
#ifdef __AVX512BF16__
  __m512 acc[MR * NV];
  #pragma GCC unroll 16
  for (int t = 0; t < MR * NV; ++t) acc[t] = _mm512_setzero_ps();
  const int64_t D2 = (D + 1) / 2;
  for (int64_t d2 = 0; d2 < D2; ++d2) {
    __m512bh kv[NV];
    #pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) kv[v] = (__m512bh)_mm512_loadu_si512(kp + (d2 * Kp + first + 16 * v) * 2);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(int(q[r][d2]));
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_dpbf16_ps(acc[r * NV + v], qv, kv[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(scores + r * Kp + first + 16 * v, _mm512_mul_ps(acc[r * NV + v], scale));
#endif
}

// Every score of the block's `tiles` tiles of MR rows: KEY_VECTORS vectors of keys at a time (a chunk of K, read by
// every tile from L1), then a narrower chunk for the rest.
template <int MR, typename Q, typename K>
void scores_of(float* scores, const Q* const* q, const K* kp, int64_t Kp, int64_t D, int tiles, float scale) {
  const __m512 by = _mm512_set1_ps(scale);
  int64_t j = 0;
  for (; j + 16 * KEY_VECTORS <= Kp; j += 16 * KEY_VECTORS)
    for (int s = 0; s < tiles; ++s)
      score_tile<MR, KEY_VECTORS>(scores + s * MR * Kp, q + s * MR, kp, Kp, D, j, by);
  for (int s = 0; s < tiles; ++s) {
    float* tile = scores + s * MR * Kp;
    switch ((Kp - j) / 16) {
      case 1: score_tile<MR, 1>(tile, q + s * MR, kp, Kp, D, j, by); break;
      case 2: score_tile<MR, 2>(tile, q + s * MR, kp, Kp, D, j, by); break;
      case 3: score_tile<MR, 3>(tile, q + s * MR, kp, Kp, D, j, by); break;
      default: break;
    }
  }
}

// The product of the block's exponentials (scores [MR, Kp], float32) with DV vectors of V's features from v (their
// lanes in `lanes[t]`; all 16 of each where WHOLE, read without masks): acc[r·DV + t] over every key.
template <int MR, int DV, bool WHOLE>
[[gnu::always_inline]] inline void value_tile(__m512* acc, const float* scores, int64_t Kp, const float* v,
                                              int64_t vk, int64_t keys, const __mmask16* lanes) {
  for (int64_t j = 0; j < keys; ++j) {
    __m512 vv[DV];
    #pragma GCC unroll 8
    for (int t = 0; t < DV; ++t)
      vv[t] = WHOLE ? _mm512_loadu_ps(v + j * vk + 16 * t) : _mm512_maskz_loadu_ps(lanes[t], v + j * vk + 16 * t);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 p = _mm512_set1_ps(scores[r * Kp + j]);
      #pragma GCC unroll 8
      for (int t = 0; t < DV; ++t) acc[r * DV + t] = _mm512_fmadd_ps(p, vv[t], acc[r * DV + t]);
    }
  }
}
// bf16: the exponentials rounded to bf16 pairs of keys (`pairs`, [MR, K2] 32-bit words) times V's pairs of keys.
template <int MR, int DV>
[[gnu::always_inline]] inline void value_tile(__m512* acc, const uint32_t* pairs, const uint16_t* vp, int64_t K2) {
#ifdef __AVX512BF16__
  for (int64_t j2 = 0; j2 < K2; ++j2) {
    __m512bh vv[DV];
    #pragma GCC unroll 8
    for (int t = 0; t < DV; ++t) vv[t] = (__m512bh)_mm512_loadu_si512(vp + (j2 * DV * 16 + 16 * t) * 2);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(int(pairs[r * K2 + j2]));
      #pragma GCC unroll 8
      for (int t = 0; t < DV; ++t) acc[r * DV + t] = _mm512_dpbf16_ps(acc[r * DV + t], p, vv[t]);
    }
  }
#endif
}

// Row r of a block (its scores scaled): the bias added, then exp(s − max) in place (float32), or as bf16 pairs of keys
// into `words` (rounded to nearest even, a zero past the last key; s then keeps the scores); returns 1 / Σ exp.
inline float softmax_row(float* s, const float* bias, int64_t keys, uint32_t* words) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < keys; j += 16) {
    const __mmask16 k = mask_of(keys - j);
    __m512 x = _mm512_loadu_ps(s + j);
    if (bias) {
      x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, bias + j));
      _mm512_storeu_ps(s + j, x);
    }
    m = _mm512_mask_max_ps(m, k, m, x);
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  auto exponentials = [&](int64_t j) {  // zeros past the last key: the padded keys add nothing to the product
    return _mm512_maskz_mov_ps(mask_of(keys - j), vexp(_mm512_sub_ps(_mm512_loadu_ps(s + j), top)));
  };
  __m512 sum = _mm512_setzero_ps();
#ifdef __AVX512BF16__  // (words are asked for by the bf16 entry point alone, which needs it)
  if (words) {
    const int64_t K2 = (keys + 1) / 2;
    for (int64_t j = 0; j < 2 * K2; j += 32) {
      const __m512 lo = exponentials(j), hi = j + 16 < keys ? exponentials(j + 16) : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, _mm512_add_ps(lo, hi));
      _mm512_mask_storeu_epi32(words + j / 2, mask_of(K2 - j / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    return 1.f / _mm512_reduce_add_ps(sum);
  }
#endif
  for (int64_t j = 0; j < keys; j += 16) {
    const __m512 e = exponentials(j);
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

template <typename T, int DV>
void attention_rows(const T* q, const T* kp, const T* v, const float* bias, T* out, const Views& w, int64_t b,
                    int64_t h, int64_t first, int64_t rows, int64_t keys, int64_t D, int64_t Dv, float scale,
                    std::vector<float>& scores, std::vector<uint32_t>& words) {
  constexpr int MR = tile_rows<DV>(), R = MR * TILES;
  constexpr bool half = sizeof(T) == 2;
  const int64_t Kp = round16(keys), K2 = (keys + 1) / 2, D2 = (D + 1) / 2;
  const int tiles = int((rows + MR - 1) / MR);
  // The block's query rows (a last partial tile repeats the block's first row; those results are not stored).
  const T* qrow[R];
  for (int r = 0; r < R; ++r) qrow[r] = q + b * w.qb + h * w.qh + (first + (r < rows ? r : 0)) * w.qi;
  scores.resize(R * Kp);
  const float* qf[R];
  const uint32_t* qw[R];
  if constexpr (half) {
    words.resize(R * std::max(D2, K2));
    for (int r = 0; r < R; ++r) {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(qrow[r]);
      for (int64_t d2 = 0; d2 < D2; ++d2)
        words[r * D2 + d2] = uint32_t(x[2 * d2]) | (2 * d2 + 1 < D ? uint32_t(x[2 * d2 + 1]) << 16 : 0u);
      qw[r] = words.data() + r * D2;
    }
    scores_of<MR>(scores.data(), qw, reinterpret_cast<const uint16_t*>(kp), Kp, D, tiles, scale);
  } else {
    for (int r = 0; r < R; ++r) qf[r] = reinterpret_cast<const float*>(qrow[r]);
    scores_of<MR>(scores.data(), qf, reinterpret_cast<const float*>(kp), Kp, D, tiles, scale);
  }
  float inverse[R];
  for (int r = 0; r < tiles * MR; ++r) {
    const float* brow = bias ? bias + b * w.bb + h * w.bh + (first + (r < rows ? r : 0)) * w.bi : nullptr;
    inverse[r] = softmax_row(scores.data() + r * Kp, brow, keys, half ? words.data() + r * K2 : nullptr);
  }
  constexpr int VC = half ? DV : value_vectors<DV>();  // V's vectors a tile takes at once
  __mmask16 lanes[DV];
  for (int t = 0; t < DV; ++t) lanes[t] = mask_of(Dv - 16 * t);
  for (int s = 0; s < tiles; ++s) {
    for (int c = 0; c < DV; c += VC) {
      __m512 acc[MR * VC];
      #pragma GCC unroll 32
      for (int t = 0; t < MR * VC; ++t) acc[t] = _mm512_setzero_ps();
      if constexpr (half) {
        value_tile<MR, DV>(acc, words.data() + s * MR * K2, reinterpret_cast<const uint16_t*>(v), K2);
      } else {
        const float* vc = reinterpret_cast<const float*>(v) + b * w.vb + h * w.vh + 16 * c;
        if (Dv % 16 == 0) value_tile<MR, VC, true>(acc, scores.data() + s * MR * Kp, Kp, vc, w.vk, keys, lanes + c);
        else value_tile<MR, VC, false>(acc, scores.data() + s * MR * Kp, Kp, vc, w.vk, keys, lanes + c);
      }
      for (int r = 0; r < MR && s * MR + r < rows; ++r) {
        T* o = out + b * w.ob + h * w.oh + (first + s * MR + r) * w.oi + 16 * c;
        const __m512 inv = _mm512_set1_ps(inverse[s * MR + r]);
        for (int t = 0; t < VC; ++t) store16(o + 16 * t, lanes[c + t], _mm512_mul_ps(acc[r * VC + t], inv));
      }
    }
  }
}

template <typename T, int DV>
void attention_all(const T* q, const T* k, const T* v, const float* bias, T* out, const Views& w, int64_t B,
                   int64_t Sq, int64_t keys, int64_t D, int64_t Dv, float scale, T* kpacked, T* vpacked) {
  constexpr bool half = sizeof(T) == 2;
  constexpr int ROWS = tile_rows<DV>() * TILES;  // a block's rows
  const int64_t H = w.H, Kp = round16(keys), K2 = (keys + 1) / 2;
  const int64_t kstride = half ? (D + 1) / 2 * Kp * 2 : D * Kp, vstride = K2 * DV * 16 * 2;
  const int64_t blocks = (Sq + ROWS - 1) / ROWS;
  auto pack = [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    pack_keys(k + b * w.kb + h * w.kh, w.kk, keys, D, kpacked + bh * kstride);
    if constexpr (half) pack_values(v + b * w.vb + h * w.vh, w.vk, keys, Dv, vpacked + bh * vstride);
  };
  auto rows = [&](int64_t bh, int64_t block, std::vector<float>& scores, std::vector<uint32_t>& words) {
    const int64_t first = block * ROWS;
    const T* values = half ? vpacked + bh * vstride : v;
    attention_rows<T, DV>(q, kpacked + bh * kstride, values, bias, out, w, bh / H, bh % H, first,
                          std::min<int64_t>(ROWS, Sq - first), keys, D, Dv, scale, scores, words);
  };
  if (B * H >= 4 * at::get_num_threads()) {  // heads enough for every thread: each packs its own, used while warm
    at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> scores;
      std::vector<uint32_t> words;
      for (int64_t bh = lo; bh < hi; ++bh) {
        pack(bh);
        for (int64_t block = 0; block < blocks; ++block) rows(bh, block, scores, words);
      }
    });
    return;
  }
  at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {  // else every head packed first, then blocks shared
    for (int64_t bh = lo; bh < hi; ++bh) pack(bh);
  });
  at::parallel_for(0, B * H * blocks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> scores;
    std::vector<uint32_t> words;
    for (int64_t task = lo; task < hi; ++task) rows(task / blocks, task % blocks, scores, words);
  });
}
"""

_ENTRY = r"""
// out [B, H, Sq, Dv] (q's type, its feature axis contiguous, e.g. the transposed view of a [B, Sq, H, Dv] tensor;
// allocated contiguous when given empty) = softmax(q · ktᵀ · scale + bias) · v for q [B, H, Sq, D], kt [B, H, D, Sk],
// v [B, H, Sk, Dv], each with its feature axis contiguous (kt's D axis); bias empty or float32 [B, H, Sq, Sk]
// (broadcast axes of stride 0) with its key axis contiguous.
torch::Tensor attention(torch::Tensor q, torch::Tensor kt, torch::Tensor v, torch::Tensor bias, double scale,
                        torch::Tensor out) {
  TORCH_CHECK(q.dim() == 4 && kt.dim() == 4 && v.dim() == 4, "attention: 4-D q, kt and v");
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = kt.size(3), Dv = v.size(3);
  TORCH_CHECK(kt.size(2) == D && v.size(2) == Sk && Sk > 0, "attention: kt [B, H, D, Sk] and v [B, H, Sk, Dv]");
  TORCH_CHECK(q.stride(3) == 1 && kt.stride(2) == 1 && v.stride(3) == 1, "attention: feature axes contiguous");
  TORCH_CHECK(Dv >= 1 && Dv <= 128, "attention: V's head size at most 128, not ", Dv);
  const bool biased = bias.numel() > 0;
  if (biased)
    TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.dim() == 4 && bias.stride(3) == 1,
                "attention: a float32 4-D bias with its key axis contiguous");
  if (!out.numel()) out = torch::empty({B, H, Sq, Dv}, q.options());
  TORCH_CHECK(out.stride(3) == 1 && out.sizes() == at::IntArrayRef({B, H, Sq, Dv}) &&
              out.scalar_type() == q.scalar_type(), "attention: out [B, H, Sq, Dv] of q's type, features contiguous");
  const Views w{q.stride(0), q.stride(1), q.stride(2), kt.stride(0), kt.stride(1), kt.stride(3),
                v.stride(0), v.stride(1), v.stride(2),
                biased ? bias.stride(0) : 0, biased ? bias.stride(1) : 0, biased ? bias.stride(2) : 0,
                out.stride(0), out.stride(1), out.stride(2), H};
  const int DV = int((Dv + 15) / 16);
  const float* bp = biased ? bias.data_ptr<float>() : nullptr;
  const int64_t Kp = round16(Sk), K2 = (Sk + 1) / 2;
  by_type("attention", q, {kt, v}, [&](auto zero) {
    using T = decltype(zero);
    constexpr bool half = sizeof(T) == 2;
    const int64_t kstride = half ? (D + 1) / 2 * Kp * 2 : D * Kp;
    auto kpacked = torch::empty({B * H * kstride}, q.options());
    auto vpacked = torch::empty({half ? B * H * K2 * DV * 32 : 0}, q.options());
    const T* qp = reinterpret_cast<const T*>(q.data_ptr());
    const T* kp = reinterpret_cast<const T*>(kt.data_ptr());
    const T* vp = reinterpret_cast<const T*>(v.data_ptr());
    T* op = reinterpret_cast<T*>(out.data_ptr());
    T* kb = reinterpret_cast<T*>(kpacked.data_ptr());
    T* vb = reinterpret_cast<T*>(vpacked.data_ptr());
    const float s = float(scale);
    switch (DV) {
      case 1: attention_all<T, 1>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
      case 2: attention_all<T, 2>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
      case 3: attention_all<T, 3>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
      case 4: attention_all<T, 4>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
      case 5: attention_all<T, 5>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
      case 6: attention_all<T, 6>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
      case 7: attention_all<T, 7>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
      default: attention_all<T, 8>(qp, kp, vp, bp, op, w, B, Sq, Sk, D, Dv, s, kb, vb); break;
    }
  });
  return out;
}
"""

SOURCE = module_source(_CORE, _ENTRY)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("attention")


def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("attention", SOURCE, "attention")


def attention(
    q: torch.Tensor,
    kt: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`softmax(q @ kt · scale + bias, -1) @ v` for q [..., Sq, D], kt [..., D, Sk] and v [..., Sk, Dv] (one or two
    leading axes, kt's, v's and the bias's broadcast to q's), all float32 or all bf16. Strided views are read in
    place where each row's features are contiguous (else copied once). The result is q's type and leading shape
    with Dv features, contiguous, or written into `out` when given (any strides with the features contiguous, e.g.
    the transposed view of a [B, Sq, H, Dv] tensor), which is returned."""
    if not 3 <= q.dim() <= 4 or kt.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"the CPU attention kernel takes 3-D or 4-D q, kt and v of one rank, not {q.dim()}-D, "
                         f"{kt.dim()}-D and {v.dim()}-D")  # fmt: skip
    if v.shape[-1] > MAX_VALUE_SIZE:
        raise ValueError(f"the CPU attention kernel takes V's head size up to {MAX_VALUE_SIZE}, not {v.shape[-1]}")
    lead = q.shape[:-2]
    Sq, Sk = q.shape[-2], kt.shape[-1]
    q4, kt4, v4 = (_four(t, lead) for t in (q, kt, v))
    if q4.stride(-1) != 1:
        q4 = q4.contiguous()
    if kt4.stride(-2) != 1:
        kt4 = kt4.transpose(-1, -2).contiguous().transpose(-1, -2)
    if v4.stride(-1) != 1:
        v4 = v4.contiguous()
    packed_bias = ABSENT
    if bias is not None:
        packed_bias = _four(bias.float().expand(*lead, Sq, Sk), lead)
        if packed_bias.stride(-1) != 1:
            packed_bias = packed_bias.contiguous()
    if out is None:
        return module().attention(q4, kt4, v4, packed_bias, float(scale), ABSENT).view(*lead, Sq, v.shape[-1])
    if out.shape != (*lead, Sq, v.shape[-1]) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"attention: `out` must be {q.dtype} {[*lead, Sq, v.shape[-1]]} with its last axis "
                         f"contiguous, not {out.dtype} {list(out.shape)} of strides {out.stride()}")  # fmt: skip
    module().attention(q4, kt4, v4, packed_bias, float(scale), out if out.dim() == 4 else out[None])
    return out


def _four(t: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """`t` broadcast to the leading axes `lead` (one or two) and viewed as 4-D [B, H, rows, columns]."""
    t = t.expand(*lead, *t.shape[-2:])
    return t if t.dim() == 4 else t[None]
