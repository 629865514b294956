"""The Triton depthwise convolution against the reference FusedConv (evaluated in float64), under Triton's
interpreter on the CPU with tiny shapes and on the GPU with MobileNetV3 / EfficientNet / ConvNeXt ones."""

from __future__ import annotations

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.kernels.triton.depthwise import (
    _tile,
    depthwise_configs,
    depthwise_conv2d,
    pack_depthwise_weight,
)
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.ops import load_all
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.pool import window_geometry
from tensorforge.ops.registry import REGISTRY, OpContext
from tests.helpers import DEVICES, compile_for_hopper

# Normwise relative error (max|got - want| / max|want|) against float64 on the same rounded inputs: the products
# accumulate in float32, so what is left is the output's rounding (unit roundoff 2^-11 fp16, 2^-8 bf16).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
TINY = {"block_p": 8, "block_c": 4, "num_warps": 1}

# (input shape, channel multiplier, kernel size, FusedConv attributes without group)
GEOMETRIES = {
    "3x3": ((2, 8, 6, 7), 1, 3, {"pads": [1, 1, 1, 1]}),
    "3x3-stride2": ((1, 8, 9, 9), 1, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "5x5-stride2-asymmetric": ((1, 6, 9, 8), 1, 5, {"pads": [1, 2, 2, 1], "strides": [2, 2]}),
    "7x7-convnext": ((1, 4, 8, 8), 1, 7, {"pads": [3, 3, 3, 3]}),
    "dilation2": ((1, 8, 9, 9), 1, 3, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "multiplier2": ((1, 3, 6, 6), 2, 3, {"pads": [1, 1, 1, 1]}),
    "unpadded": ((1, 8, 6, 6), 1, 3, {}),
    "same-upper": ((1, 8, 8, 8), 1, 3, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
}
# (bias, residual, pre, pre_params, post, post_params)
EPILOGUES = {
    "plain": (False, False, "", [], "", []),
    "bias-relu6": (True, False, "Clip", [0.0, 6.0], "", []),
    "bias-hardswish": (True, False, "HardSwish", [], "", []),
    "silu": (True, False, "SiLU", [], "", []),
    "add-residual": (True, True, "", [], "", []),
    "gelu-add-sigmoid": (False, True, "Gelu", [], "Sigmoid", []),
}
FULL_EPILOGUE = (True, True, "HardSwish", [], "Clip", [-1.0, 2.0])


def _reference(x, w, b, z, attributes) -> torch.Tensor:
    """The registry's FusedConv in float64 on the same (already rounded) inputs."""
    load_all()
    node = Node("FusedConv", [Value("x"), Value("w"), Value("b"), Value("z")], [Value("y")], attributes, domain=DOMAIN)
    ctx = OpContext(node=node, opset=1, device=x.device)
    wide = [t.double() if t is not None else None for t in (x, w, b, z)]
    return REGISTRY.lookup("FusedConv", DOMAIN, 1).impl(ctx, *wide, **attributes)


def _layer(device, dtype, geometry, epilogue, channels_last=True):
    """Random operands and FusedConv attributes for one case, and the kernel's geometry arguments."""
    shape, multiplier, k, attributes = geometry
    has_bias, has_residual, pre, pre_params, post, post_params = epilogue
    cin = shape[1]
    cout = cin * multiplier
    x = torch.randn(shape, device=device).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.randn(cout, 1, k, k, device=device) / k).to(dtype)
    b = torch.randn(cout, device=device).to(dtype) if has_bias else None
    attrs = {**attributes, "group": cin, "pre": pre, "pre_params": pre_params, "post": post, "post_params": post_params}
    strides = attrs.get("strides", [1, 1])
    dilations = attrs.get("dilations", [1, 1])
    begin, _, out_hw = window_geometry(
        shape[2:], [k, k], strides, dilations, attrs.get("pads"), attrs.get("auto_pad", "NOTSET")
    )
    z = None
    if has_residual:
        z = torch.randn(shape[0], cout, *out_hw, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    geometry_args = {"out_hw": out_hw, "strides": strides, "pads_begin": begin, "dilations": dilations}
    return x, w, b, z, attrs, geometry_args


def _run(x, w, b, z, attrs, geometry_args, config, out=None):
    pre = activation_args(attrs["pre"], attrs["pre_params"])
    post = activation_args(attrs["post"], attrs["post_params"])
    return depthwise_conv2d(
        x, pack_depthwise_weight(w), b, z, **geometry_args, pre=pre, post=post, out=out, config=config
    )


def _normwise_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_geometries_match_the_reference(device, dtype, name):
    torch.manual_seed(0)
    x, w, b, z, attrs, geometry_args = _layer(device, dtype, GEOMETRIES[name], FULL_EPILOGUE)
    want = _reference(x, w, b, z, attrs)
    out = _poisoned(want.shape, dtype, device)
    got = _run(x, w, b, z, attrs, geometry_args, TINY, out=out)
    assert got is out
    assert not got.isnan().any()
    assert _normwise_error(got, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_epilogues_match_the_reference(device, name):
    torch.manual_seed(1)
    x, w, b, z, attrs, geometry_args = _layer(device, torch.float32, GEOMETRIES["3x3-stride2"], EPILOGUES[name])
    want = _reference(x, w, b, z, attrs)
    got = _run(x, w, b, z, attrs, geometry_args, TINY)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert _normwise_error(got, want) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "config", [{"block_p": 4, "block_c": 8, "num_warps": 1}, {"block_p": 16, "block_c": 2, "num_warps": 2}]
)
def test_contiguous_input_broadcast_residual_and_other_tiles(device, config):
    """NCHW input strides, a residual broadcast over the pixels, whole (EVEN_C) and ragged channel blocks."""
    torch.manual_seed(2)
    x, w, b, _, attrs, geometry_args = _layer(
        device, torch.float32, GEOMETRIES["3x3"], EPILOGUES["bias-relu6"], channels_last=False
    )
    z = torch.randn(1, x.shape[1], 1, 1, device=device)
    want = _reference(x, w, b, z, attrs)
    got = _run(x, w, b, z, attrs, geometry_args, config)
    assert _normwise_error(got, want) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_writes_into_a_channel_slice_of_a_larger_buffer(device):
    """The output goes through the strides of `out`: here channels 3..11 of a 16-channel channels_last buffer,
    as a concatenation would place it; the other channels stay untouched."""
    torch.manual_seed(3)
    x, w, b, z, attrs, geometry_args = _layer(device, torch.float16, GEOMETRIES["3x3"], FULL_EPILOGUE)
    want = _reference(x, w, b, z, attrs)
    n, c, oh, ow = want.shape
    buffer = _poisoned((n, 16, oh, ow), torch.float16, device)
    view = buffer[:, 3 : 3 + c]
    got = _run(x, w, b, z, attrs, geometry_args, TINY, out=view)
    assert _normwise_error(got, want) <= TOLERANCE[torch.float16]
    assert buffer[:, :3].isnan().all() and buffer[:, 3 + c :].isnan().all()


def test_pack_depthwise_weight_is_tap_major():
    w = torch.randn(6, 1, 3, 5)
    packed = pack_depthwise_weight(w)
    assert packed.shape == (3, 5, 6) and packed.is_contiguous()
    assert torch.equal(packed[2, 4], w[:, 0, 2, 4])
    with pytest.raises(ValueError, match="one input channel per group"):
        pack_depthwise_weight(torch.randn(6, 2, 3, 3))


def test_configs_grow_by_effort_and_fit_narrow_layers():
    sizes = [len(depthwise_configs(e)) for e in (0, 1, 2)]
    assert sizes == [4, 10, 17]
    assert all(set(c) == {"block_p", "block_c", "num_warps"} for c in depthwise_configs(2))
    # a 128-wide channel block on 24 channels becomes 32 wide, with 4× the pixels
    assert _tile({"block_p": 16, "block_c": 128, "num_warps": 4}, 24) == (64, 32, 4)
    assert _tile({"block_p": 16, "block_c": 16, "num_warps": 4}, 96) == (16, 16, 4)
    with pytest.raises(ValueError, match="unknown depthwise config keys"):
        _tile({"block_m": 16}, 8)
    with pytest.raises(ValueError, match="powers of two"):
        _tile({"block_p": 12}, 8)


def test_bad_operands_are_refused_with_the_reason():
    x = torch.randn(1, 4, 5, 5)
    w = pack_depthwise_weight(torch.randn(4, 1, 3, 3))
    geometry = {"out_hw": [3, 3]}
    with pytest.raises(ValueError, match="pack_depthwise_weight"):
        depthwise_conv2d(x, torch.randn(4, 1, 3, 3), **geometry)
    with pytest.raises(ValueError, match="pack_depthwise_weight"):
        depthwise_conv2d(x, w.half(), **geometry)
    with pytest.raises(ValueError, match="not a multiple of the 4 input channels"):
        depthwise_conv2d(x, pack_depthwise_weight(torch.randn(6, 1, 3, 3)), **geometry)
    with pytest.raises(ValueError, match="bias must have shape"):
        depthwise_conv2d(x, w, torch.randn(3), **geometry)
    with pytest.raises(ValueError, match="does not broadcast"):
        depthwise_conv2d(x, w, None, torch.randn(1, 4, 2, 2), **geometry)
    with pytest.raises(ValueError, match="out is"):
        depthwise_conv2d(x, w, **geometry, out=torch.empty(1, 4, 2, 2))
    with pytest.raises(ValueError, match="4-D float16/bfloat16/float32"):
        depthwise_conv2d(x.double(), w, **geometry)


_COMPILE_FOR_HOPPER = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tensorforge.kernels.triton.depthwise import _depthwise_conv2d as fn
constants = dict(
    KH=5, KW=5, MULT=1, ALIGN=8, PADDED=True, EVEN_C=False, HAS_BIAS=True, HAS_RES=True, PRE=6, POST=1,
    BLOCK_P=64, BLOCK_C=64, sxc=1, src=1, syc=1,
)
pointers = ("x", "w", "bias", "res", "y")
floats = ("pre0", "pre1", "post0", "post1")
signature = {
    n: "constexpr" if n in constants else "*fp16" if n in pointers else "fp32" if n in floats else "i32"
    for n in fn.arg_names
}
attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers}
kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32))
ptx = kernel.asm["ptx"]
print("load16", len(re.findall(r"ld\\.global[^;]*\\.v4\\.b32", ptx)))
print("load2", len(re.findall(r"ld\\.global[^;]*\\.b16 ", ptx)))
print("store16", len(re.findall(r"st\\.global[^;]*\\.v4\\.b32", ptx)))
"""


def test_the_kernel_compiles_for_hopper_with_16_byte_channel_loads():
    """Through Triton's real compiler for sm_90 (no GPU needed; the interpreter never compiles): with channel
    counts that are multiples of 8 (ALIGN, e.g. MobileNet's 72 or 120), fp16 activations, taps, residual and
    output move in 16-byte vectors, never element by element."""
    counts = {name: int(count) for name, count in compile_for_hopper(_COMPILE_FOR_HOPPER)}
    assert counts["load16"] > 0 and counts["store16"] > 0 and counts["load2"] == 0, counts


# -- on the GPU: the depthwise layers of MobileNetV3, EfficientNet-B0 and ConvNeXt --------------------------

# (input shape, kernel size, stride)
REAL_LAYERS = {
    "mnv3-3x3-s1-c96-56": ((8, 96, 56, 56), 3, 1),
    "mnv3-3x3-s2-c64-112": ((8, 64, 112, 112), 3, 2),
    "mnv3-5x5-s2-c72-56": ((8, 72, 56, 56), 5, 2),
    "mnv3-5x5-s1-c240-14": ((8, 240, 14, 14), 5, 1),
    "mnv3-5x5-s1-c960-7-batch1": ((1, 960, 7, 7), 5, 1),
    "effnet-3x3-s1-c32-112": ((8, 32, 112, 112), 3, 1),
    "effnet-5x5-s2-c240-28": ((8, 240, 28, 28), 5, 2),
    "effnet-3x3-s1-c480-14": ((8, 480, 14, 14), 3, 1),
    "effnet-5x5-s1-c1152-7-batch1": ((1, 1152, 7, 7), 5, 1),
    "effnet-3x3-s1-c200-14-uneven": ((4, 200, 14, 14), 3, 1),
    "convnext-7x7-c96-56": ((8, 96, 56, 56), 7, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", list(REAL_LAYERS))
def test_real_layers_on_cuda(dtype, name):
    torch.manual_seed(4)
    shape, k, stride = REAL_LAYERS[name]
    pad = k // 2
    geometry = (shape, 1, k, {"pads": [pad] * 4, "strides": [stride, stride]})
    x, w, b, z, attrs, geometry_args = _layer("cuda", dtype, geometry, (True, False, "HardSwish", [], "", []))
    want = _reference(x, w, b, z, attrs)
    for config in depthwise_configs(0):
        out = _poisoned(want.shape, dtype, "cuda")
        got = _run(x, w, b, z, attrs, geometry_args, config, out=out)
        assert _normwise_error(got, want) <= TOLERANCE[dtype], config


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_config_with_the_full_epilogue_on_cuda(dtype):
    torch.manual_seed(5)
    geometry = ((4, 120, 28, 28), 1, 5, {"pads": [2, 2, 2, 2]})
    x, w, b, z, attrs, geometry_args = _layer("cuda", dtype, geometry, FULL_EPILOGUE)
    want = _reference(x, w, b, z, attrs)
    for config in depthwise_configs(2):
        got = _run(x, w, b, z, attrs, geometry_args, config, out=_poisoned(want.shape, dtype, "cuda"))
        assert _normwise_error(got, want) <= TOLERANCE[dtype], config
