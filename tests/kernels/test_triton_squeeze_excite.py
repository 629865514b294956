"""The Triton squeeze-and-excitation kernel against the registry's SqueezeExcite evaluated in float64: under
Triton's interpreter on the CPU with tiny shapes, and on the GPU with the blocks of EfficientNet-B0 and
MobileNetV3-Large."""

from __future__ import annotations

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.kernels.triton.squeeze_excite import (
    fit_tile,
    scale_split_count,
    squeeze_excite,
    squeeze_excite_configs,
)
from tensorforge.ops import load_all
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.registry import REGISTRY, OpContext
from tests.helpers import DEVICES, compile_for_hopper

# Normwise relative error (max|got - want| / max|want|) against float64 on the same rounded inputs: everything is
# float32 until Y is rounded once, so what is left is that rounding (unit roundoff 2^-11 fp16, 2^-8 bf16; Triton's
# interpreter truncates to bfloat16, at most 2^-7).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Channel blocks of 4 over 10 channels (the last one ragged), hidden units in blocks of 2 over 3, pixel blocks of 8.
TINY = {"block_p": 8, "block_c": 4, "block_r": 2, "num_warps": 1}
# (act1, act1_params, act2, act2_params): EfficientNet's (SiLU, Sigmoid), MobileNetV3's (ReLU, HardSigmoid as
# torch exports it, 1/6 and 1/2), ONNX's default HardSigmoid, and a block without activations.
ACTIVATIONS = {
    "relu-sigmoid": ("Relu", [], "Sigmoid", []),
    "relu-hardsigmoid": ("Relu", [], "HardSigmoid", [1 / 6, 0.5]),
    "silu-sigmoid": ("SiLU", [], "Sigmoid", []),
    "silu-hardsigmoid": ("SiLU", [], "HardSigmoid", [1 / 6, 0.5]),
    "relu-hardsigmoid-onnx-defaults": ("Relu", [], "HardSigmoid", []),
    "linear": ("", [], "", []),
}


def _reference(x, w1, b1, w2, b2, attributes) -> torch.Tensor:
    """The registry's SqueezeExcite in float64 on the same (already rounded) operands."""
    load_all()
    names = ("x", "w1", "b1", "w2", "b2")
    node = Node("SqueezeExcite", [Value(n) for n in names], [Value("y")], attributes, domain=DOMAIN)
    ctx = OpContext(node=node, opset=1, device=x.device)
    wide = [t.double() if t is not None else None for t in (x, w1, b1, w2, b2)]
    return REGISTRY.lookup("SqueezeExcite", DOMAIN, 1).impl(ctx, *wide, **attributes)


def _block(device, dtype, shape=(2, 10, 5, 7), hidden=3, activations="silu-hardsigmoid", layout="NHWC", bias=True):
    """Random operands of one block (weights scaled so that the gate is not saturated) and its attributes."""
    n, c, h, w = shape
    x = torch.randn(shape, device=device)
    x = (x.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else x).to(dtype)
    w1 = (torch.randn(hidden, c, 1, 1, device=device) * 2 / c**0.5).to(dtype)
    w2 = (torch.randn(c, hidden, 1, 1, device=device) * 2 / hidden**0.5).to(dtype)
    b1 = torch.randn(hidden, device=device).to(dtype) if bias else None
    b2 = torch.randn(c, device=device).to(dtype) if bias else None
    act1, params1, act2, params2 = ACTIVATIONS[activations]
    attributes = {"act1": act1, "act1_params": params1, "act2": act2, "act2_params": params2}
    return x, w1, b1, w2, b2, attributes


def _run(x, w1, b1, w2, b2, attributes, **options):
    act1 = activation_args(attributes["act1"], attributes["act1_params"])
    act2 = activation_args(attributes["act2"], attributes["act2_params"])
    return squeeze_excite(x, w1, b1, w2, b2, act1=act1, act2=act2, **options)


