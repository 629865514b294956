"""The int8 direct convolution for the CPU (AVX-512 VNNI) against QuantizedConv's arithmetic in float64: windows,
strides, padding and dilation, both tiles, float32, bf16 and int8 inputs, residuals and outputs, ragged channel
counts."""

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.cpu import quantized_conv as qc
from tensorforge.kernels.cpu import quantized_pointwise as qp
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation, quantize_activation
from tensorforge.ops.math_flags import cpu_native_precisions
from tests.kernels.test_cpu_pointwise import BF16_BOUND

_PROBLEM = compiler_problem() or qp.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

FLOAT_BOUND = 2e-6  # float32 output, normwise against float64


def _reference(x, wq, w_scale, x_scale, bias, stride, pads, dilation, z=None, z_scale=0.0):
    """QuantizedConv's Y in float64 with ReLU before the residual and none after: the products exact."""
    q = x.double() if x.dtype == torch.int8 else quantize_activation(x, x_scale, "int8").double()
    padded = F.pad(q, (pads[1], pads[3], pads[0], pads[2]))  # quantized zeros in the padding
    acc = F.conv2d(padded, wq.double(), stride=stride, dilation=dilation)
    factors = (w_scale.float() * torch.tensor(x_scale, dtype=torch.float32)).double()
    v = apply_activation(acc * factors[None, :, None, None] + bias.double()[None, :, None, None], "Relu")
    if z is not None:
        v = v + (z.double() * z_scale if z.dtype == torch.int8 else z.double())
    return v


# (C, K, H, W, window, stride, pads (top, left, bottom, right), dilation)
CASES = [
    (16, 32, 9, 11, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (13, 40, 10, 10, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # a partial quad, a partial vector, stride 2
    (3, 24, 16, 16, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),  # a stem
    (8, 16, 12, 9, (3, 5), (1, 2), (2, 1, 0, 3), (2, 1)),  # uneven window, stride, padding, dilation
    (64, 64, 7, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
]


@pytest.mark.parametrize("tile", qc.TILES)
@pytest.mark.parametrize(("c", "k", "h", "w", "window", "stride", "pads", "dilation"), CASES)
def test_windows_against_the_float64_convolution(tile, c, k, h, w, window, stride, pads, dilation):
    generator = torch.Generator().manual_seed(c + k)
    wq = torch.randint(-127, 128, (k, c, *window), generator=generator, dtype=torch.int8)
    w_scale = torch.rand(k, generator=generator) * 1e-2 + 1e-3
    bias = torch.randn(k, generator=generator)
    x = torch.randn(2, c, h, w, generator=generator).contiguous(memory_format=torch.channels_last)
    want = _reference(x, wq, w_scale, 0.03, bias, stride, pads, dilation)
    conv = qc.QuantizedConv(wq, w_scale, 0.03, bias, stride, dilation, "Relu", tile=tile)
    got = conv(x, pads[:2], want.shape[2:])
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= FLOAT_BOUND


@pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize("tile", qc.TILES)
def test_a_bf16_input_and_residual_make_a_bf16_output(tile):
    c, k, window, pads = 13, 40, (3, 3), (1, 1, 1, 1)
    generator = torch.Generator().manual_seed(11)
    wq = torch.randint(-127, 128, (k, c, *window), generator=generator, dtype=torch.int8)
    w_scale = torch.rand(k, generator=generator) * 1e-2 + 1e-3
    bias = torch.randn(k, generator=generator)
    x = torch.randn(2, c, 10, 9, generator=generator).bfloat16().contiguous(memory_format=torch.channels_last)
    z = torch.randn(2, k, 5, 5, generator=generator).bfloat16().contiguous(memory_format=torch.channels_last)
    want = _reference(x.float(), wq, w_scale, 0.03, bias, (2, 2), pads, (1, 1), z.float())
    got = qc.QuantizedConv(wq, w_scale, 0.03, bias, (2, 2), (1, 1), "Relu", tile=tile)(x, pads[:2], (5, 5), z)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= BF16_BOUND


@pytest.mark.parametrize("residual", ["float", "int8"])
@pytest.mark.parametrize("output", ["float", "int8"])
def test_an_int8_input_with_a_residual_into_either_output(residual, output):
    generator = torch.Generator().manual_seed(7)
    c, k = 32, 48
    wq = torch.randint(-127, 128, (k, c, 3, 3), generator=generator, dtype=torch.int8)
    w_scale = torch.rand(k, generator=generator) * 1e-3 + 1e-4
    bias = torch.randn(k, generator=generator)
    x = torch.randint(-128, 128, (1, c, 14, 14), generator=generator, dtype=torch.int8)
    x = x.contiguous(memory_format=torch.channels_last)
    if residual == "int8":
        z, z_scale = torch.randint(-128, 128, (1, k, 14, 14), generator=generator, dtype=torch.int8), 0.04
    else:
        z, z_scale = torch.randn(1, k, 14, 14, generator=generator), 0.0
    want = _reference(x, wq, w_scale, 0.02, bias, (1, 1), (1, 1, 1, 1), (1, 1), z, z_scale)
    conv = qc.QuantizedConv(wq, w_scale, 0.02, bias, pre="Relu")
    y_scale = 0.05 if output == "int8" else 0.0
    got = conv(x, (1, 1), (14, 14), z, z_scale, y_scale)
    if output == "int8":
        steps = (got.int() - quantize_activation(want.float(), y_scale, "int8").int()).abs()
        assert got.dtype == torch.int8 and steps.max() <= 1 and (steps > 0).float().mean() < 0.01
    else:
        assert ((got.double() - want).abs().max() / want.abs().max()).item() <= FLOAT_BOUND


def test_the_weight_packs_taps_then_quads():
    wq = torch.arange(2 * 5 * 3 * 3, dtype=torch.int32).remainder(200).sub(100).to(torch.int8).reshape(2, 5, 3, 3)
    packed, start = qc.pack_weight(wq, 1)
    blocks = packed.reshape(9, 2, 16, 4)  # [taps, C/4, 16, 4]
    assert torch.equal(blocks[4, 1, 1, 0], wq[1, 4, 1, 1]) and not blocks[:, 1, :, 1:].any()
    assert torch.equal(start[:2], -128 * wq.int().sum(dim=(1, 2, 3))) and not start[2:].any()
