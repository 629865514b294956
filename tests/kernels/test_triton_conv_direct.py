"""The direct few-channel convolution against the reference FusedConv (float64), under Triton's interpreter on
tiny shapes and on the GPU with the stems of real networks; inputs of another type and layout than the output."""

from __future__ import annotations

import pytest
import torch

from tensorforge.kernels.triton.conv import pack_weight
from tensorforge.kernels.triton.conv_direct import conv2d_direct, direct_configs
from tensorforge.kernels.triton.epilogue import activation_args
from tests.helpers import DEVICES
from tests.kernels.test_triton_conv import (
    DTYPES,
    EPILOGUES,
    FULL_EPILOGUE,
    TOLERANCE,
    _error,
    _geometry,
    _poisoned,
    _reference,
)

TINY = {"block_m": 16, "block_n": 16, "num_warps": 1}

# (input shape, output channels, kernel size, attributes)
GEOMETRIES = {
    "stem-3x3-stride2": ((2, 3, 9, 9), 16, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "stem-uneven-channels": ((1, 3, 7, 8), 20, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "5x5-two-channels": ((1, 2, 9, 9), 8, 5, {"pads": [2, 2, 2, 2]}),
    "1x1-sixteen-channels": ((2, 16, 5, 5), 8, 1, {}),
    "asymmetric-pads": ((1, 3, 7, 6), 8, 3, {"pads": [0, 1, 2, 0]}),
    "dilation2": ((1, 3, 9, 9), 8, 3, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "same-upper": ((1, 4, 8, 8), 8, 3, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "unpadded": ((1, 3, 8, 8), 8, 3, {}),
}


def _layer(device, dtype, shape, cout, kernel_size, attributes, epilogue, x_dtype=None):
    """Random operands: x in `x_dtype` (default `dtype`) NCHW-contiguous, as a network's input comes."""
    has_bias, has_residual, pre, pre_params, post, post_params = epilogue
    x = torch.randn(shape, device=device).to(x_dtype or dtype)
    w = (torch.randn(cout, shape[1], kernel_size, kernel_size, device=device) / 3).to(dtype)
    b = torch.randn(cout, device=device).to(dtype) if has_bias else None
    attrs = {**attributes, "pre": pre, "pre_params": pre_params, "post": post, "post_params": post_params}
    _, _, out_hw = _geometry(shape, w.shape, attrs)
    z = None
    if has_residual:
        z = torch.randn(shape[0], cout, *out_hw, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    return x, w, b, z, attrs


def _run(x, w, b, z, attrs, *, config, out=None) -> torch.Tensor:
    begin, _, out_hw = _geometry(x.shape, w.shape, attrs)
    return conv2d_direct(
        x, pack_weight(w, 1), b, z, out_hw=out_hw, strides=attrs.get("strides", [1, 1]), pads_begin=begin,
        dilations=attrs.get("dilations", [1, 1]), pre=activation_args(attrs["pre"], attrs["pre_params"]),
        post=activation_args(attrs["post"], attrs["post_params"]), out=out, config=config,
    )  # fmt: skip


def _check_case(device, precision, geometry, epilogue, config, x_dtype=None):
    shape, cout, kernel_size, attributes = GEOMETRIES[geometry]
    dtype = DTYPES[precision]
    x, w, b, z, attrs = _layer(device, dtype, shape, cout, kernel_size, attributes, epilogue, x_dtype)
    # The reference sees x rounded to the layer's type only where the kernel computes in it: the kernel converts
    # x to float32 as it loads, so a float32 x is compared as it is.
    want = _reference(x, w, b, z, attrs)
    out = _poisoned(want, dtype)
    got = _run(x, w, b, z, attrs, config=config, out=out)
    assert got is out
    assert _error(got, want) <= TOLERANCE[precision]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_every_geometry_matches_the_reference(device, precision, geometry):
    torch.manual_seed(1)
    _check_case(device, precision, geometry, FULL_EPILOGUE, TINY)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_every_epilogue_matches_the_reference(device, epilogue):
    torch.manual_seed(2)
    _check_case(device, "fp16", "stem-3x3-stride2", EPILOGUES[epilogue], TINY)


@pytest.mark.parametrize("device", DEVICES)
def test_a_float32_nchw_input_feeds_an_fp16_channels_last_output(device):
    """The network's input as it comes (float32, NCHW) into an fp16 layer: no cast or layout pass first."""
    torch.manual_seed(3)
    _check_case(device, "fp16", "stem-3x3-stride2", FULL_EPILOGUE, TINY, x_dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_several_channel_tiles_and_a_channel_slice_output(device):
    """40 output channels in 16-wide tiles (the last partial), written into a channel slice of a larger buffer
    whose other channels stay untouched."""
    torch.manual_seed(4)
    x, w, b, z, attrs = _layer(device, torch.float32, (2, 3, 6, 6), 40, 3, {"pads": [1, 1, 1, 1]}, FULL_EPILOGUE)
    want = _reference(x, w, b, z, attrs)
    buffer = _poisoned(torch.empty(2, 50, 6, 6, device=device), torch.float32)
    out = buffer[:, 5:45]
    got = _run(x, w, b, z, attrs, config=TINY, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert _error(got, want) <= TOLERANCE["fp32"]
    assert buffer[:, :5].isnan().all() and buffer[:, 45:].isnan().all()


def test_allocated_output_takes_the_weight_type_and_channels_last():
    torch.manual_seed(5)
    x, w, b, z, attrs = _layer("cpu", torch.float32, (1, 3, 5, 5), 8, 3, {"pads": [1, 1, 1, 1]}, EPILOGUES["plain"])
    y = _run(x.double().float(), w, b, z, attrs, config=TINY)
    assert y.dtype == torch.float32 and y.is_contiguous(memory_format=torch.channels_last)
    assert _error(y, _reference(x, w, b, z, attrs)) <= TOLERANCE["fp32"]


def test_bad_operands_are_named():
    x = torch.randn(1, 3, 5, 5)
    packed = pack_weight(torch.randn(8, 3, 3, 3), 1)
    common = {"out_hw": (3, 3), "config": TINY}
    with pytest.raises(ValueError, match="x has 4 channels"):
        conv2d_direct(torch.randn(1, 4, 5, 5), packed, **common)
    with pytest.raises(ValueError, match="one group"):
        conv2d_direct(torch.randn(1, 4, 5, 5), pack_weight(torch.randn(8, 2, 3, 3), 2), **common)
    with pytest.raises(ValueError, match="at most 64 taps"):
        conv2d_direct(torch.randn(1, 8, 5, 5), pack_weight(torch.randn(8, 8, 3, 3), 1), **common)
    with pytest.raises(ValueError, match="bias must have shape"):
        conv2d_direct(x, packed, torch.randn(4), **common)
    with pytest.raises(ValueError, match="out is"):
        conv2d_direct(x, packed, out=torch.empty(1, 8, 5, 5), **common)


def test_configs_by_effort():
    sizes = [len(direct_configs(effort)) for effort in (0, 1, 2)]
    assert sizes == [2, 4, 6]


# (input shape, output channels, kernel size, attributes): the stems of the zoo's networks.
NETWORK_STEMS = {
    "yolo-stem": ((16, 3, 640, 640), 16, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "efficientnet-stem": ((32, 3, 224, 224), 32, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "mobilenet-stem": ((32, 3, 224, 224), 16, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("stem", sorted(NETWORK_STEMS))
def test_network_stems_on_the_gpu(precision, stem):
    """Every effort-2 config on a float32 NCHW input, as the engine's first layer reads it."""
    torch.manual_seed(6)
    shape, cout, kernel_size, attributes = NETWORK_STEMS[stem]
    dtype = DTYPES[precision]
    epilogue = EPILOGUES["silu-add-sigmoid"]
    x, w, b, z, attrs = _layer("cuda", dtype, shape, cout, kernel_size, attributes, epilogue, torch.float32)
    want = _reference(x, w, b, z, attrs)
    for config in direct_configs(2):
        got = _run(x, w, b, z, attrs, config=config, out=_poisoned(want, dtype))
        assert _error(got, want) <= TOLERANCE[precision], config
