"""The quantized (int8 and float8 E4M3) Triton implicit-GEMM convolution against a float64 reference of its
semantics: x and W quantized by the same rules, the convolution of the integer (E4M3) values in float64,
dequantized by x_scale · w_scale[c], then FusedConv's epilogue. Under Triton's interpreter on the CPU with tiny
shapes, on the GPU with ResNet-sized ones.

Inputs keep x / x_scale away from rounding ties (the float32 quantization of the kernel and the float64 one of
the reference agree; each case checks it first), except in the tie test, whose scale is a power of two.
The interpreter's float32 → float8 cast does not round to nearest (it rounds half away from zero and drops a
carry into the exponent), so under it the E4M3 inputs are exact E4M3 values times a power-of-two scale (which
still tests saturation at ±448, padding, the products, scales and epilogue); E4M3 rounding of arbitrary
inputs is tested on the GPU only.
"""

from __future__ import annotations

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.kernels.quantize import KINDS, quantize_activation, quantize_weight, weight_scales
from tensorforge.kernels.triton import conv
from tensorforge.kernels.triton.conv import (
    ConvConfig,
    conv2d_nhwc_quantized,
    pack_weight,
    quantized_conv_configs,
)
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.ops import load_all
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.pool import window_geometry
from tensorforge.ops.registry import REGISTRY, OpContext
from tests.helpers import DEVICES, compile_for_hopper

