"""Direct 2-D convolution on channels_last tensors in CUDA C, input tiles and filters staged in shared memory.

`y = post(pre(conv(x, w) + bias) + z)` for groups = 1. A block computes a TH×TW tile of output pixels (32 of
them, one per lane of a warp) × TC output channels of one image; each warp owns RC = 8 consecutive channels per
thread. For every chunk of CT input channels the block stages the input patch the tile reads (with its halo,
zero outside the image) and the KH·KW·CT·TC filter slice in shared memory, then accumulates in float32 from
there: each input cell is read from global memory once per chunk instead of once per tap and channel, and a
warp's filter reads are broadcasts. No tensor cores: this family earns its place only where cuDNN is weak
(odd channel counts, tiny layers), and the autotuner decides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .nvrtc import cuda_kernel
from .source import PRELUDE, check_operands, nhwc_output, storage_code

_RC = 8  # output channels per thread

SOURCE = (
    PRELUDE
    + r"""
#define PTH ((TH - 1) * SH + (KH - 1) * DH + 1)
#define PTW ((TW - 1) * SW + (KW - 1) * DW + 1)
#define RC 8

extern "C" __global__ void conv_direct_nhwc(
    const store_t* __restrict__ x, const store_t* __restrict__ w, const store_t* __restrict__ bias,
    const store_t* __restrict__ z, store_t* __restrict__ y,
    int N, int H, int W, int CI, int CO, int OH, int OW, int PH, int PW, int tiles_h, int tiles_w,
    float pre0, float pre1, float post0, float post1) {
  extern __shared__ float smem[];
  float* in_s = smem;                   // [CT][PTH][PTW]
  float* w_s = smem + CT * PTH * PTW;   // [KH*KW][CT][TC]
  const int tile = blockIdx.x;
  const int tw = tile % tiles_w, th = (tile / tiles_w) % tiles_h, n = tile / (tiles_w * tiles_h);
  const int co0 = blockIdx.y * TC;
  const int t = threadIdx.x, lane = t % 32, cg = t / 32;
  const int ty = lane / TW, tx = lane % TW;
  const int oh = th * TH + ty, ow = tw * TW + tx;
  const int ih0 = th * TH * SH - PH, iw0 = tw * TW * SW - PW;
  float acc[RC];
#pragma unroll
  for (int j = 0; j < RC; ++j) acc[j] = 0.f;
  for (int ci0 = 0; ci0 < CI; ci0 += CT) {
    for (int e = t; e < CT * PTH * PTW; e += blockDim.x) {
      const int ci = e % CT, pixel = e / CT, r = pixel / PTW, q = pixel % PTW;
      const int ih = ih0 + r, iw = iw0 + q;
      float v = 0.f;
      if (ci0 + ci < CI && ih >= 0 && ih < H && iw >= 0 && iw < W)
        v = to_f(x[(((long long)n * H + ih) * W + iw) * CI + ci0 + ci]);
      in_s[(ci * PTH + r) * PTW + q] = v;
    }
    for (int e = t; e < KH * KW * CT * TC; e += blockDim.x) {
      const int co = e % TC, rest = e / TC, ci = rest % CT, tap = rest / CT;
      float v = 0.f;
      if (ci0 + ci < CI && co0 + co < CO) v = to_f(w[((long long)tap * CI + ci0 + ci) * CO + co0 + co]);
      w_s[(tap * CT + ci) * TC + co] = v;
    }
    __syncthreads();
#pragma unroll 2
    for (int ci = 0; ci < CT; ++ci) {
#pragma unroll
      for (int kh = 0; kh < KH; ++kh) {
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          const float a = in_s[(ci * PTH + ty * SH + kh * DH) * PTW + tx * SW + kw * DW];
          const float* wr = w_s + ((kh * KW + kw) * CT + ci) * TC + cg * RC;
#pragma unroll
          for (int j = 0; j < RC; ++j) acc[j] = fmaf(a, wr[j], acc[j]);
        }
      }
    }
    __syncthreads();
  }
  if (oh >= OH || ow >= OW) return;
  const long long out = (((long long)n * OH + oh) * OW + ow) * CO;
