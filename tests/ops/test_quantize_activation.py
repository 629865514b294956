"""The quantized layers' activation quantization (`ops.fused.quantize_activation`) is QuantizeLinear's, bit for
bit: int8 takes a shorter float32 path than `ops.quantize.quantize`, whose result it must keep exactly, ties
(x / scale = k + 1/2, rounding half to even), saturation and half-precision inputs included."""

import pytest
import torch

from tensorforge.ir import DType
from tensorforge.ops.fused import quantize_activation
from tensorforge.ops.quantize import quantize


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [0.05, 0.0371, 2.0**-5, 3.0])
def test_int8_quantization_is_quantize_linear_bit_for_bit(dtype, scale):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 9, 9, generator=generator) * 40 * scale  # a few saturate
    ties = (torch.arange(-300, 300) + 0.5) * scale  # exact ties for a power-of-two scale
    x = torch.cat([x.reshape(-1), ties]).to(dtype)
    want = quantize(x, torch.tensor(scale, dtype=torch.float32), None, DType.INT8)
    got = quantize_activation(x, scale, "int8")
    assert got.dtype == torch.int8 and torch.equal(got, want)
    channels_last = x[: 4 * 16 * 81].reshape(4, 16, 9, 9).contiguous(memory_format=torch.channels_last)
    assert quantize_activation(channels_last, scale, "int8").is_contiguous(memory_format=torch.channels_last)