def _poisoned_like(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, float("nan"))  # same shape, dtype and strides


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("activations", list(ACTIVATIONS))
def test_every_activation_pair_matches_the_reference(device, dtype, layout, activations):
    """Into a NaN-poisoned buffer of x's layout, pixels in three ranges for the reduction and two for the product."""
    torch.manual_seed(0)
    x, w1, b1, w2, b2, attributes = _block(device, dtype, activations=activations, layout=layout)
    want = _reference(x, w1, b1, w2, b2, attributes)
    out = _poisoned_like(x)
    got = _run(x, w1, b1, w2, b2, attributes, out=out, config=TINY, splits=3, scale_splits=2)
    assert got is out
    assert not got.isnan().any()
    assert _error(got, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "config",
    [
        TINY,
        {"block_p": 4, "block_c": 16, "block_r": 4, "num_warps": 2},  # a channel block wider than the layer
        {"block_p": 64, "block_c": 2, "block_r": 1, "num_warps": 1},  # one pixel block holds every pixel
    ],
)
@pytest.mark.parametrize("splits", [1, 4, "auto"])
def test_tiles_and_pixel_ranges(device, layout, config, splits):
    torch.manual_seed(1)
    x, w1, b1, w2, b2, attributes = _block(device, torch.float32, shape=(3, 10, 6, 5), hidden=5, layout=layout)
    want = _reference(x, w1, b1, w2, b2, attributes)
    got = _run(x, w1, b1, w2, b2, attributes, config=config, splits=splits, scale_splits=splits)
    assert got.is_contiguous(memory_format=torch.channels_last if layout == "NHWC" else torch.contiguous_format)
    assert _error(got, want) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_without_biases_and_with_two_dimensional_weights(device, dtype):
    torch.manual_seed(2)
    x, w1, _, w2, _, attributes = _block(device, dtype, activations="relu-sigmoid", bias=False)
    want = _reference(x, w1, None, w2, None, attributes)
    got = _run(x, w1[:, :, 0, 0], None, w2[:, :, 0, 0], None, attributes, config=TINY)
    assert _error(got, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_float32_weights_with_half_activations(device):
    """Weights and biases of another float type than x are read as they are."""
    torch.manual_seed(3)
    x, w1, b1, w2, b2, attributes = _block(device, torch.float32)
    half = x.half()
    want = _reference(half, w1, b1, w2, b2, attributes)
    got = _run(half, w1, b1, w2, b2, attributes, config=TINY)
    assert got.dtype == torch.float16
    assert _error(got, want) <= TOLERANCE[torch.float16]


@pytest.mark.parametrize("device", DEVICES)
def test_a_window_of_a_larger_tensor_into_a_channel_slice(device):
    """H and W that do not merge (a crop), written through the strides of a channel slice of a larger
    channels_last buffer, whose other channels stay untouched."""
    torch.manual_seed(4)
    big, w1, b1, w2, b2, attributes = _block(device, torch.float16, shape=(2, 10, 9, 11))
    x = big[:, :, 1:7, 2:9]
    want = _reference(x, w1, b1, w2, b2, attributes)
    buffer = torch.full((2, 16, 6, 7), float("nan"), dtype=torch.float16, device=device)
    buffer = buffer.contiguous(memory_format=torch.channels_last)
    view = buffer[:, 3:13]
    got = _run(x, w1, b1, w2, b2, attributes, out=view, config=TINY, splits=2)
    assert _error(got, want) <= TOLERANCE[torch.float16]
    assert buffer[:, :3].isnan().all() and buffer[:, 13:].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
def test_in_place(device):
    """`out` may be x: the reduction has read all of x before the product overwrites it, element by element."""
    torch.manual_seed(5)
    x, w1, b1, w2, b2, attributes = _block(device, torch.float32, layout="NCHW")
    want = _reference(x, w1, b1, w2, b2, attributes)
    got = _run(x, w1, b1, w2, b2, attributes, out=x, config=TINY, splits=2, scale_splits=3)
    assert got is x
    assert _error(got, want) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_a_nan_gates_its_whole_image_as_the_reference_does(device):
    torch.manual_seed(6)
    x, w1, b1, w2, b2, attributes = _block(device, torch.float32, activations="relu-sigmoid")
    x[1, 4, 2, 3] = float("nan")
    want = _reference(x, w1, b1, w2, b2, attributes)
    got = _run(x, w1, b1, w2, b2, attributes, config=TINY, splits=2)
    assert want[1].isnan().all() and not want[0].isnan().any()
    assert torch.equal(got.isnan(), want.isnan())
    assert _error(got[0], want[0]) <= TOLERANCE[torch.float32]


def test_empty_tensors_return_at_once():
    w1, w2 = torch.randn(3, 4, 1, 1), torch.randn(4, 3, 1, 1)
    for shape in ((0, 4, 5, 5), (2, 4, 0, 5)):
        y = squeeze_excite(torch.randn(shape), w1, None, w2)
        assert y.shape == shape


def test_configs_grow_by_effort_and_fit_small_layers():
    assert [len(squeeze_excite_configs(e)) for e in (0, 1, 2)] == [3, 7, 11]
    assert all(set(c) == {"block_p", "block_c", "block_r", "num_warps"} for c in squeeze_excite_configs(2))
    # 128-wide channel blocks on 24 channels become 32 wide with 4× the pixels; 32 hidden units on 6 become 8
    assert fit_tile({"block_p": 16, "block_c": 128, "block_r": 32, "num_warps": 4}, 24, 6) == (64, 32, 8, 4)
    assert fit_tile({"block_p": 16, "block_c": 64, "block_r": 16, "num_warps": 4}, 1152, 48) == (16, 64, 16, 4)
    with pytest.raises(ValueError, match="unknown squeeze_excite config keys"):
        fit_tile({"block_m": 16}, 8, 2)
    with pytest.raises(ValueError, match="powers of two"):
        fit_tile({"block_r": 12}, 8, 2)


def test_scale_split_count():
    # batch 1, EfficientNet's first block (32 channels: one channel block, 112×112): ranges of two pixel blocks
    assert scale_split_count(programs=1, pixels=112 * 112, block_p=32, slots=132) == 112 * 112 // 64
    assert scale_split_count(programs=2, pixels=112 * 112, block_p=16, slots=132) == 4 * 132 // 2  # 4 waves
    assert scale_split_count(programs=18, pixels=49, block_p=32, slots=132) == 1  # 7×7: one range
    assert scale_split_count(programs=64 * 18, pixels=49, block_p=32, slots=132) == 1  # batch 64 fills the GPU


def test_bad_operands_are_refused_with_the_reason():
    x = torch.randn(1, 4, 5, 5)
    w1, w2 = torch.randn(3, 4, 1, 1), torch.randn(4, 3, 1, 1)
    with pytest.raises(ValueError, match="4-D float16/bfloat16/float32"):
        squeeze_excite(x.double(), w1, None, w2)
    with pytest.raises(ValueError, match=r"w1 must be a float \[3, 4\]"):
        squeeze_excite(x, torch.randn(3, 4, 3, 3), None, w2)
    with pytest.raises(ValueError, match=r"w2 must be a float \[4, 3\]"):
        squeeze_excite(x, w1, None, torch.randn(3, 4, 1, 1))
    with pytest.raises(ValueError, match="both be 2-D or both 4-D"):
        squeeze_excite(x, w1, None, w2[:, :, 0, 0])
    with pytest.raises(ValueError, match=r"b1 must have shape \[3\]"):
        squeeze_excite(x, w1, torch.randn(4), w2)
    with pytest.raises(ValueError, match=r"b2 must have shape \[4\]"):
        squeeze_excite(x, w1, None, w2, torch.randn(3))
    with pytest.raises(ValueError, match="out is"):
        squeeze_excite(x, w1, None, w2, out=torch.empty(1, 4, 5, 5, dtype=torch.float16))
    with pytest.raises(ValueError, match="splits must be"):
        squeeze_excite(x, w1, None, w2, splits=0)


_COMPILE_FOR_HOPPER = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tensorforge.kernels.triton import squeeze_excite as se

FLOATS = ("act1_p0", "act1_p1", "act2_p0", "act2_p1")


def compile(name, fn, constants, divisible=()):
    pointers = [n for n in ("x", "w1", "w2", "b1", "b2", "partial", "y") if n in fn.arg_names]
    signature = {
        n: "constexpr" if n in constants else "*fp32" if n == "partial" else "*fp16" if n in pointers
        else "fp32" if n in FLOATS else "i32"
        for n in fn.arg_names
    }
    named = [n for n in (*pointers, *divisible) if n in fn.arg_names]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in named}
    ptx = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    loads = len(re.findall(r"ld\\.global[^;]*\\.v4\\.b32", ptx))
    stores = len(re.findall(r"st\\.global[^;]*\\.v4\\.b32", ptx))
    print(name, loads, stores)


