"""CUDA C kernels: every variant compiles with NVRTC (no GPU needed), and on the GPU they match the reference
FusedConv over shapes, dtypes and epilogues."""

import pytest
import torch

from tensorforge.kernels.activations import ACTIVATION_CODES, activation_args
from tensorforge.kernels.cuda import depthwise, direct_conv, nvrtc, winograd
from tensorforge.ops import load_all
from tensorforge.ops.fused import fused_conv
from tensorforge.ops.pool import window_geometry

needs_nvrtc = pytest.mark.skipif(nvrtc.unavailable() is not None, reason=str(nvrtc.unavailable()))
# Normwise relative error against the float64 reference, by storage type.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORFORGE_CACHE", str(tmp_path))


def _depthwise_defines(**overrides):
    d = {"DT": 1, "VEC": 2, "PX": 4, "PRE": 0, "POST": 0, "KH": 3, "KW": 3, "SH": 1, "SW": 1, "DH": 1, "DW": 1,
         "HAS_BIAS": 1, "HAS_RES": 0}  # fmt: skip
    return {**d, **overrides}


def _direct_defines(**overrides):
    d = {"DT": 1, "VEC": 1, "PRE": 0, "POST": 0, "KH": 3, "KW": 3, "SH": 1, "SW": 1, "DH": 1, "DW": 1,
         "HAS_BIAS": 1, "HAS_RES": 1, "TH": 4, "TW": 8, "TC": 64, "CT": 8}  # fmt: skip
    return {**d, **overrides}


@needs_nvrtc
@pytest.mark.parametrize("storage", [0, 1, 2])
@pytest.mark.parametrize("vec", [1, 2, 4])
def test_depthwise_compiles_for_every_storage_type_and_vector_width(storage, vec):
    cubin = nvrtc.compile_cubin(depthwise.SOURCE, "depthwise_nhwc", _depthwise_defines(DT=storage, VEC=vec), "sm_90")
    assert len(cubin) > 1000


@needs_nvrtc
@pytest.mark.parametrize(("px", "stride", "dilation"), [(8, 1, 1), (16, 1, 1), (4, 2, 2)])
def test_depthwise_compiles_wide_filters_and_long_pixel_runs(px, stride, dilation):
    """A 7×7 filter with up to 16 pixels a thread: the row of shared cells is (PX-1)·S + 6·D + 1 long."""
    defines = _depthwise_defines(DT=1, VEC=4, PX=px, KH=7, KW=7, SH=stride, SW=stride, DH=dilation, DW=dilation)
    cubin = nvrtc.compile_cubin(depthwise.SOURCE, "depthwise_nhwc", defines, "sm_90")
    assert len(cubin) > 1000


@needs_nvrtc
@pytest.mark.parametrize("storage", [0, 1, 2])
@pytest.mark.parametrize("vec", [1, 2, 4])
def test_tiled_depthwise_compiles_for_every_storage_type_and_vector_width(storage, vec):
    defines = _depthwise_defines(DT=storage, VEC=vec, KH=7, KW=7, TH=8, TW=16, PX=8, CB=32, HAS_RES=1)
    cubin = nvrtc.compile_cubin(depthwise.TILED_SOURCE, "depthwise_tiled_nhwc", defines, "sm_90")
    assert len(cubin) > 1000


@pytest.mark.parametrize(
    ("config", "kernel", "strides", "words"),
    [
        ({"th": 8, "tw": 8, "px": 3, "cb": 32}, (3, 3), (1, 1), "multiple of px"),
        ({"th": 32, "tw": 32, "px": 1, "cb": 32}, (3, 3), (1, 1), "8192 threads"),
        ({"th": 8, "tw": 8, "px": 4, "cb": 32}, (31, 31), (4, 4), "shared memory"),  # a 59×59 patch
    ],
)
def test_tiled_depthwise_refuses_a_tile_that_does_not_fit(config, kernel, strides, words):
    x = torch.zeros(1, 32, 8, 8).contiguous(memory_format=torch.channels_last)
    weight = depthwise.pack_depthwise_weight(torch.zeros(32, 1, *kernel))
    with pytest.raises(ValueError, match=words):
        depthwise.depthwise_conv2d(x, weight, kernel, strides=strides, out_hw=(8, 8), config=config)


@needs_nvrtc
@pytest.mark.parametrize("activation", sorted(ACTIVATION_CODES.values()))
def test_direct_conv_compiles_with_every_activation(activation):
    defines = _direct_defines(PRE=activation, POST=activation, KH=7, KW=7, SH=2, SW=2)
    assert len(nvrtc.compile_cubin(direct_conv.SOURCE, "conv_direct_nhwc", defines, "sm_90")) > 1000


