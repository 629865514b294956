"""int8 sums that the weight bounds (`kernels.quantize.small_sums`) become float32 through the rounding constant's
bits instead of a conversion instruction (`epilogue.sums_to_float`): the same float32 values, bit for bit, from
the gathering and the TMA convolution kernels (under Triton's interpreter; the TMA one and the Gluon kernel also on
the GPU), up to the bound itself; compiled for sm_90, a kernel told the sums are small converts none of them."""

from __future__ import annotations

import pytest
import torch

from tensorforge.kernels.quantize import SMALL_SUM, small_sums
from tensorforge.kernels.triton import conv_tma
from tensorforge.kernels.triton.conv import conv2d_nhwc_quantized, pack_weight
from tests.helpers import DEVICES, compile_for_hopper, record_returns
from tests.kernels import test_triton_conv_quantized as quantized

TMA = {**quantized.TINY, "tma": True}


def test_the_bound_is_128_times_the_largest_row_of_absolute_weights():
    limit = SMALL_SUM // 128  # Σ|w| of a row must stay under this
    below = torch.full((2, limit // 127), 127, dtype=torch.int8)  # 258 × 127 = 32766
    assert 128 * int(below[0].abs().sum()) < SMALL_SUM and small_sums(below)
    above = torch.cat([below, torch.full((2, 1), 127, dtype=torch.int8)], dim=1)
    assert not small_sums(above)
    assert not small_sums(torch.full((1, 256), -128, dtype=torch.int8))  # 256 · 128 · 128 = 2^22: not under it
    assert small_sums(torch.full((1, 255), -128, dtype=torch.int8))  # |-128| counts 128, not int8's wrapped -128
    conv = torch.zeros(8, 64, 3, 3, dtype=torch.int8)
    conv[5, :, :, :] = 57  # one output's 576 weights: 576 · 57 · 128 > 2^22 (56 would be under it)
    assert not small_sums(conv) and small_sums(conv[:5])
    assert not small_sums(torch.ones(4, 4).to(torch.float8_e4m3fn))  # E4M3 sums are float already
    assert not small_sums(torch.zeros(0, 4, dtype=torch.int8))


def _run(x, wq, w_scale, *, config, small, attrs=None, x_scale=0.05, y_scale=0.0, z=None, z_scale=0.0, out_dtype=None):
    attrs = {"pads": [1, 1, 1, 1]} if attrs is None else attrs
    begin, _, out_hw = quantized._geometry(x.shape, wq.shape, attrs)
    return conv2d_nhwc_quantized(
        x, pack_weight(wq, 1, k_major=True), w_scale, x_scale, None, z, out_hw=out_hw, pads_begin=begin,
        strides=attrs.get("strides", [1, 1]), post=quantized.activation_args("Relu"), config=config, y_scale=y_scale,
        z_scale=z_scale, out_dtype=out_dtype, small_sums=small,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("kernel", "config"),
    [(3, quantized.TINY), (3, {**quantized.TINY, "split_k": 2}), (1, TMA), (3, TMA), (7, quantized.TINY)],
    ids=["gathering-3x3", "split-k", "tma-1x1", "tma-3x3", "stem"],
)
def test_small_sums_give_the_same_floats_bit_for_bit(device, kernel, config, monkeypatch):
    """Random int8 activations and weights in range of the bound: float32 outputs, and int8 ones requantized from
    them with an int8 residual, identical with and without the conversion instruction."""
    launches = record_returns(monkeypatch, conv_tma, "launch")
    torch.manual_seed(21)
    channels = 3 if kernel == 7 else 32
    x = torch.randint(-128, 128, (2, channels, 6, 6), dtype=torch.int8, device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    wq = torch.randint(-127, 128, (16, channels, kernel, kernel), dtype=torch.int8, device=device)
    assert small_sums(wq)
    w_scale = torch.rand(16, device=device) * 1e-3 + 1e-4
    attrs = {"pads": [kernel // 2] * 4, "strides": [2, 2] if kernel == 7 else [1, 1]}
    plain = _run(x, wq, w_scale, config=config, small=False, attrs=attrs, out_dtype=torch.float32)
    small = _run(x, wq, w_scale, config=config, small=True, attrs=attrs, out_dtype=torch.float32)
    assert plain.abs().max() > 0 and torch.equal(plain, small)
    z = torch.randint(-128, 128, plain.shape, dtype=torch.int8, device=device)
    z = z.contiguous(memory_format=torch.channels_last)
    y_scale = float(plain.abs().max()) / 100
    requantized = [
        _run(x, wq, w_scale, config=config, small=s, attrs=attrs, y_scale=y_scale, z=z, z_scale=0.01)
        for s in (False, True)
    ]
    assert requantized[0].dtype == torch.int8 and torch.equal(*requantized)
    assert launches == ([None] * 4 if config.get("tma") else []), launches  # the TMA kernel ran where asked


@pytest.mark.parametrize("device", DEVICES)
def test_sums_at_the_bound_convert_exactly(device):
    """x = w = −128 over 255 channels: every sum is 255 · 2^14 = 4177920, just under 2^22, exactly."""
    x = torch.full((1, 255, 2, 2), -128, dtype=torch.int8, device=device).contiguous(memory_format=torch.channels_last)
    wq = torch.full((16, 255, 1, 1), -128, dtype=torch.int8, device=device)
    assert small_sums(wq)
    got = _run(x, wq, torch.ones(16, device=device), config=quantized.TINY, small=True, attrs={}, x_scale=1.0,
               out_dtype=torch.float32)  # fmt: skip
    assert torch.equal(got, torch.full_like(got, 255.0 * 2**14))


_CONVERSIONS = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tensorforge.kernels.triton.conv_tma import _conv_tma as fn
floats = ("pre0", "pre1", "post0", "post1", "x_scale", "x_inv_scale", "y_inv_scale", "z_scale")
for small in (False, True):
    constants = dict(
        KH=1, KW=1, PH=0, PW=0, BOXES=False, BI=1, BH=1, BW=1, HAS_BIAS=True, HAS_RES=True, PRE=0, POST=1, QUANT=1,
        QUANTIZE_X=False, QUANT_Y=1, SMALL_SUMS=small, W_K_MAJOR=True, DOT_PRECISION="ieee", PERSISTENT=True,
        SWAP=False, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8,
    )
    descriptors = {name: "tensordesc<i8[128, 128]>" for name in ("a_desc", "b_desc", "z_desc", "y_desc")}
    signature = {
        n: "constexpr" if n in constants else descriptors.get(n) or ("*fp32" if n in ("bias", "w_scale") else
        "fp32" if n in floats else "i32")
        for n in fn.arg_names
    }
    kernel = triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 8, "num_stages": 3})
    print(int(small), len(re.findall(r"cvt\\.rn\\.f32\\.s32", kernel.asm["ptx"])))
"""


def test_a_kernel_told_its_sums_are_small_converts_none():
    """The TMA kernel's int8 1×1 layer with a residual, compiled for sm_90: a conversion instruction a sum without
    SMALL_SUMS, none with it."""
    counts = dict(compile_for_hopper(_CONVERSIONS))
    assert int(counts["0"]) >= 64 and int(counts["1"]) == 0, counts


# -- GPU: the Gluon kernel ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_gluon_kernel_gives_the_same_bits_with_small_sums():
    """ResNet-50's first-stage 1×1 (64 → 256 at 56², a requantized output and an int8 residual) and a 3×3 of 64
    channels, on the warp-specialized kernel with every effort-0 tile: the same int8 and float32 outputs."""
    from tensorforge.kernels.gluon.gemm import GemmConfig, conv_ws, pack_conv_weight
    from tensorforge.tactics.gluon_gemm import gemm_ws_configs

    torch.manual_seed(22)
    device = torch.device("cuda")
    for kernel, pads in ((1, (0, 0)), (3, (1, 1))):
        x = torch.randint(-128, 128, (8, 64, 56, 56), dtype=torch.int8, device=device)
        x = x.contiguous(memory_format=torch.channels_last)
        wq = torch.randint(-60, 61, (256, 64, kernel, kernel), dtype=torch.int8, device=device)
        assert small_sums(wq)
        z = torch.randint(-128, 128, (8, 256, 56, 56), dtype=torch.int8, device=device)
        z = z.contiguous(memory_format=torch.channels_last)
        scale = torch.rand(256, device=device) * 1e-4 + 1e-5
        for row in gemm_ws_configs(0, quantized=True):
            outs = []
            for small in (False, True):
                for quant_y, dtype in ((1, torch.int8), (0, torch.float32)):
                    y = torch.full((8, 256, 56, 56), 77, dtype=dtype, device=device)
                    y = y.contiguous(memory_format=torch.channels_last)
                    conv_ws(
                        x, pack_conv_weight(wq), y, GemmConfig(**row), kernel=(kernel, kernel), pads=pads,
                        scale=scale, z=z if quant_y else None, z_scale=0.02, post=(1, 0.0, 0.0), quant_y=quant_y,
                        y_inv_scale=10.0, small_sums=small,
                    )  # fmt: skip
                    outs.append(y)
            assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3]), (kernel, row)
            assert outs[1].abs().max() > 0 and (outs[0] != 77).any()
