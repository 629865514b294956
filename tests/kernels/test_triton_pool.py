"""The Triton max, average and global average pools against the reference ops, on the GPU and under Triton's
interpreter on the CPU."""

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.kernels.triton.pool import (
    avg_pool2d,
    global_avg_pool,
    global_pool_configs,
    global_split_count,
    max_pool2d,
    pool_configs,
)
from tensorforge.ops import load_all
from tensorforge.ops.pool import window_geometry
from tensorforge.ops.registry import REGISTRY, OpContext
from tests.helpers import DEVICES, compile_for_hopper

CASES = [
    ((2, 5, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 70, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((2, 3, 10, 7), {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((1, 4, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
]


def _reference(x, attributes, op="MaxPool", opset=17):
    load_all()
    node = Node(op, [Value("x")], [Value("y")], attributes)
    ctx = OpContext(node=node, opset=opset, device=x.device)
    result = REGISTRY.lookup(op, "", opset).impl(ctx, x, **attributes)
    return result[0] if isinstance(result, tuple) else result


def _geometry(shape, attributes):
    """(kernel, strides, dilations, pads_begin, pads_end, out) of a pooling node on `shape`."""
    kernel = attributes["kernel_shape"]
    strides = attributes.get("strides", [1, 1])
    dilations = attributes.get("dilations", [1, 1])
    begin, end, out = window_geometry(
        shape[2:], kernel, strides, dilations, attributes.get("pads"), attributes.get("auto_pad", "NOTSET"),
        attributes.get("ceil_mode", 0), same_crops=True,
    )  # fmt: skip
    return kernel, strides, dilations, begin, end, out


def _input(shape, dtype, device, channels_last):
    x = torch.randn(shape, device=device).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _poisoned(shape, dtype, device, channels_last):
    out = torch.full(shape, float("nan"), dtype=dtype, device=device)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out


def _assert_tight(got, want):
    """An average or mean, summed in float32 in another order than the reference: equal up to float32 rounding
    of the sum, which in float16 output moves a result by at most one unit in the last place."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:
        eps = torch.finfo(got.dtype).eps
        torch.testing.assert_close(got.float(), want.float(), rtol=eps, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("shape", "attributes"), CASES)
def test_triton_max_pool_matches_the_reference(device, dtype, channels_last, shape, attributes):
    x = _input(shape, dtype, device, channels_last)
    kernel, strides, dilations, begin, _, out = _geometry(shape, attributes)
    want = _reference(x, attributes)
    poisoned = _poisoned(want.shape, dtype, device, channels_last)
    got = max_pool2d(x, kernel, strides, begin, dilations, out, block_c=32, out=poisoned)
    assert got is poisoned
    assert torch.equal(got, want)  # a maximum is exact in any precision
    allocated = max_pool2d(x, kernel, strides, begin, dilations, out)
    assert torch.equal(allocated, want)
    assert allocated.is_contiguous(memory_format=torch.channels_last) == channels_last or not channels_last


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [{"block_p": 4, "block_c": 2, "num_warps": 1}, {"block_p": 64, "block_c": 8}])
def test_max_pool_tiles_and_nan(device, config):
    """Other tiles (pixel blocks past the last pixel, channel blocks past the last channel); a NaN in a window
    makes its maximum NaN, as the reference's amax does."""
    x = torch.randn(2, 5, 7, 6, device=device).contiguous(memory_format=torch.channels_last)
    x[0, 1, 2, 3] = float("nan")
    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]}
    kernel, strides, dilations, begin, _, out = _geometry(x.shape, attributes)
    want = _reference(x, attributes)
    got = max_pool2d(
        x, kernel, strides, begin, dilations, out, out=_poisoned(want.shape, x.dtype, device, True), **config
    )
    assert want.isnan().any() and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("shape", "attributes"), CASES)
def test_an_int8_max_pool_is_exact_and_pads_with_the_lowest_integer(device, channels_last, shape, attributes):
    """int8 (a quantized activation a max pool passes on): the maximum of the integers, the padding below every
    value (all negative here: a padding read as 0, as -inf converted to int8 may be, would show)."""
    x = -torch.randint(1, 129, shape, dtype=torch.int16, device=device).to(torch.int8)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    kernel, strides, dilations, begin, _, out = _geometry(shape, attributes)
    want = _reference(x, attributes)
    poisoned = torch.full(want.shape, 7, dtype=torch.int8, device=device)
    got = max_pool2d(x, kernel, strides, begin, dilations, out, block_c=32, out=poisoned)
    assert got.dtype == torch.int8 and torch.equal(got, want) and (want < 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("shape", "attributes"), CASES)
def test_an_fp8_max_pool_is_exact_and_pads_below_every_value(device, channels_last, shape, attributes):
    """E4M3 (a quantized activation a max pool passes on), all values negative and down to the type's lowest
    (-448), so a padding read as 0 or saturated to -448 would show: the maximum of the values, exactly."""
    x = (torch.rand(shape, device=device) * -448).to(torch.float8_e4m3fn)
    x.view(-1)[0] = -448.0
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    kernel, strides, dilations, begin, _, out = _geometry(shape, attributes)
    want = _reference(x, attributes)
    assert want.dtype == torch.float8_e4m3fn and torch.equal(want.float(), _reference(x.float(), attributes))
    poisoned = torch.full(want.shape, 7.0, device=device).to(torch.float8_e4m3fn)
    got = max_pool2d(x, kernel, strides, begin, dilations, out, block_c=32, out=poisoned)
    assert got.dtype == torch.float8_e4m3fn and torch.equal(got.float(), want.float()) and (want.float() < 0).all()


AVERAGE_CASES = [
    ((2, 5, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 5, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((1, 70, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 6, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1,
                    "count_include_pad": 1}),  # a ceil-mode window hangs past the end padding
    ((2, 3, 10, 7), {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0], "count_include_pad": 1}),
    ((1, 4, 9, 9), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 4, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER", "count_include_pad": 1}),
    ((1, 8, 5, 5), {"kernel_shape": [5, 5]}),  # a global window as an AveragePool
]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("shape", "attributes"), AVERAGE_CASES)
def test_triton_average_pool_matches_the_reference(device, dtype, channels_last, shape, attributes):
    x = _input(shape, dtype, device, channels_last)
    kernel, strides, dilations, begin, end, out = _geometry(shape, attributes)
    want = _reference(x, attributes, "AveragePool", 19)
    poisoned = _poisoned(want.shape, dtype, device, channels_last)
    include = bool(attributes.get("count_include_pad", 0))
    got = avg_pool2d(x, kernel, strides, begin, end, dilations, out, include, poisoned, block_p=8, block_c=4)
    assert got is poisoned
    _assert_tight(got, want)
    allocated = avg_pool2d(x, kernel, strides, begin, end, dilations, out, include)
    _assert_tight(allocated, want)
    assert allocated.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "sliced"])
@pytest.mark.parametrize("splits", [1, 3, "auto"])
def test_triton_global_average_pool_matches_the_reference(device, dtype, layout, splits):
    """NCHW (pixels contiguous), NHWC (channels contiguous) and a window cut out of a larger tensor (H and W do
    not merge); one pixel range, three (partial sums added by the second kernel) or the device's choice."""
    torch.manual_seed(6)
    x = _input((3, 10, 7, 9), dtype, device, layout == "NHWC")
    if layout == "sliced":
        x = _input((3, 10, 9, 12), dtype, device, True)[:, :, 1:8, 2:11]
    want = _reference(x, {}, "GlobalAveragePool", 1)
    out = _poisoned(want.shape, dtype, device, False)
    got = global_avg_pool(x, out, block_p=8, block_c=4, num_warps=1, splits=splits)
    assert got is out
    _assert_tight(got, want)


def test_global_split_count_fills_a_wave_only_when_needed():
    assert global_split_count(programs=200, pixels=3136, block_p=32, slots=132) == 1
    assert global_split_count(programs=2, pixels=3136, block_p=32, slots=132) == 49  # pixels // (2 blocks)
    assert global_split_count(programs=20, pixels=49, block_p=32, slots=132) == 1  # too few pixels to split
    assert global_split_count(programs=1, pixels=112 * 112 * 4, block_p=32, slots=132) == 64  # at most 64


def test_configs_grow_by_effort():
    assert [len(pool_configs(e)) for e in (0, 1, 2)] == [2, 5, 9]
    assert [len(global_pool_configs(e)) for e in (0, 1, 2)] == [2, 5, 9]


def test_bad_input_is_refused_with_the_reason():
    x = torch.randn(1, 2, 4, 4)
    with pytest.raises(ValueError, match="powers of two"):
        max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], [2, 2], block_p=6)
    with pytest.raises(ValueError, match="4-D float tensor"):
        avg_pool2d(x.int(), [2, 2], [2, 2], [0, 0], [0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match="4-D float, int8 or fp8 tensor"):
        max_pool2d(x.int(), [2, 2], [2, 2], [0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match="4-D float tensor"):
        avg_pool2d(x.to(torch.float8_e4m3fn), [2, 2], [2, 2], [0, 0], [0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match="out is"):
        global_avg_pool(x, torch.empty(1, 2, 1, 1, dtype=torch.float16))
    with pytest.raises(ValueError, match="splits must be"):
        global_avg_pool(x, splits=0)


_COMPILE_FOR_HOPPER = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tensorforge.kernels.triton import pool


def compile(fn, constants, pointers, divisible, element="*fp16"):
    signature = {
        n: "constexpr" if n in constants else "*fp32" if n == "partial" else element if n in pointers else "i32"
        for n in fn.arg_names
    }
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in (*pointers, *divisible)}
    ptx = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    return len(re.findall(r"ld\\.global[^;]*\\.v4\\.b32", ptx)), ptx.count("max.NaN"), ptx.count("e4m3")


nhwc = ("C", "sxn", "sxh", "sxw", "syn", "syh", "syw")
for average in (False, True):
    fill = 0.0 if average else float("-inf")
    constants = dict(KH=3, KW=3, AVERAGE=average, FILL=fill, WIDEN=False, BLOCK_P=32, BLOCK_C=64, sxc=1, syc=1)
    print("pool" + str(int(average)), *compile(pool._pool2d, constants, ("x", "y"), nhwc))
constants = dict(KH=3, KW=3, AVERAGE=False, FILL=float("-inf"), WIDEN=True, BLOCK_P=32, BLOCK_C=64, sxc=1, syc=1)
print("pool_fp8", *compile(pool._pool2d, constants, ("x", "y"), nhwc, "*fp8e4nv"))
constants = dict(FLAT=True, SPLIT=True, BLOCK_P=32, BLOCK_C=64, sxc=1, syc=1)
print("global_nhwc", *compile(pool._global_sum, constants, ("x", "y", "partial"), ("C", "sxn", "sxh", "sxw", "syn")))
constants = dict(FLAT=True, SPLIT=False, BLOCK_P=128, BLOCK_C=16, sxw=1, syc=1)
nchw = ("sxc", "sxn", "sxh", "syn", "HW", "pixels_per_split")
print("global_nchw", *compile(pool._global_sum, constants, ("x", "y", "partial"), nchw))
print("finish", *compile(pool._global_mean_of_partials, dict(BLOCK_C=128, syc=1), ("y", "partial"), ()))
"""


def test_the_kernels_compile_for_hopper_with_16_byte_loads():
    """Through Triton's real compiler for sm_90 (the interpreter never compiles): on 16-aligned NHWC strides the
    window pools and the global pool load 16-byte vectors, as does the global pool along NCHW's pixels; the max
    pool compares with NaN-propagating max, an fp8 one in float16 after converting from E4M3 and back."""
    counts = {line[0]: tuple(map(int, line[1:])) for line in compile_for_hopper(_COMPILE_FOR_HOPPER)}
    assert counts["pool0"][0] > 0 and counts["pool0"][1] > 0 and counts["pool0"][2] == 0, counts
    assert counts["pool_fp8"][1] > 0 and counts["pool_fp8"][2] > 0, counts
    assert counts["pool1"][0] > 0 and counts["global_nhwc"][0] > 0 and counts["global_nchw"][0] > 0, counts
    assert "finish" in counts


def test_a_wrong_output_buffer_is_refused():
    x = torch.randn(1, 2, 4, 4)
    with pytest.raises(ValueError, match="out is"):
        max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], [2, 2], out=torch.empty(1, 2, 3, 3))


@pytest.mark.gpu
def test_the_triton_max_pool_is_a_correct_candidate_on_cuda():
    from onnx import helper

    from tensorforge.frontend import import_model
    from tensorforge.tactics.autotune import autotune
    from tests.helpers import make_model, tensor_info

    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    proto = make_model(
        [helper.make_node("MaxPool", ["x"], ["y"], **attributes)],
        [tensor_info("x", [8, 64, 56, 56])],
        [tensor_info("y", None)],
    )
    (node,) = import_model(proto).graph.nodes
    x = torch.randn(8, 64, 56, 56, device="cuda").half().contiguous(memory_format=torch.channels_last)
    choice = autotune(node, 17, [x], "cuda", effort=1, precisions=("fp32", "fp16"), exhaustive=True)
    triton_candidates = [c for c in choice.candidates if c.tactic == "triton.maxpool"]
    assert len(triton_candidates) == 2 * len(pool_configs(1))
    assert all(c.median_ms < float("inf") for c in triton_candidates), [c.note for c in triton_candidates]


# (input shape, AveragePool attributes) of real networks
REAL_AVERAGE_POOLS = {
    "inception-3x3-s1-pad1": ((32, 192, 35, 35), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "densenet-transition-2x2-s2": ((32, 256, 56, 56), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "ceil-include-pad": ((8, 96, 28, 28), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                           "ceil_mode": 1, "count_include_pad": 1}),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", list(REAL_AVERAGE_POOLS))
def test_real_average_pools_on_cuda(dtype, name):
    shape, attributes = REAL_AVERAGE_POOLS[name]
    x = _input(shape, dtype, "cuda", True)
    kernel, strides, dilations, begin, end, out = _geometry(shape, attributes)
    want = _reference(x, attributes, "AveragePool", 19)
    include = bool(attributes.get("count_include_pad", 0))
    for config in pool_configs(2):
        got = avg_pool2d(
            x,
            kernel,
            strides,
            begin,
            end,
            dilations,
            out,
            include,
            _poisoned(want.shape, dtype, "cuda", True),
            **config,
        )
        _assert_tight(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_resnet_max_pool_every_config_on_cuda(dtype):
    x = _input((64, 64, 112, 112), dtype, "cuda", True)
    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    kernel, strides, dilations, begin, _, out = _geometry(x.shape, attributes)
    want = _reference(x, attributes)
    for config in pool_configs(2):
        got = max_pool2d(
            x, kernel, strides, begin, dilations, out, out=_poisoned(want.shape, dtype, "cuda", True), **config
        )
        assert torch.equal(got, want), config


# (input shape, layout): SE blocks at batch 1 (few programs: the pixels split), classifier heads at batch 64
REAL_GLOBAL_POOLS = {
    "mnv3-se-72-56-batch1": ((1, 72, 56, 56), "NHWC"),
    "effnet-head-1280-7-batch1": ((1, 1280, 7, 7), "NHWC"),
    "resnet-head-2048-7-batch64": ((64, 2048, 7, 7), "NHWC"),
    "nchw-256-28-batch2": ((2, 256, 28, 28), "NCHW"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", list(REAL_GLOBAL_POOLS))
def test_real_global_pools_on_cuda(dtype, name):
    shape, layout = REAL_GLOBAL_POOLS[name]
    x = _input(shape, dtype, "cuda", layout == "NHWC")
    want = _reference(x, {}, "GlobalAveragePool", 1)
    for config in global_pool_configs(2):
        got = global_avg_pool(x, _poisoned(want.shape, dtype, "cuda", False), **config)
        _assert_tight(got, want)