#pragma unroll
  for (int j = 0; j < RC; ++j) {
    const int co = co0 + cg * RC + j;
    if (co >= CO) break;
    float a = acc[j];
#if HAS_BIAS
    a += to_f(bias[co]);
#endif
    a = activate<PRE>(a, pre0, pre1);
#if HAS_RES
    a += to_f(z[out + co]);
#endif
    y[out + co] = to_store(activate<POST>(a, post0, post1));
  }
}
"""
)

_SHARED_LIMIT = 96 * 1024


def direct_configs(effort: int) -> list[dict[str, int]]:
    """(th, tw) output tile (th·tw = 32), tc output channels per block, ct input channels per stage (at most:
    `fitted` lowers it for filters whose stage would not fit in shared memory)."""
    if effort <= 0:
        return [{"th": 4, "tw": 8, "tc": 64, "ct": 8}]
    configs = [{"th": th, "tw": 32 // th, "tc": tc, "ct": 8} for th in (2, 4, 8) for tc in (32, 64)]
    if effort >= 2:
        configs += [{"th": 4, "tw": 8, "tc": tc, "ct": ct} for tc in (32, 64, 128) for ct in (4, 16)]
    return configs


def pack_direct_weight(w: torch.Tensor) -> torch.Tensor:
    """W (CO, CI, KH, KW) as (KH·KW, CI, CO), output channels contiguous."""
    if w.dim() != 4:
        raise ValueError(f"a 2-D convolution weight is (CO, CI, KH, KW), got {list(w.shape)}")
    co, ci, kh, kw = w.shape
    return w.permute(2, 3, 1, 0).reshape(kh * kw, ci, co).contiguous()


def shared_bytes(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], config: dict) -> int:
    patch_h = (config["th"] - 1) * strides[0] + (kernel[0] - 1) * dilations[0] + 1
    patch_w = (config["tw"] - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1
    return 4 * config["ct"] * (patch_h * patch_w + kernel[0] * kernel[1] * config["tc"])


def fitted(config: dict[str, int], kernel, strides, dilations) -> dict[str, int]:
    """`config` with its input-channel chunk `ct` halved until the stage fits in shared memory (large filters)."""
    config = dict(config)
    while shared_bytes(kernel, strides, dilations, config) > _SHARED_LIMIT and config["ct"] > 1:
        config["ct"] //= 2
    if shared_bytes(kernel, strides, dilations, config) > _SHARED_LIMIT:
        raise ValueError(f"direct_conv2d: a {list(kernel)} filter with {config} does not fit in shared memory")
    return config


def direct_conv2d(
    x: torch.Tensor,
    w_packed: torch.Tensor,
    kernel: Sequence[int],
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    strides: Sequence[int] = (1, 1),
    pads_begin: Sequence[int] = (0, 0),
    dilations: Sequence[int] = (1, 1),
    out_hw: Sequence[int],
    pre: tuple[int, float, float] = (0, 0.0, 0.0),
    post: tuple[int, float, float] = (0, 0.0, 0.0),
    config: dict[str, int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Convolution of channels_last `x` (N, CI, H, W) with `w_packed` (KH·KW, CI, CO), into (N, CO, *out_hw)."""
    config = config or direct_configs(0)[0]
    n, ci, h, w = x.shape
    oh, ow = out_hw
    co = w_packed.shape[2]
    if config["th"] * config["tw"] != 32 or config["tc"] % _RC:
        raise ValueError(f"direct_conv2d: a tile is 32 pixels and tc a multiple of {_RC}; got {config}")
    if tuple(w_packed.shape[:2]) != (kernel[0] * kernel[1], ci):
        raise ValueError(f"direct_conv2d: packed weight {list(w_packed.shape)} does not fit {ci} input channels")
    check_operands(x, "direct_conv2d", weight=w_packed, bias=bias, residual=residual)
    config = fitted(config, kernel, strides, dilations)
    smem = shared_bytes(kernel, strides, dilations, config)
    y = nhwc_output(x, (n, co, oh, ow), out, "direct_conv2d")
    if residual is not None:
        residual = residual.contiguous(memory_format=torch.channels_last)
    if y.numel() == 0:
        return y
    defines = {
        "DT": storage_code(x.dtype), "VEC": 1, "PRE": pre[0], "POST": post[0],
        "KH": kernel[0], "KW": kernel[1], "SH": strides[0], "SW": strides[1],
        "DH": dilations[0], "DW": dilations[1], "HAS_BIAS": int(bias is not None),
        "HAS_RES": int(residual is not None),
        "TH": config["th"], "TW": config["tw"], "TC": config["tc"], "CT": config["ct"],
    }  # fmt: skip
    compiled = cuda_kernel(SOURCE, "conv_direct_nhwc", defines, x.device, smem)
    tiles_h, tiles_w = -(-oh // config["th"]), -(-ow // config["tw"])
    grid = (n * tiles_h * tiles_w, -(-co // config["tc"]))
    block = (32 * config["tc"] // _RC,)
    args = [x, w_packed, bias, residual, y, n, h, w, ci, co, oh, ow, pads_begin[0], pads_begin[1], tiles_h, tiles_w,
            pre[1], pre[2], post[1], post[2]]  # fmt: skip
    compiled.launch(grid, block, args, x.device)
    return y
