"""The quantized Triton convolution writing a requantized output (`y_scale`): int8 (or E4M3) into int8 (or
E4M3), the next quantized layer's input. Checked against the float64 reference of
`test_triton_conv_quantized`: every output must be a rounding, onto the output grid, of a value within the float32
tolerance of the reference (`tactics.autotune.quantized_mismatch`). Under Triton's interpreter on tiny shapes for
int8 (its float32 → float8 cast does not round to nearest, so E4M3 outputs are checked on the GPU only), on the
GPU also on ResNet-50's shapes with every effort-1 configuration."""

from __future__ import annotations

import pytest
import torch

from tensorforge.kernels.quantize import KINDS
from tensorforge.kernels.triton.conv import quantized_conv_configs
from tensorforge.tactics.autotune import quantized_mismatch
from tests.helpers import DEVICES
from tests.kernels.test_triton_conv_quantized import (
    EPILOGUES,
    FULL_EPILOGUE,
    NETWORK_SHAPES,
    TINY,
    TOLERANCE,
    _layer,
    _reference,
    _run,
)

Y_FACTOR = 0.93  # y_scale a little below max|Y| / QMAX, not a power of two: a few outputs saturate


def _check_requantized(device, kind, x_type, geometry, epilogue, *, config=TINY, y_factor=Y_FACTOR):
    x, x_scale, xq, wq, w_scale, b, z, attrs = _layer(device, kind, x_type, torch.float32, geometry, epilogue)
    want = _reference(xq, x_scale, wq, w_scale, b, z, attrs)
    y_scale = float(want.abs().max()) / KINDS[kind][1] * y_factor
    out = torch.full(want.shape, 77, dtype=wq.dtype, device=device).contiguous(memory_format=torch.channels_last)
    begin_out = out.clone()
    got = _run(x, x_scale, wq, w_scale, b, z, attrs, out=out, config=config, y_scale=y_scale)
    assert got is out and got.dtype == wq.dtype and got.is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(got, begin_out)
    problem = quantized_mismatch(got.cpu(), want.cpu(), y_scale, kind, TOLERANCE[torch.float32])
    assert problem == "", (problem, config)
    return got, want, y_scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_type", ["fp32", "int8"])
@pytest.mark.parametrize("geometry", ["1x1", "1x1-uneven-channels", "3x3", "groups4-stride2", "7x7-stride2-stem"])
def test_int8_into_int8_matches_the_reference(device, x_type, geometry):
    torch.manual_seed(21)
    got, want, y_scale = _check_requantized(device, "int8", x_type, geometry, FULL_EPILOGUE)
    assert got.min() == -128 or got.max() == 127  # the scale saturates the largest outputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_int8_requantizes_after_every_epilogue(device, epilogue):
    torch.manual_seed(22)
    _check_requantized(device, "int8", "int8", "3x3-stride2", EPILOGUES[epilogue])


@pytest.mark.parametrize("device", DEVICES)
def test_split_k_requantizes_once_after_the_exact_sum(device):
    torch.manual_seed(23)
    _check_requantized(device, "int8", "int8", "3x3", FULL_EPILOGUE, config={**TINY, "split_k": 2})


def test_a_requantized_output_is_of_the_weight_type_and_needs_a_valid_scale():
    x, x_scale, _, wq, w_scale, b, z, attrs = _layer("cpu", "int8", "int8", torch.float32, "1x1", FULL_EPILOGUE)
    with pytest.raises(ValueError, match="with y_scale the output is torch.int8"):
        _run(x, x_scale, wq, w_scale, b, z, attrs, out_dtype=torch.float32, y_scale=0.1)
    for bad in (-1.0, float("nan"), torch.tensor(0.1)):
        with pytest.raises(ValueError, match="y_scale must be a finite Python float >= 0"):
            _run(x, x_scale, wq, w_scale, b, z, attrs, y_scale=bad)
    assert _run(x, x_scale, wq, w_scale, b, z, attrs, y_scale=0.1).dtype == torch.int8


@pytest.mark.gpu
@pytest.mark.parametrize("x_type", ["fp16", "fp8"])
@pytest.mark.parametrize("geometry", ["1x1", "3x3", "groups4-stride2"])
def test_fp8_into_fp8_rounds_to_nearest_even_on_the_gpu(x_type, geometry):
    torch.manual_seed(24)
    _check_requantized("cuda", "fp8e4m3", x_type, geometry, FULL_EPILOGUE)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("layer", sorted(NETWORK_SHAPES))
def test_network_shapes_requantize_with_every_config_on_the_gpu(kind, layer):
    """Quantized in, quantized out, every effort-1 config (split-K ones included) on ResNet-50's shapes. E4M3
    tensor cores add in reduced precision (about 1e-3 normwise): the fp16 tolerance bounds them."""
    torch.manual_seed(25)
    x_type = "int8" if kind == "int8" else "fp8"
    x, x_scale, xq, wq, w_scale, b, z, attrs = _layer(
        "cuda", kind, x_type, torch.float16, NETWORK_SHAPES[layer], EPILOGUES["resnet-add-relu"]
    )
    want = _reference(xq, x_scale, wq, w_scale, b, z, attrs)
    y_scale = float(want.abs().max()) / KINDS[kind][1] * Y_FACTOR
    bound = TOLERANCE[torch.float32] if kind == "int8" else TOLERANCE[torch.float16]
    for config in quantized_conv_configs(1):
        got = _run(x, x_scale, wq, w_scale, b, z, attrs, config=config, y_scale=y_scale)
        assert got.dtype == wq.dtype
        problem = quantized_mismatch(got.cpu(), want.cpu(), y_scale, kind, bound)
        assert problem == "", (problem, config)
