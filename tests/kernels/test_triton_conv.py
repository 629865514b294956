"""The Triton implicit-GEMM convolution against the reference FusedConv (evaluated in float64), under Triton's
interpreter on the CPU with tiny shapes and on the GPU with ResNet-sized ones."""

from __future__ import annotations

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.kernels.triton.conv import ConvConfig, conv2d_nhwc, conv_configs, pack_weight, split_k_for
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.ops import load_all
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.pool import window_geometry
from tensorforge.ops.registry import REGISTRY, OpContext
from tests.helpers import DEVICES, compile_for_hopper

# Normwise relative error (max|got - want| / max|want|) against the float64 reference, by how the kernel multiplies.
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 3e-2}
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TINY = {"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 2, "num_warps": 1, "num_stages": 1, "split_k": 1}

# (input shape, output channels, FusedConv attributes): every geometry the kernel distinguishes. With 16-wide K
# blocks, 16 channels per group walk the K loop tap by tap, 3 to 8 walk the flattened K ("dense" order).
GEOMETRIES = {
    "1x1": ((2, 8, 5, 5), 16, {}),
    "1x1-stride2": ((1, 16, 7, 7), 8, {"strides": [2, 2]}),
    "3x3": ((2, 16, 6, 6), 8, {"pads": [1, 1, 1, 1]}),
    "3x3-stride2": ((1, 16, 9, 9), 16, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "3x3-uneven-channels": ((1, 12, 5, 6), 20, {"pads": [1, 1, 1, 1]}),
    "7x7-stride2-stem": ((1, 3, 9, 9), 8, {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    "asymmetric-pads": ((1, 4, 7, 6), 8, {"pads": [0, 1, 2, 0]}),
    "dilation2": ((1, 16, 9, 9), 8, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "same-upper": ((1, 4, 8, 8), 8, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "2x2-patchify": ((1, 4, 8, 8), 8, {"strides": [2, 2]}),
    "groups2": ((1, 8, 6, 6), 8, {"pads": [1, 1, 1, 1], "group": 2}),
    "groups2-wide": ((1, 32, 5, 5), 16, {"pads": [1, 1, 1, 1], "group": 2}),
    "groups4-stride2": ((2, 16, 5, 5), 16, {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 4}),
}
KERNELS = {"1x1": 1, "1x1-stride2": 1, "2x2-patchify": 2, "7x7-stride2-stem": 7}
# (bias, residual, pre, pre_params, post, post_params)
EPILOGUES = {
    "plain": (False, False, "", [], "", []),
    "bias-relu": (True, False, "Relu", [], "", []),
    "resnet-add-relu": (True, True, "", [], "Relu", []),
    "leaky": (True, False, "LeakyRelu", [0.2], "", []),
    "hardswish-add-clip": (True, True, "HardSwish", [], "Clip", [-1.0, 2.0]),
    "silu-add-sigmoid": (False, True, "SiLU", [], "Sigmoid", []),
}
FULL_EPILOGUE = EPILOGUES["hardswish-add-clip"]


def _reference(x, w, b, z, attributes) -> torch.Tensor:
    """The registry's FusedConv in float64 on the same (already rounded) inputs."""
    load_all()
    node = Node("FusedConv", [Value("x"), Value("w"), Value("b"), Value("z")], [Value("y")], attributes, domain=DOMAIN)
    ctx = OpContext(node=node, opset=1, device=x.device)
    wide = [t.double() if t is not None else None for t in (x, w, b, z)]
    return REGISTRY.lookup("FusedConv", DOMAIN, 1).impl(ctx, *wide, **attributes)


def _layer(device, dtype, shape, cout, attributes, epilogue, kernel_size=3):
    """Random operands (channels_last) and FusedConv attributes for one case."""
    has_bias, has_residual, pre, pre_params, post, post_params = epilogue
    group = attributes.get("group", 1)
    x = torch.randn(shape, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(cout, shape[1] // group, kernel_size, kernel_size, device=device) / 3).to(dtype)
    b = torch.randn(cout, device=device).to(dtype) if has_bias else None
    attrs = {**attributes, "pre": pre, "pre_params": pre_params, "post": post, "post_params": post_params}
    begin, _, out_hw = _geometry(shape, w.shape, attrs)
    z = None
    if has_residual:
        z = torch.randn(shape[0], cout, *out_hw, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    return x, w, b, z, attrs


def _geometry(shape, weight_shape, attrs):
    return window_geometry(
        shape[2:], weight_shape[2:], attrs.get("strides"), attrs.get("dilations"), attrs.get("pads"),
        attrs.get("auto_pad", "NOTSET"),
    )  # fmt: skip


def _run(x, w, b, z, attrs, *, config, tf32=False, out=None) -> torch.Tensor:
    begin, _, out_hw = _geometry(x.shape, w.shape, attrs)
    pre = activation_args(attrs["pre"], attrs["pre_params"])
    post = activation_args(attrs["post"], attrs["post_params"])
    return conv2d_nhwc(
        x, pack_weight(w, attrs.get("group", 1)), b, z,
        out_hw=out_hw, strides=attrs.get("strides", [1, 1]), pads_begin=begin, dilations=attrs.get("dilations", [1, 1]),
        pre=pre, post=post, tf32=tf32, out=out, config=config,
    )  # fmt: skip


def _poisoned(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(like.shape, float("nan"), dtype=dtype, device=like.device).contiguous(
        memory_format=torch.channels_last
    )


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any(), "the kernel left output elements unwritten (NaN poison) or made NaNs"
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _check_case(device, precision, geometry, epilogue, config):
    shape, cout, attributes = GEOMETRIES[geometry]
    dtype = DTYPES[precision]
    x, w, b, z, attrs = _layer(device, dtype, shape, cout, attributes, epilogue, KERNELS.get(geometry, 3))
    want = _reference(x, w, b, z, attrs)
    out = _poisoned(want, dtype)
    got = _run(x, w, b, z, attrs, config=config, tf32=precision == "tf32", out=out)
    assert got is out and got.is_contiguous(memory_format=torch.channels_last)
    assert _error(got, want) <= TOLERANCE[precision]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_every_geometry_matches_the_reference(device, precision, geometry):
    torch.manual_seed(1)
    _check_case(device, precision, geometry, FULL_EPILOGUE, TINY)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_every_epilogue_matches_the_reference(device, precision, epilogue):
    torch.manual_seed(2)
    _check_case(device, precision, "3x3-stride2", EPILOGUES[epilogue], TINY)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("geometry", "splits"), [("3x3", 2), ("3x3-uneven-channels", 3), ("7x7-stride2-stem", 2)])
def test_split_k_applies_the_epilogue_once(device, geometry, splits):
    torch.manual_seed(3)
    _check_case(device, "fp32", geometry, FULL_EPILOGUE, {**TINY, "split_k": splits})


@pytest.mark.parametrize("device", DEVICES)
def test_swizzled_tiles_cover_the_output(device):
    """Several row and column tiles in GROUP_M bands, the last of each partial."""
    torch.manual_seed(4)
    x, w, b, z, attrs = _layer(device, torch.float32, (2, 8, 5, 5), 40, {"pads": [1, 1, 1, 1]}, FULL_EPILOGUE)
    want = _reference(x, w, b, z, attrs)
    config = {**TINY, "block_m": 16, "block_n": 16, "group_m": 2}
    assert _error(_run(x, w, b, z, attrs, config=config), want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize("device", DEVICES)
def test_any_input_and_output_strides(device):
    """An NCHW input, a broadcast residual, and an output that is a channel slice of a larger channels_last
    buffer (as a concatenation binds it): the slice is written, its neighbours are not."""
    torch.manual_seed(5)
    x, w, b, _, attrs = _layer(device, torch.float32, (2, 8, 6, 6), 8, {"pads": [1, 1, 1, 1]}, FULL_EPILOGUE)
    z = torch.randn(1, 8, 1, 6, device=device)
    want = _reference(x, w, b, z, attrs)
    buffer = _poisoned(torch.empty(2, 20, 6, 6, device=device), torch.float32)
    out = buffer[:, 4:12]
    got = _run(x.contiguous(), w, b, z, attrs, config=TINY, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert _error(got, want) <= TOLERANCE["fp32"]
    assert buffer[:, :4].isnan().all() and buffer[:, 12:].isnan().all()


def test_allocated_output_is_channels_last():
    torch.manual_seed(6)
    x, w, b, z, attrs = _layer("cpu", torch.float32, (1, 8, 5, 5), 8, {"pads": [1, 1, 1, 1]}, EPILOGUES["plain"])
    y = _run(x, w, b, z, attrs, config=TINY)
    assert y.shape == (1, 8, 5, 5) and y.is_contiguous(memory_format=torch.channels_last)
    assert _error(y, _reference(x, w, b, z, attrs)) <= TOLERANCE["fp32"]


def test_pack_weight_layout():
    w = torch.randn(12, 2, 3, 5)
    packed = pack_weight(w, groups=3)
    assert packed.shape == (3, 3, 5, 2, 4) and packed.is_contiguous()
    for g, kh, kw, c, n in [(0, 0, 0, 0, 0), (2, 1, 4, 1, 3), (1, 2, 3, 0, 2)]:
        assert packed[g, kh, kw, c, n] == w[g * 4 + n, c, kh, kw]
    with pytest.raises(ValueError, match="do not split into 5 groups"):
        pack_weight(w, groups=5)


def test_pack_weight_k_major_layout():
    """The same (G, KH, KW, Cin/G, Cout/G) tensor stored K innermost; the kernel reads either."""
    torch.manual_seed(10)
    w = torch.randn(12, 2, 3, 5)
    packed = pack_weight(w, groups=3, k_major=True)
    assert torch.equal(packed, pack_weight(w, groups=3)) and packed.stride() == (120, 10, 2, 1, 30)
    x, w, b, z, attrs = _layer("cpu", torch.float32, (1, 8, 5, 5), 8, {"pads": [1, 1, 1, 1]}, FULL_EPILOGUE)
    begin, _, out_hw = _geometry(x.shape, w.shape, attrs)
    common = {"out_hw": out_hw, "pads_begin": begin, "pre": activation_args("HardSwish"), "config": TINY}
    got = conv2d_nhwc(x, pack_weight(w, 1, k_major=True), b, z, post=activation_args("Clip", [-1.0, 2.0]), **common)
    assert _error(got, _reference(x, w, b, z, attrs)) <= TOLERANCE["fp32"]


def test_bad_operands_are_named():
    x = torch.randn(1, 8, 5, 5)
    packed = pack_weight(torch.randn(8, 8, 3, 3), 1)
    common = {"out_hw": (3, 3), "config": TINY}
    with pytest.raises(ValueError, match="x has 4 channels"):
        conv2d_nhwc(torch.randn(1, 4, 5, 5), packed, **common)
    with pytest.raises(ValueError, match="pack_weight"):
        conv2d_nhwc(x, torch.randn(8, 8, 3, 3), **common)
    with pytest.raises(ValueError, match="contiguous or k_major"):
        conv2d_nhwc(x, packed.transpose(3, 4), **common)
    with pytest.raises(ValueError, match="bias must have shape"):
        conv2d_nhwc(x, packed, torch.randn(4), **common)
    with pytest.raises(ValueError, match="does not broadcast"):
        conv2d_nhwc(x, packed, None, torch.randn(1, 8, 2, 2), **common)
    with pytest.raises(ValueError, match="out is"):
        conv2d_nhwc(x, packed, out=torch.empty(1, 8, 5, 5), **common)
    with pytest.raises(ValueError, match="unknown conv config keys"):
        conv2d_nhwc(x, packed, out_hw=(3, 3), config={"block": 16})
    with pytest.raises(ValueError, match="powers of two"):
        conv2d_nhwc(x, packed, out_hw=(3, 3), config={"block_k": 8})
    with pytest.raises(ValueError, match="promote: True or False"):
        conv2d_nhwc(x, packed, out_hw=(3, 3), config={"promote": "no"})


def test_configs_by_effort():
    sizes = [len(conv_configs(effort)) for effort in (0, 1, 2)]
    assert sizes == [4, 11, 24]
    wide = conv_configs(2)
    assert all(ConvConfig.of(c) for c in wide)
    assert len({tuple(sorted(c.items())) for c in wide}) == len(wide), "a config is listed twice"


def test_split_k_only_when_the_tiles_leave_the_device_idle():
    assert split_k_for(tiles=200, k_tiles=72, slots=132) == 1
    assert split_k_for(tiles=8, k_tiles=72, slots=132) == 16  # batch 1, 3x3x512: capped
    assert split_k_for(tiles=8, k_tiles=12, slots=132) == 3  # at least 4 K tiles per split
    assert split_k_for(tiles=40, k_tiles=200, slots=132) == 4


# -- GPU: bf16 and tf32, and the shapes of real networks --------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "tf32"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_bf16_and_tf32_on_the_gpu(precision, geometry):
    torch.manual_seed(7)
    _check_case("cuda", precision, geometry, FULL_EPILOGUE, TINY)


# (input shape, output channels, kernel size, attributes): ResNet-50 / ResNeXt layers.
NETWORK_SHAPES = {
    "resnet-3x3-64": ((8, 64, 56, 56), 64, 3, {"pads": [1, 1, 1, 1]}),
    "resnet-1x1-256-64": ((8, 256, 56, 56), 64, 1, {}),
    "resnet-1x1-512-2048": ((8, 512, 7, 7), 2048, 1, {}),
    "resnet-downsample": ((8, 256, 56, 56), 512, 1, {"strides": [2, 2]}),
    "resnet-stem": ((8, 3, 224, 224), 64, 7, {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    "resnet-3x3-512-batch1": ((1, 512, 7, 7), 512, 3, {"pads": [1, 1, 1, 1]}),
    "resnext-3x3-g32": ((4, 256, 28, 28), 256, 3, {"pads": [1, 1, 1, 1], "group": 32}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32", "fp32"])
@pytest.mark.parametrize("layer", sorted(NETWORK_SHAPES))
def test_network_shapes_on_the_gpu(precision, layer):
    torch.manual_seed(8)
    shape, cout, kernel_size, attributes = NETWORK_SHAPES[layer]
    dtype = DTYPES[precision]
    x, w, b, z, attrs = _layer("cuda", dtype, shape, cout, attributes, EPILOGUES["resnet-add-relu"], kernel_size)
    want = _reference(x, w, b, z, attrs)
    for config in conv_configs(0):
        out = _poisoned(want, dtype)
        got = _run(x, w, b, z, attrs, config=config, tf32=precision == "tf32", out=out)
        assert _error(got, want) <= TOLERANCE[precision], config


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_every_config_compiles_and_is_correct_on_the_gpu(precision):
    torch.manual_seed(9)
    shape, cout, kernel_size, attributes = NETWORK_SHAPES["resnet-3x3-64"]
    dtype = DTYPES[precision]
    x, w, b, z, attrs = _layer("cuda", dtype, shape, cout, attributes, EPILOGUES["resnet-add-relu"], kernel_size)
    want = _reference(x, w, b, z, attrs)
    for config in conv_configs(2):
        got = _run(x, w, b, z, attrs, config=config, out=_poisoned(want, dtype))
        assert _error(got, want) <= TOLERANCE[precision], config


_COMPILE_FOR_HOPPER = """
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tensorforge.kernels.triton.conv import _conv2d_igemm as fn
constants = dict(
    KH=3, KW=3, DENSE_K=False, EVEN_K=False, PADDED=True, HAS_BIAS=True, HAS_RES=True, PRE=0, POST=1, SPLIT=False,
    DOT_PRECISION="ieee", QUANT=0, QUANTIZE_X=False, QUANT_Y=0, PROMOTE=True, W_K_MAJOR=False, ALIGN=8, BLOCK_M=128,
    BLOCK_N=128, BLOCK_K=64, GROUP_M=8, sxc=1, src=1, syc=1,
)
pointers = ("x", "w", "bias", "res", "y", "partial", "w_scale")
floats = ("pre0", "pre1", "post0", "post1", "x_scale", "x_inv_scale", "y_inv_scale", "z_scale")
signature = {
    n: "constexpr" if n in constants else "*fp16" if n in pointers else "fp32" if n in floats else "i32"
    for n in fn.arg_names
}
attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers}
source = ASTSource(fn, signature, constants, attrs)
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
ptx = kernel.asm["ptx"]
print("wgmma", ptx.count("wgmma.mma_async"))
print("cp.async16", len(re.findall(r"cp\\.async\\.c[ag]\\.shared\\.global[^;]*0x10", ptx)))
"""


def test_the_kernel_compiles_for_hopper_with_tensor_cores_and_pipelined_vector_loads():
    """Through Triton's real compiler for sm_90 (no GPU needed; the interpreter never compiles): channel counts
    that are multiples of 8 (ALIGN) give 16-byte asynchronous loads, and the products run on wgmma."""
    counts = dict(compile_for_hopper(_COMPILE_FOR_HOPPER))
    assert int(counts["wgmma"]) > 0 and int(counts["cp.async16"]) > 0, counts