excite = dict(ACT1=7, ACT2=5, HAS_B1=True, HAS_B2=True, BLOCK_K=16)
# channels_last with C a multiple of 8 (ALIGN 8): channels contiguous
nhwc = dict(ALIGN=8, FLAT=True, sxc=1, BLOCK_P=32, BLOCK_C=64, BLOCK_R=32)
compile("squeeze", se._squeeze, nhwc)
compile("excite", se._excite, dict(excite, syc=1, **nhwc))
# NCHW with H·W a multiple of 16 (56×56): pixels contiguous
nchw = dict(ALIGN=1, FLAT=True, sxw=1, BLOCK_P=128, BLOCK_C=16, BLOCK_R=32)
divisible = ("HW", "pixels_per_split", "sxn", "sxc", "syn", "syc")
compile("squeeze_nchw", se._squeeze, nchw, divisible)
compile("excite_nchw", se._excite, dict(excite, syw=1, **nchw), divisible)
# the smallest blocks a layer can fit (one hidden unit, one channel), H and W apart
tiny = dict(ALIGN=1, FLAT=False, BLOCK_P=8, BLOCK_C=1, BLOCK_R=1)
compile("squeeze_tiny", se._squeeze, tiny)
compile("excite_tiny", se._excite, dict(excite, HAS_B1=False, HAS_B2=False, **tiny))
"""


def _compile_for_hopper() -> dict[str, tuple[int, int]]:
    return {name: (int(loads), int(stores)) for name, loads, stores in compile_for_hopper(_COMPILE_FOR_HOPPER)}


def test_the_kernels_compile_for_hopper_with_16_byte_accesses():
    """Through Triton's real compiler for sm_90 (no GPU needed; the interpreter never compiles): on channels_last
    fp16 with a channel count that is a multiple of 8 (EfficientNet's 144 or 240, MobileNetV3's 72 or 120), and on
    NCHW maps whose pixel count is a multiple of 16, the reduction loads and the product loads and stores 16-byte
    vectors; the smallest tiles compile too."""
    counts = _compile_for_hopper()
    for name in ("squeeze", "squeeze_nchw"):
        assert counts[name][0] > 0, counts
    for name in ("excite", "excite_nchw"):
        assert counts[name][0] > 0 and counts[name][1] > 0, counts
    assert "squeeze_tiny" in counts and "excite_tiny" in counts  # they compile


# -- on the GPU: the squeeze-and-excitation blocks of EfficientNet-B0 and MobileNetV3-Large at 224×224 --------

# (channels, hidden units, map size, activations)
REAL_BLOCKS = {
    "effnet-32-112": (32, 8, 112, "silu-sigmoid"),
    "effnet-96-56": (96, 4, 56, "silu-sigmoid"),
    "effnet-144-28": (144, 6, 28, "silu-sigmoid"),
    "effnet-240-14": (240, 10, 14, "silu-sigmoid"),
    "effnet-672-14": (672, 28, 14, "silu-sigmoid"),
    "effnet-1152-7": (1152, 48, 7, "silu-sigmoid"),
    "mnv3-72-28": (72, 24, 28, "relu-hardsigmoid"),
    "mnv3-120-28": (120, 32, 28, "relu-hardsigmoid"),
    "mnv3-480-14": (480, 120, 14, "relu-hardsigmoid"),
    "mnv3-960-7": (960, 240, 7, "relu-hardsigmoid"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("name", list(REAL_BLOCKS))
def test_real_blocks_every_config_in_fp16_on_cuda(batch, layout, name):
    torch.manual_seed(7)
    channels, hidden, size, activations = REAL_BLOCKS[name]
    shape = (batch, channels, size, size)
    x, w1, b1, w2, b2, attributes = _block("cuda", torch.float16, shape, hidden, activations, layout)
    want = _reference(x, w1, b1, w2, b2, attributes)
    for config in squeeze_excite_configs(2):
        got = _run(x, w1, b1, w2, b2, attributes, out=_poisoned_like(x), config=config)
        assert _error(got, want) <= TOLERANCE[torch.float16], config


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["effnet-32-112", "effnet-1152-7", "mnv3-960-7"])
def test_real_blocks_in_bf16_and_fp32_on_cuda(dtype, name):
    torch.manual_seed(8)
    channels, hidden, size, activations = REAL_BLOCKS[name]
    x, w1, b1, w2, b2, attributes = _block("cuda", dtype, (2, channels, size, size), hidden, activations)
    want = _reference(x, w1, b1, w2, b2, attributes)
    for config in squeeze_excite_configs(0):
        got = _run(x, w1, b1, w2, b2, attributes, out=_poisoned_like(x), config=config)
        assert _error(got, want) <= TOLERANCE[dtype], config
