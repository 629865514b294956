"""The quantized layers' activation quantization (`ops.fused.quantize_activation`, the reference) is the kernels'
(`kernels.quantize.quantize_activation`, which the Triton kernels' `quantize` mirrors: `x · (1/scale)` in
float32), bit for bit, ties, saturation and half-precision inputs included; and QuantizeLinear's (a float32
division) but for one step on the rare elements where the two roundings straddle a boundary of the grid."""

import pytest
import torch

from tensorforge.ir import DType
from tensorforge.kernels.quantize import quantize_activation as kernels_quantize
from tensorforge.ops.fused import quantize_activation
from tensorforge.ops.quantize import quantize


def _inputs(scale: float, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 9, 9, generator=generator) * 40 * scale  # a few saturate
    ties = (torch.arange(-300, 300) + 0.5) * scale  # exact ties for a power-of-two scale
    return torch.cat([x.reshape(-1), ties]).to(dtype)


@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [0.05, 0.0371, 2.0**-5, 3.0])
def test_the_reference_quantizes_as_the_kernels_bit_for_bit(quant, dtype, scale):
    x = _inputs(scale, dtype)
    got = quantize_activation(x, scale, quant)
    want = kernels_quantize(x, scale, quant)
    assert got.dtype == want.dtype and torch.equal(got.view(torch.int8), want.view(torch.int8))
    channels_last = x[: 4 * 16 * 81].reshape(4, 16, 9, 9).contiguous(memory_format=torch.channels_last)
    assert quantize_activation(channels_last, scale, quant).is_contiguous(memory_format=torch.channels_last)


def test_per_channel_scales_multiply_by_each_channels_inverse():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 5, generator=generator)
    scales = torch.tensor([0.05, 0.0371, 0.2])
    got = quantize_activation(x, scales, "int8")
    for c in range(3):
        assert torch.equal(got[:, c], kernels_quantize(x[:, c], float(scales[c]), "int8"))


def test_quantize_linear_differs_by_one_step_on_rare_elements_only():
    """Ten million normal values at a scale whose inverse float32 rounds: division and multiplication by the
    inverse round a handful of them to neighbouring steps, never further."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(10_000_000, generator=generator) * 1.2
    scale = 0.0347
    ours = quantize_activation(x, scale, "int8").int()
    linear = quantize(x, torch.tensor(scale, dtype=torch.float32), None, DType.INT8).int()
    differ = ours != linear
    assert 0 < int(differ.sum()) < 100
    assert int((ours - linear).abs().max()) == 1