@needs_nvrtc
@pytest.mark.parametrize("storage", [0, 1, 2])
def test_winograd_compiles(storage):
    defines = {"DT": storage, "VEC": 1, "PRE": 1, "POST": 6, "HAS_BIAS": 1, "HAS_RES": 1}
    assert len(nvrtc.compile_cubin(winograd.SOURCE, "winograd_f2x2_3x3", defines, "sm_90")) > 1000


def test_winograd_weight_transform_reproduces_the_convolution():
    """Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A on one tile equals the 3×3 correlation, in float64 on the CPU."""
    torch.manual_seed(0)
    d, g = torch.randn(4, 4, dtype=torch.float64), torch.randn(1, 1, 3, 3, dtype=torch.float64)
    bt = torch.tensor([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=torch.float64)
    at = torch.tensor([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=torch.float64)
    u = winograd.pack_winograd_weight(g).reshape(4, 4)
    y = at @ (u * (bt @ d @ bt.t())) @ at.t()
    want = torch.nn.functional.conv2d(d[None, None], g)[0, 0]
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)


@needs_nvrtc
def test_compiled_cubins_are_cached_on_disk(tmp_path):
    defines = _depthwise_defines(KH=5, KW=5)
    first = nvrtc.compile_cubin(depthwise.SOURCE, "depthwise_nhwc", defines, "sm_80")
    files = list((tmp_path / "cuda").glob("depthwise_nhwc-*.cubin"))
    assert len(files) == 1 and files[0].read_bytes() == first
    nvrtc._CUBINS.clear()
    files[0].write_bytes(b"cached")  # a second compile must read the file, not compile again
    assert nvrtc.compile_cubin(depthwise.SOURCE, "depthwise_nhwc", defines, "sm_80") == b"cached"


@needs_nvrtc
def test_a_compile_error_carries_the_nvrtc_log():
    with pytest.raises(nvrtc.CudaCompileError, match="undefined|identifier"):
        nvrtc.compile_cubin(depthwise.SOURCE, "depthwise_nhwc", {"DT": 1}, "sm_90")


def test_weight_packing_layouts():
    w = torch.randn(6, 1, 3, 3)
    packed = depthwise.pack_depthwise_weight(w)
    assert packed.shape == (9, 6) and torch.equal(packed[4], w[:, 0, 1, 1])
    w = torch.randn(8, 5, 3, 2)
    packed = direct_conv.pack_direct_weight(w)
    assert packed.shape == (6, 5, 8) and torch.equal(packed[3], w[:, :, 1, 1].t())
    with pytest.raises(ValueError, match="depthwise weight"):
        depthwise.pack_depthwise_weight(torch.randn(6, 2, 3, 3))


def _reference(x, w, b, z, attributes):
    load_all()
    return fused_conv(None, x.double(), w.double(), None if b is None else b.double(),
                      None if z is None else z.double(), **attributes)  # fmt: skip


def _error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


DEPTHWISE_CASES = [
    # (N, C, H, W), kernel, strides, pads, dilations
    ((2, 96, 19, 17), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 240, 14, 14), (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    ((1, 7, 9, 11), (3, 3), (2, 1), (0, 1, 2, 1), (1, 1)),
    ((2, 96, 14, 14), (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),
    ((1, 34, 12, 12), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    ((2, 20, 13, 15), (3, 3), (2, 2), (2, 1, 2, 1), (2, 2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("shape", "kernel", "strides", "pads", "dilations"), DEPTHWISE_CASES)
@pytest.mark.parametrize(("pre", "residual", "post"), [("", False, ""), ("HardSwish", False, ""), ("", True, "Relu")])
def test_depthwise_matches_the_reference(dtype, shape, kernel, strides, pads, dilations, pre, residual, post):
    n, c, h, w = shape
    x = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, *kernel, device="cuda").to(dtype)
    bias = torch.randn(c, device="cuda").to(dtype)
    attributes = {"group": c, "kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
                  "dilations": list(dilations), "pre": pre, "post": post}  # fmt: skip
    begin, _, out_hw = window_geometry((h, w), kernel, strides, dilations, pads, "NOTSET")
    z = torch.randn(n, c, *out_hw, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    z = z if residual else None
    want = _reference(x, weight, bias, z, attributes)
    out = torch.full((n, c, *out_hw), float("nan"), device="cuda", dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )
    for config in depthwise.depthwise_configs(2):
        out.fill_(float("nan"))
        got = depthwise.depthwise_conv2d(
            x, depthwise.pack_depthwise_weight(weight), kernel, bias, z, strides=strides, pads_begin=begin,
            dilations=dilations, out_hw=out_hw, pre=activation_args(pre), post=activation_args(post),
            config=config, out=out,
        )  # fmt: skip
        assert got is out and not torch.isnan(got).any(), config
        assert _error(got, want) <= TOLERANCE[dtype], config


DIRECT_CASES = [
    ((2, 3, 33, 29), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
    ((2, 64, 14, 14), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 40, 9, 13), (72, 40, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((1, 16, 11, 10), (24, 16, 3, 3), (2, 2), (0, 1, 1, 0), (1, 1)),
    ((1, 12, 12, 12), (20, 12, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("shape", "weight_shape", "strides", "pads", "dilations"), DIRECT_CASES)
@pytest.mark.parametrize(("pre", "residual", "post"), [("Relu", False, ""), ("SiLU", True, "Relu")])
def test_direct_conv_matches_the_reference(dtype, shape, weight_shape, strides, pads, dilations, pre, residual, post):
    n, _, h, w = shape
    co, _, kh, kw = weight_shape
    x = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(weight_shape, device="cuda") / (weight_shape[1] * kh * kw) ** 0.5).to(dtype)
    bias = torch.randn(co, device="cuda").to(dtype)
    attributes = {"kernel_shape": [kh, kw], "strides": list(strides), "pads": list(pads),
                  "dilations": list(dilations), "pre": pre, "post": post}  # fmt: skip
    begin, _, out_hw = window_geometry((h, w), (kh, kw), strides, dilations, pads, "NOTSET")
    z = torch.randn(n, co, *out_hw, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    z = z if residual else None
    want = _reference(x, weight, bias, z, attributes)
    for config in direct_conv.direct_configs(2):
        out = torch.full((n, co, *out_hw), float("nan"), device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last
        )
        got = direct_conv.direct_conv2d(
            x, direct_conv.pack_direct_weight(weight), (kh, kw), bias, z, strides=strides, pads_begin=begin,
            dilations=dilations, out_hw=out_hw, pre=activation_args(pre), post=activation_args(post),
            config=config, out=out,
        )  # fmt: skip
        assert got is out and not torch.isnan(got).any(), config
        assert _error(got, want) <= TOLERANCE[dtype], config


@pytest.mark.gpu
def test_kernels_refuse_mismatched_buffers():
    x = torch.randn(1, 8, 5, 5, device="cuda").half().contiguous(memory_format=torch.channels_last)
    packed = depthwise.pack_depthwise_weight(torch.randn(8, 1, 3, 3, device="cuda").half())
    with pytest.raises(ValueError, match="channels_last"):
        depthwise.depthwise_conv2d(x.contiguous(), packed, (3, 3), out_hw=(3, 3))
    with pytest.raises(ValueError, match="weight is torch.float32"):
        depthwise.depthwise_conv2d(x, packed.float(), (3, 3), out_hw=(3, 3))


WINOGRAD_CASES = [((2, 64, 14, 14), 64, (1, 1, 1, 1)), ((1, 24, 9, 11), 40, (0, 1, 1, 0)), ((3, 8, 7, 7), 16, (0,) * 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("shape", "out_channels", "pads"), WINOGRAD_CASES)
@pytest.mark.parametrize(("pre", "residual", "post"), [("Relu", False, ""), ("", True, "Relu")])
def test_winograd_matches_the_reference(dtype, shape, out_channels, pads, pre, residual, post):
    n, c, h, w = shape
    x = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(out_channels, c, 3, 3, device="cuda") / (9 * c) ** 0.5).to(dtype)
    bias = torch.randn(out_channels, device="cuda").to(dtype)
    attributes = {"kernel_shape": [3, 3], "pads": list(pads), "pre": pre, "post": post}
    begin, _, out_hw = window_geometry((h, w), (3, 3), (1, 1), (1, 1), pads, "NOTSET")
    z = torch.randn(n, out_channels, *out_hw, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    z = z if residual else None
    want = _reference(x, weight, bias, z, attributes)
    for config in winograd.winograd_configs(1):
        out = torch.full((n, out_channels, *out_hw), float("nan"), device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last
        )
        got = winograd.winograd_conv2d(
            x, winograd.pack_winograd_weight(weight), (3, 3), bias, z, pads_begin=begin, out_hw=out_hw,
            pre=activation_args(pre), post=activation_args(post), config=config, out=out,
        )  # fmt: skip
        assert got is out and not torch.isnan(got).any(), config
        assert _error(got, want) <= TOLERANCE[dtype], config


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["Relu", "Clip", "HardSigmoid", "Elu"])
def test_nan_propagates_through_the_epilogue(activation):
    params = {"Clip": [-1.0, 1.0]}.get(activation, [])
    x = torch.randn(1, 8, 5, 5, device="cuda").contiguous(memory_format=torch.channels_last)
    x[0, 3, 2, 2] = float("nan")
    weight = torch.randn(8, 1, 3, 3, device="cuda")
    got = depthwise.depthwise_conv2d(
        x, depthwise.pack_depthwise_weight(weight), (3, 3), pads_begin=(1, 1), out_hw=(5, 5),
        pre=activation_args(activation, params),
    )  # fmt: skip
    want = _reference(x, weight, None, None, {"group": 8, "pads": [1] * 4, "pre": activation, "pre_params": params})
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(want).sum() == 9