# Normwise relative error (max|got - want| / max|want|) against the float64 reference, by output type: int8
# sums are exact and E4M3 products exact in float32, so the error is the float epilogue's and the output's
# rounding.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}
TINY = {"block_m": 16, "block_n": 16, "block_k": 32, "group_m": 2, "num_warps": 1, "num_stages": 1, "split_k": 1}
X_SCALE = 0.0371  # not a power of two: x · (1/x_scale) rounds
EXACT_SCALE = 2.0**-5  # a power of two: x · (1/x_scale) is exact
FLOATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# (input shape, output channels, kernel size, attributes). With 32-wide K blocks, 32 channels per group walk
# the K loop tap by tap, fewer walk the flattened K ("dense" order); unpadded whole-block windows load unmasked.
GEOMETRIES = {
    "1x1": ((2, 32, 5, 5), 16, 1, {}),
    "1x1-uneven-channels": ((1, 20, 4, 4), 8, 1, {}),
    "3x3": ((2, 32, 6, 6), 16, 3, {"pads": [1, 1, 1, 1]}),
    "3x3-unpadded": ((1, 32, 5, 5), 8, 3, {}),
    "3x3-stride2": ((1, 16, 9, 9), 16, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "groups2": ((1, 64, 5, 5), 32, 3, {"pads": [1, 1, 1, 1], "group": 2}),
    "groups4-stride2": ((2, 16, 5, 5), 16, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 4}),
    "7x7-stride2-stem": ((1, 3, 9, 9), 8, 7, {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
}
# (bias, residual, pre, post)
EPILOGUES = {
    "plain": (False, False, "", ""),
    "bias-relu": (True, False, "Relu", ""),
    "resnet-add-relu": (True, True, "", "Relu"),
    "hardswish-add": (False, True, "HardSwish", ""),
}
FULL_EPILOGUE = (True, True, "HardSwish", "Relu")


def _quantize_reference(x: torch.Tensor, scale: float, kind: str) -> torch.Tensor:
    """x quantized as the semantics state it, `x / scale` in float64, as float64 values."""
    v = x.double() / scale
    if kind == "int8":
        return torch.round(v).clamp(-128, 127)
    return v.clamp(-448, 448).to(torch.float8_e4m3fn).double()


def _values(shape, kind: str, exact: bool, device, x_type: str) -> torch.Tensor:
    """Random x / x_scale values (float64), a few saturating, none within reach of a rounding tie (or, `exact`,
    exactly representable E4M3 values, for the interpreter's cast)."""
    if kind == "int8":
        largest = 12 if x_type == "bf16" else 140  # bfloat16 keeps 8 bits: small values keep their fraction
        whole = torch.randint(-largest, largest + 1, shape, device=device).double()
        return whole + (torch.rand(shape, device=device).double() - 0.5) * 0.7  # |fraction| <= 0.35
    finite = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    grid = finite[finite.isfinite() & (finite != 0)].to(device)
    values = grid[torch.randint(0, grid.numel(), shape, device=device)]
    values = torch.where(torch.rand(shape, device=device) < 0.03, values.sign() * 600.0, values)  # saturate
    if exact:
        return values
    return values * (1.0 + (torch.rand(shape, device=device).double() - 0.5) * 0.04)  # within 2%: E4M3 steps >= 6%


def _input(shape, kind: str, x_type: str, device, *, exact: bool = False):
    """(x as the kernel gets it, its scale, its quantized values in float64), channels_last."""
    scale = EXACT_SCALE if exact else X_SCALE
    x = (_values(shape, kind, exact, device, x_type) * scale).to(FLOATS.get(x_type, torch.float32))
    q = _quantize_reference(x, scale, kind)
    # The kernel quantizes in float32 (times 1/scale): the inputs must not sit where that rounds otherwise.
    assert torch.equal(quantize_activation(x, scale, kind).double(), q), "an input lies at a rounding tie"
    if x_type in ("int8", "fp8"):
        x = quantize_activation(x, scale, kind)
    return x.contiguous(memory_format=torch.channels_last), scale, q


def _layer(device, kind, x_type, out_dtype, geometry, epilogue, *, exact=False):
    shape, cout, kernel_size, attributes = GEOMETRIES[geometry] if isinstance(geometry, str) else geometry
    has_bias, has_residual, pre, post = epilogue
    group = attributes.get("group", 1)
    x, x_scale, xq = _input(shape, kind, x_type, device, exact=exact)
    w = torch.randn(cout, shape[1] // group, kernel_size, kernel_size, device=device)
    w[0] /= 16  # channels of different ranges: per-channel scales
    wq, w_scale = quantize_weight(w, kind)
    b = torch.randn(cout, device=device) if has_bias else None
    attrs = {**attributes, "pre": pre, "pre_params": [], "post": post, "post_params": []}
    _, _, out_hw = _geometry(shape, w.shape, attrs)
    z = None
    if has_residual:
        z = torch.randn(shape[0], cout, *out_hw, device=device).to(out_dtype)
        z = z.contiguous(memory_format=torch.channels_last)
    return x, x_scale, xq, wq, w_scale, b, z, attrs


def _geometry(shape, weight_shape, attrs):
    return window_geometry(
        shape[2:], weight_shape[2:], attrs.get("strides"), attrs.get("dilations"), attrs.get("pads"),
        attrs.get("auto_pad", "NOTSET"),
    )  # fmt: skip


def _reference(xq, x_scale, wq, w_scale, b, z, attrs) -> torch.Tensor:
    """The registry's FusedConv in float64 over the quantized values, the weight's channel c times
    x_scale · w_scale[c]: `conv(q_x, q_w · s) = (Σ q_x·q_w) · s`, dequantized before the bias as specified."""
    load_all()
    node = Node("FusedConv", [Value("x"), Value("w"), Value("b"), Value("z")], [Value("y")], attrs, domain=DOMAIN)
    ctx = OpContext(node=node, opset=1, device=xq.device)
    scaled = wq.double() * (x_scale * w_scale.double()).reshape(-1, 1, 1, 1)
    wide = [t.double() if t is not None else None for t in (b, z)]
    return REGISTRY.lookup("FusedConv", DOMAIN, 1).impl(ctx, xq, scaled, *wide, **attrs)


def _run(
    x, x_scale, wq, w_scale, b, z, attrs, *, out_dtype=None, out=None, config=TINY, k_major=True, y_scale=0.0
) -> torch.Tensor:
    begin, _, out_hw = _geometry(x.shape, wq.shape, attrs)
    return conv2d_nhwc_quantized(
        x, pack_weight(wq, attrs.get("group", 1), k_major=k_major), w_scale, x_scale, b, z,
        out_hw=out_hw, strides=attrs.get("strides", [1, 1]), pads_begin=begin, dilations=attrs.get("dilations", [1, 1]),
        pre=activation_args(attrs["pre"]), post=activation_args(attrs["post"]), out_dtype=out_dtype, out=out,
        config=config, y_scale=y_scale,
    )  # fmt: skip


def _poisoned(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(like.shape, float("nan"), dtype=dtype, device=like.device).contiguous(
        memory_format=torch.channels_last
    )


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any(), "the kernel left output elements unwritten (NaN poison) or made NaNs"
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _check_case(device, kind, x_type, out_dtype, geometry, epilogue, *, config=TINY, exact=False, k_major=True):
    x, x_scale, xq, wq, w_scale, b, z, attrs = _layer(device, kind, x_type, out_dtype, geometry, epilogue, exact=exact)
    want = _reference(xq, x_scale, wq, w_scale, b, z, attrs)
    out = _poisoned(want, out_dtype)
    got = _run(x, x_scale, wq, w_scale, b, z, attrs, out=out, config=config, k_major=k_major)
    assert got is out and got.is_contiguous(memory_format=torch.channels_last)
    error = _error(got, want)
    assert error <= TOLERANCE[out_dtype], (error, config)


# -- int8 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_type", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_int8_every_geometry_matches_the_reference(device, x_type, geometry):
    """x quantized on load (float32 / float16) or given as int8, into float32 / float16."""
    torch.manual_seed(1)
    out_dtype = torch.float16 if x_type == "fp16" else torch.float32
    _check_case(device, "int8", x_type, out_dtype, geometry, FULL_EPILOGUE)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=["out-fp32", "out-fp16"])
@pytest.mark.parametrize("x_type", ["fp32", "int8"])
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_int8_every_epilogue_matches_the_reference(device, out_dtype, x_type, epilogue):
    torch.manual_seed(2)
    _check_case(device, "int8", x_type, out_dtype, "3x3-stride2", EPILOGUES[epilogue])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("geometry", "splits"), [("3x3", 2), ("3x3-stride2", 3), ("7x7-stride2-stem", 2)])
def test_int8_split_k_sums_int32_partials(device, geometry, splits):
    torch.manual_seed(3)
    _check_case(device, "int8", "fp32", torch.float32, geometry, FULL_EPILOGUE, config={**TINY, "split_k": splits})


@pytest.mark.parametrize("device", DEVICES)
def test_int8_split_k_is_exact(device):
    """Sums past 2^24 (float32 would round each partial): with int32 partials every split gives the exact sum,
    rounded once to float32, bit for bit."""
    torch.manual_seed(15)
    x = torch.randint(120, 128, (1, 256, 3, 3), dtype=torch.int8, device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    wq = torch.randint(120, 128, (16, 256, 3, 3), dtype=torch.int8, device=device)
    exact = torch.nn.functional.conv2d(x.double(), wq.double())
    assert exact.min() > 2**24
    for splits in (1, 2, 3):
        got = _run(x, 1.0, wq, torch.ones(16, device=device), None, None, {"pre": "", "post": ""},
                   out_dtype=torch.float32, config={**TINY, "split_k": splits})  # fmt: skip
        assert torch.equal(got, exact.float()), splits


@pytest.mark.parametrize("device", DEVICES)
def test_int8_rounds_half_to_even_and_saturates(device):
    """x / x_scale exactly at .5 ties (a power-of-two scale) and beyond [−128, 127]: a 1×1 convolution with an
    identity weight returns the quantized input times the scales."""
    values = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.5, 127.5, -128.5, 300.0, -300.0, 3.25, -7.75])
    x = (values * EXACT_SCALE).reshape(1, 1, 1, -1).expand(1, 16, 1, -1).to(device)
    x = x.contiguous(memory_format=torch.channels_last)
    wq = torch.eye(16, dtype=torch.int8, device=device).reshape(16, 16, 1, 1)
    w_scale = torch.full((16,), 0.5, device=device)
    y = _run(x, EXACT_SCALE, wq, w_scale, None, None, {"pre": "", "post": ""}, out_dtype=torch.float32)
    expected = torch.tensor([0, 2, 2, 0, -2, -2, 126, -128, 127, -128, 127, -128, 3, -8]) * EXACT_SCALE * 0.5
    assert torch.equal(y[0, 0, 0].cpu(), expected.float()), y[0, 0, 0]
    assert torch.equal(y[0, 7, 0].cpu(), expected.float())


@pytest.mark.parametrize("device", DEVICES)
def test_padding_quantizes_to_zero(device):
    """An input whose every element quantizes to a large value: the border outputs sum fewer taps, exactly."""
    x = torch.full((1, 32, 4, 4), 100.5 * EXACT_SCALE, device=device).contiguous(memory_format=torch.channels_last)
    wq = torch.ones(8, 32, 3, 3, dtype=torch.int8, device=device)
    w_scale = torch.ones(8, device=device)
    attrs = {"pads": [1, 1, 1, 1], "pre": "", "post": ""}
    y = _run(x, EXACT_SCALE, wq, w_scale, None, None, attrs, out_dtype=torch.float32)
    taps = torch.tensor([[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]], dtype=torch.float32)
    assert torch.equal(y[0, 3].cpu(), taps * 32 * 100 * EXACT_SCALE)  # 100.5 rounds to 100 (even)


@pytest.mark.parametrize("device", DEVICES)
def test_writes_into_a_channel_slice(device):
    """An output that is a channel slice of a larger channels_last buffer: the slice is written, its
    neighbours are not; an NCHW input and a broadcast residual are read through their strides."""
    torch.manual_seed(4)
    x, x_scale, xq, wq, w_scale, b, _, attrs = _layer(device, "int8", "fp32", torch.float32, "3x3", FULL_EPILOGUE)
    z = torch.randn(1, 16, 1, 6, device=device)
    want = _reference(xq, x_scale, wq, w_scale, b, z, attrs)
    buffer = _poisoned(torch.empty(2, 40, 6, 6, device=device), torch.float32)
    out = buffer[:, 8:24]
    got = _run(x.contiguous(), x_scale, wq, w_scale, b, z, attrs, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert _error(got, want) <= TOLERANCE[torch.float32]
    assert buffer[:, :8].isnan().all() and buffer[:, 24:].isnan().all()


def test_allocated_output_takes_out_dtype_or_x_type():
    torch.manual_seed(5)
    x, x_scale, xq, wq, w_scale, b, z, attrs = _layer("cpu", "int8", "fp16", torch.float16, "1x1", EPILOGUES["plain"])
    y = _run(x, x_scale, wq, w_scale, b, z, attrs)
    assert y.dtype == torch.float16 and y.is_contiguous(memory_format=torch.channels_last)
    y = _run(x, x_scale, wq, w_scale, b, z, attrs, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and y.shape == (2, 16, 5, 5)
    assert _error(y, _reference(xq, x_scale, wq, w_scale, b, z, attrs)) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("geometry", ["3x3", "groups4-stride2", "1x1-uneven-channels"])
def test_the_contiguous_packing_gives_the_same_result(device, kind, geometry):
    """pack_weight's contiguous layout (B read N-major) as well as the K-major one the other tests use."""
    torch.manual_seed(14)
    _check_case(device, kind, "fp32", torch.float32, geometry, FULL_EPILOGUE, exact=kind != "int8", k_major=False)


# -- float8 E4M3 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_type", ["fp32", "fp16", "fp8"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_fp8_every_geometry_matches_the_reference(device, x_type, geometry):
    """Exact E4M3 inputs (see the module docstring), quantized on load or given as float8_e4m3fn."""
    torch.manual_seed(6)
    out_dtype = torch.float16 if x_type == "fp16" else torch.float32
    _check_case(device, "fp8e4m3", x_type, out_dtype, geometry, FULL_EPILOGUE, exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_fp8_every_epilogue_matches_the_reference(device, epilogue):
    torch.manual_seed(7)
    _check_case(device, "fp8e4m3", "fp16", torch.float16, "3x3-stride2", EPILOGUES[epilogue], exact=True)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_split_k(device):
    torch.manual_seed(8)
    config = {**TINY, "split_k": 2}
    _check_case(device, "fp8e4m3", "fp32", torch.float32, "3x3", FULL_EPILOGUE, config=config, exact=True)


# -- per-channel input scales (depthwise layers) ---------------------------------------------------------------

DEPTHWISE = {
    "3x3": ((2, 32, 6, 6), 32, 3, {"pads": [1, 1, 1, 1], "group": 32}),
    "3x3-stride2-multiplier2": ((1, 16, 9, 9), 32, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 16}),
    "5x5": ((1, 24, 7, 7), 24, 5, {"pads": [2, 2, 2, 2], "group": 24}),
}


def _check_channels_case(device, kind, x_type, geometry, *, config=TINY):
    """x whose channels span 100x in range, quantized on load with one scale per channel (`x_inv_channels`),
    the channels' scales folded into the weight scales, against the float64 reference of the same integers."""
    shape, cout, kernel_size, attributes = DEPTHWISE[geometry]
    channels = shape[1]
    exact = kind != "int8" and device == "cpu"  # the interpreter's E4M3 cast: exact values, power-of-two scales
    scales = torch.logspace(-2, 0, channels, dtype=torch.float64, device=device)
    if exact:
        scales = 2.0 ** torch.round(torch.log2(scales))
    values = _values(shape, kind, exact, device, x_type)
    x = (values * scales.reshape(1, -1, 1, 1)).to(FLOATS[x_type])
    inverse = (1.0 / scales).float()
    xq = _quantize_reference(x / scales.reshape(1, -1, 1, 1), 1.0, kind)
    # The kernel multiplies by the float32 inverse: the inputs must not sit where that rounds otherwise.
    assert torch.equal(quantize_activation(x.float() * inverse.reshape(1, -1, 1, 1), 1.0, kind).double(), xq)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, 1, kernel_size, kernel_size, device=device)
    wq, w_scale = quantize_weight(w, kind)
    folded = (w_scale.double() * scales.repeat_interleave(cout // channels)).float()
    b = torch.randn(cout, device=device)
    attrs = {**attributes, "pre": "HardSwish", "pre_params": [], "post": "", "post_params": []}
    want = _reference(xq, 1.0, wq, folded, b, None, attrs)
    out = _poisoned(want, torch.float32)
    begin, _, out_hw = _geometry(x.shape, wq.shape, attrs)
    got = conv2d_nhwc_quantized(
        x, pack_weight(wq, attrs["group"], k_major=True), folded, 1.0, b, out_hw=out_hw,
        strides=attrs.get("strides", [1, 1]), pads_begin=begin, pre=activation_args("HardSwish"), out=out,
        config=config, x_inv_channels=inverse,
    )  # fmt: skip
    assert got is out
    error = _error(got, want)
    assert error <= TOLERANCE[torch.float32], error


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_type", ["fp32", "fp16"])
@pytest.mark.parametrize("geometry", sorted(DEPTHWISE))
def test_int8_per_channel_input_scales(device, x_type, geometry):
    torch.manual_seed(9)
    _check_channels_case(device, "int8", x_type, geometry)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("geometry", sorted(DEPTHWISE))
def test_fp8_per_channel_input_scales(device, geometry):
    torch.manual_seed(10)
    _check_channels_case(device, "fp8e4m3", "fp32", geometry)


def test_bad_per_channel_scales_are_named():
    x = torch.randn(1, 8, 5, 5)
    wq = pack_weight(torch.ones(8, 1, 3, 3, dtype=torch.int8), 8)
    scale = torch.ones(8)
    common = {"out_hw": (3, 3), "config": TINY}
    for bad in (torch.ones(4), torch.ones(8, dtype=torch.float16), torch.ones(16)[::2]):
        with pytest.raises(ValueError, match=r"x_inv_channels must be a contiguous float32 \[8\]"):
            conv2d_nhwc_quantized(x, wq, scale, 1.0, x_inv_channels=bad, **common)
    with pytest.raises(ValueError, match="x_inv_channels quantizes a float x"):
        conv2d_nhwc_quantized(
            x.to(torch.int8), wq, scale, 1.0, out_dtype=torch.float32, x_inv_channels=torch.ones(8), **common
        )


# -- weights, configurations, checks ------------------------------------------------------------------------


def test_int8_weight_scales_are_calibrations():
    """The kernels' int8 scales and values are those of quant.weights and of the reference QuantizeLinear."""
    from tensorforge.ir import DType
    from tensorforge.ops.quantize import quantize
    from tensorforge.quant.weights import weight_scales as calibrated_scales

    torch.manual_seed(9)
    w = torch.randn(8, 4, 3, 3)
    w[2] = 0.0  # an all-zero channel: the smallest scale, zero values
    w[5, 1, 1, 1] = 7.0
    wq, scale = quantize_weight(w, "int8")
    assert scale.dtype == torch.float32 and torch.equal(scale, calibrated_scales(w, 0))
    assert torch.equal(wq, quantize(w, scale, None, DType.INT8, axis=0))
    assert wq.dtype == torch.int8 and wq.abs().amax(dim=(1, 2, 3)).tolist() == [127, 127, 0, 127, 127, 127, 127, 127]
    assert scale[2] == 1e-12


@pytest.mark.parametrize("kind", ["int8", "fp8e4m3"])
def test_weights_quantize_as_the_quantized_engine_does(kind):
    """The same values and scales as the QuantizedConv lowering puts in the graph."""
    from tensorforge.quant.lower import quantize_weight as lowered

    torch.manual_seed(16)
    w = torch.randn(8, 4, 3, 3) * torch.rand(8, 1, 1, 1)
    wq, scale = quantize_weight(w, kind)
    want_q, want_scale = lowered(w, kind)
    assert torch.equal(scale, want_scale) and wq.dtype == want_q.dtype
    assert torch.equal(wq.float(), want_q.float())


def test_fp8_weight_scales():
    torch.manual_seed(10)
    w = torch.randn(6, 3, 1, 1)
    wq, scale = quantize_weight(w, "fp8e4m3")
    assert wq.dtype == torch.float8_e4m3fn
    assert torch.equal(scale, (w.double().abs().amax(dim=(1, 2, 3)) / 448).float())
    assert torch.equal(wq.float().abs().amax(dim=(1, 2, 3)), torch.full((6,), 448.0))
    assert torch.equal(weight_scales(w, "fp8e4m3"), scale)
    with pytest.raises(ValueError, match="unknown quantization kind"):
        quantize_weight(w, "int4")
    assert sorted(KINDS) == ["fp8e4m3", "int8"]


def test_configs_by_effort():
    sizes = [len(quantized_conv_configs(effort)) for effort in (0, 1, 2)]
    assert sizes == [5, 12, 25]
    wide = [ConvConfig.of(c) for c in quantized_conv_configs(2)]
    assert all(c.block_k % 32 == 0 for c in wide)
    assert len({tuple(sorted(c.items())) for c in quantized_conv_configs(2)}) == len(wide), "a config is listed twice"
    for c in map(ConvConfig.of, quantized_conv_configs(0)):  # float32 A quantized on load, 8-bit B: all fit
        assert c.num_stages * (c.block_m * c.block_k * 4 + c.block_k * c.block_n) <= 227 * 1024, c


def test_bad_operands_are_named():
    x = torch.randn(1, 8, 5, 5)
    wq = pack_weight(torch.ones(8, 8, 3, 3, dtype=torch.int8), 1)
    scale = torch.ones(8)
    common = {"out_hw": (3, 3), "config": TINY}
    with pytest.raises(ValueError, match="int8 or float8_e4m3fn weight"):
        conv2d_nhwc_quantized(x, wq.float(), scale, 0.1, **common)
    fp8 = pack_weight(torch.ones(8, 8, 3, 3).to(torch.float8_e4m3fn), 1)
    with pytest.raises(ValueError, match="already torch.float8_e4m3fn"):
        conv2d_nhwc_quantized(torch.ones(1, 8, 5, 5, dtype=torch.int8), fp8, scale, 0.1, **common)
    with pytest.raises(ValueError, match="x has 4 channels"):
        conv2d_nhwc_quantized(torch.randn(1, 4, 5, 5), wq, scale, 0.1, **common)
    for bad_scale in (torch.ones(4), scale.half(), torch.ones(16)[::2]):
        with pytest.raises(ValueError, match=r"weight_scale must be a contiguous float32 \[8\]"):
            conv2d_nhwc_quantized(x, wq, bad_scale, 0.1, **common)
    for bad in (0.0, -1.0, float("inf"), torch.tensor(0.1)):
        with pytest.raises(ValueError, match="x_scale must be a positive finite"):
            conv2d_nhwc_quantized(x, wq, scale, bad, **common)
    with pytest.raises(ValueError, match="out_dtype must be"):
        conv2d_nhwc_quantized(torch.ones(1, 8, 5, 5, dtype=torch.int8), wq, scale, 0.1, **common)
    with pytest.raises(ValueError, match="out is"):
        conv2d_nhwc_quantized(x, wq, scale, 0.1, out=torch.empty(1, 8, 5, 5), **common)
    with pytest.raises(ValueError, match="out is"):
        conv2d_nhwc_quantized(x, wq, scale, 0.1, out=torch.empty(1, 8, 3, 3), out_dtype=torch.float16, **common)
    with pytest.raises(ValueError, match="does not broadcast"):
        conv2d_nhwc_quantized(x, wq, scale, 0.1, None, torch.randn(1, 8, 2, 2), **common)
    with pytest.raises(ValueError, match="K in steps of 32"):
        conv2d_nhwc_quantized(x, wq, scale, 0.1, out_hw=(3, 3), config={**TINY, "block_k": 16})
    with pytest.raises(ValueError, match="contiguous or k_major"):
        conv2d_nhwc_quantized(x, wq.transpose(3, 4), scale, 0.1, **common)


def test_fp8_needs_compute_capability_8_9(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ValueError, match=r"compute capability 8.9 or newer.*A100 has 8.0"):
        conv._check_fp8_device(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    conv._check_fp8_device(torch.device("cuda", 0))


_COMPILE_FOR_HOPPER = """
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tensorforge.kernels.triton.conv import _conv2d_igemm as fn
for quant, x_type, w_type, mma, y_type, res_type, channels in (
        (1, "*fp16", "*i8", "s32.s8.s8", "*fp16", "*fp16", False),
        (1, "*fp16", "*i8", "s32.s8.s8", "*fp16", "*fp16", True),
        (1, "*i8", "*i8", "s32.s8.s8", "*fp16", "*fp16", False),
        (1, "*i8", "*i8", "s32.s8.s8", "*i8", "*fp16", False),
        (1, "*i8", "*i8", "s32.s8.s8", "*i8", "*i8", False),
        (2, "*fp32", "*fp8e4nv", "f32.e4m3.e4m3", "*fp16", "*fp16", False)):
    constants = dict(
        KH=3, KW=3, DENSE_K=False, EVEN_K=True, PADDED=True, HAS_BIAS=True, HAS_RES=True, PRE=0, POST=1,
        SPLIT=False, DOT_PRECISION="ieee", QUANT=quant, QUANTIZE_X=x_type != w_type, X_CHANNELS=channels,
        QUANT_Y=quant if y_type == w_type else 0, PROMOTE=True, W_K_MAJOR=True, ALIGN=16,
        BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, sxc=1, src=1, syc=1,
    )
    types = {"x": x_type, "w": w_type, "bias": "*fp32", "res": res_type, "y": y_type, "partial": "*fp16",
             "w_scale": "*fp32", "x_inv": "*fp32"}
    floats = ("pre0", "pre1", "post0", "post1", "x_scale", "x_inv_scale", "y_inv_scale", "z_scale")
    signature = {
        n: "constexpr" if n in constants else types.get(n) or ("fp32" if n in floats else "i32") for n in fn.arg_names
    }
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in types}
    source = ASTSource(fn, signature, constants, attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 4})
    ptx = kernel.asm["ptx"]
    wgmma = len(re.findall(r"wgmma\\.mma_async[^ ]*" + re.escape(mma), ptx))
    print(quant, x_type, wgmma, len(re.findall(r"cp\\.async\\.cg", ptx)), ptx.count("st.shared.b8"))
"""


def test_the_quantized_kernel_compiles_for_hopper_with_8_bit_tensor_cores():
    """Through Triton's real compiler for sm_90 (no GPU needed): int8 (from float16 on load, per tensor or per
    channel, from int8, from int8 to a requantized int8 output, with an fp16 or an int8 residual) and E4M3 (from
    float32 on load) products run on wgmma with 8-bit operands; the K-major weight loads asynchronously into
    shared memory, never transposed byte by byte (st.shared.b8)."""
    counts = compile_for_hopper(_COMPILE_FOR_HOPPER)
    assert len(counts) == 6, counts
    for _, _, wgmma, cp_async, byte_stores in counts:
        assert int(wgmma) > 0 and int(cp_async) > 0 and int(byte_stores) == 0, counts


# -- GPU: bfloat16, E4M3 rounding, the shapes of real networks ---------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_bf16_input_and_output_on_the_gpu(kind, geometry):
    torch.manual_seed(11)
    _check_case("cuda", kind, "bf16", torch.bfloat16, geometry, FULL_EPILOGUE, exact=kind != "int8")


@pytest.mark.gpu
@pytest.mark.parametrize("x_type", ["fp32", "fp16"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_fp8_rounds_to_nearest_even_on_the_gpu(x_type, geometry):
    """Arbitrary (not E4M3) inputs with a scale that is no power of two: the hardware's rounding."""
    torch.manual_seed(12)
    out_dtype = torch.float16 if x_type == "fp16" else torch.float32
    _check_case("cuda", "fp8e4m3", x_type, out_dtype, geometry, FULL_EPILOGUE)


# (input shape, output channels, kernel size, attributes): ResNet-50 layers.
NETWORK_SHAPES = {
    "resnet-3x3-64": ((8, 64, 56, 56), 64, 3, {"pads": [1, 1, 1, 1]}),
    "resnet-1x1-256-64": ((8, 256, 56, 56), 64, 1, {}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("x_type", ["fp16", "quantized"])
@pytest.mark.parametrize("kind", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("layer", sorted(NETWORK_SHAPES))
def test_network_shapes_every_config_on_the_gpu(x_type, kind, layer):
    """Every effort-1 config, x quantized on load (float16) or given quantized, into float16. E4M3 on wgmma
    configs adds each instruction's 32 products in the tensor cores' reduced precision: about 1e-3 normwise on
    these layers on an H200, inside the float16 output's tolerance. E4M3 tiles of 256 rows quantizing on load
    are refused (they stopped the H200 with an illegal instruction)."""
    torch.manual_seed(13)
    x_type = {"quantized": "int8" if kind == "int8" else "fp8"}.get(x_type, x_type)
    x, x_scale, xq, wq, w_scale, b, z, attrs = _layer(
        "cuda", kind, x_type, torch.float16, NETWORK_SHAPES[layer], EPILOGUES["resnet-add-relu"]
    )
    want = _reference(xq, x_scale, wq, w_scale, b, z, attrs)
    for config in quantized_conv_configs(1):
        if kind == "fp8e4m3" and x_type == "fp16" and config["block_m"] >= conv._FP8_FAULTY_BLOCK_M:
            with pytest.raises(ValueError, match="illegal instruction"):  # refused before it can fault
                _run(x, x_scale, wq, w_scale, b, z, attrs, config=config)
            continue
        got = _run(x, x_scale, wq, w_scale, b, z, attrs, out=_poisoned(want, torch.float16), config=config)
        error = _error(got, want)
        assert error <= TOLERANCE[torch.float16], (error, config)
