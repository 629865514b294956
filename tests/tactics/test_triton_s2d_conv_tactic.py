"""The space-to-depth stem tactic: the blocked weight and input compute the strided convolution exactly (float64),
the tactic's reasons for declining, its kernel through `build` under the interpreter (blocked, in rows and in TMA
boxes; an odd map through the plain strided kernel), and its place among the candidates on CUDA."""

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels import space_to_depth
from tensorforge.kernels.quantize import quantize_activation
from tensorforge.kernels.triton import conv_tma, copy
from tensorforge.tactics import triton_conv
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import record_returns
from tests.tactics.stem_support import quantized_stem, stem_node

S2D = "triton.conv-s2d"
TINY = {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 1, "num_stages": 1, "split_k": 1}
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("kernel", "pad", "side"), [(7, 3, 16), (3, 1, 12), (3, 1, 10), (5, 2, 8), (4, 1, 8), (3, 0, 8)]
)
def test_the_blocked_layer_is_the_strided_one(kernel, pad, side):
    """In float64, over every padding parity: ResNet's 7×7/2 stem (pad 3), MobileNet's 3×3/2 (pad 1), and others."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, side, side, dtype=torch.float64)
    w = torch.randn(5, 3, kernel, kernel, dtype=torch.float64)
    want = F.conv2d(x, w, stride=2, padding=pad)
    wb, pads = space_to_depth.blocked_weight(w, [pad, pad]), space_to_depth.blocked_pads([pad, pad])
    assert list(wb.shape[2:]) == space_to_depth.blocked_taps((kernel, kernel), [pad, pad])
    xb = space_to_depth.blocked_input(x.contiguous(memory_format=torch.channels_last), torch.float64)
    assert wb.shape[1] == xb.shape[1] == 16 and xb.is_contiguous(memory_format=torch.channels_last)
    size = want.shape[2]
    got = F.conv2d(F.pad(xb, [pads[1], size, pads[0], size]), wb)[:, :, :size, :size]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("kernel", "pad", "side"), [(7, 3, 16), (3, 1, 12), (3, 1, 10), (5, 2, 8), (4, 1, 8), (3, 0, 8)]
)
def test_a_row_of_taps_is_one_pixel_of_the_column_view(kernel, pad, side):
    """The blocked input between its zero columns, viewed with a row of taps per pixel (overlapping pixels), and
    the KH' × 1 weight compute the strided convolution exactly (float64)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, side, side, dtype=torch.float64)
    w = torch.randn(5, 3, kernel, kernel, dtype=torch.float64)
    want = F.conv2d(x, w, stride=2, padding=pad)
    (rows, taps), pads = (
        space_to_depth.blocked_taps((kernel, kernel), [pad, pad]),
        space_to_depth.blocked_pads([pad, pad]),
    )
    size = want.shape[2]
    after = max(0, size + taps - 1 - pads[1] - side // 2)
    xb = space_to_depth.blocked_input(x, torch.float64, columns=(pads[1], after))
    assert xb.shape == (2, 16, side // 2, side // 2 + pads[1] + after)
    view = space_to_depth.column_taps(xb, taps, size)
    assert view.shape == (2, 16 * taps, side // 2, size) and view.stride(3) == 16
    weight = space_to_depth.column_tap_weight(space_to_depth.blocked_weight(w, [pad, pad]))
    assert weight.shape == (5, 16 * taps, rows, 1)
    got = F.conv2d(F.pad(view, [0, 0, pads[0], size]), weight)[:, :, :size]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="dense channels_last map"):
        space_to_depth.column_taps(xb[:, :, :, : size + taps - 2], taps, size)


@pytest.mark.parametrize(
    ("shape", "nhwc", "dtype", "columns"),
    [
        ((2, 3, 16, 16), False, torch.float16, (0, 0)),
        ((2, 3, 16, 16), False, torch.float16, (2, 1)),
        ((2, 3, 10, 12), True, torch.float32, (1, 0)),
        ((2, 1, 8, 8), False, torch.float32, (0, 3)),
    ],
)
def test_the_blocking_kernel_writes_what_the_strided_copy_writes(shape, nhwc, dtype, columns):
    """`triton.copy.space_to_depth` (CUDA's path) under the interpreter against the torch path: NCHW and NHWC
    float32 input, float16 and float32 out, 16 and 8 blocked channels, zero columns before and after, the padding
    channels and columns zero, no element left unwritten (the output poisoned)."""
    torch.manual_seed(3)
    x = torch.randn(shape)
    x = x.contiguous(memory_format=torch.channels_last) if nhwc else x
    channels = space_to_depth.blocked_channels(shape[1])
    width = shape[3] // 2 + sum(columns)
    out = torch.full((shape[0], channels, shape[2] // 2, width), float("nan"), dtype=dtype)
    got = copy.space_to_depth(x, out.contiguous(memory_format=torch.channels_last), columns)
    want = space_to_depth.blocked_input(x, dtype, columns=columns)
    assert torch.equal(got, want)
    assert not want[:, :, :, : columns[0]].any() and not want[:, :, :, width - columns[1] :].any()
    group = channels // 4
    first = want[:, :, :, columns[0]]  # pixel (i, 0): X[n, c, 2i + p, p'] at channel (2p + p')·G + c
    for p, p2 in ((0, 0), (0, 1), (1, 0), (1, 1)):
        slots = first[:, (2 * p + p2) * group : (2 * p + p2 + 1) * group]
        assert torch.equal(slots[:, : shape[1]], x[:, :, p::2, p2].to(dtype)) and not slots[:, shape[1] :].any()


QUANTIZED_BLOCKING = [
    pytest.param(torch.int8, "int8", "cpu", id="int8-interpreter"),
    # the interpreter rounds some values to E4M3 a binade low (-64 for -128): checked on the GPU only
    pytest.param(torch.int8, "int8", "cuda", id="int8-cuda", marks=pytest.mark.gpu),
    pytest.param(torch.float8_e4m3fn, "fp8e4m3", "cuda", id="e4m3-cuda", marks=pytest.mark.gpu),
]


def _straddling(scale: float, count: int) -> torch.Tensor:
    """`count` values whose quantization differs by a step between a float32 division by `scale` (QuantizeLinear)
    and a multiplication by its float32 inverse (the kernels, and the reference QuantizedConv)."""
    x = torch.randn(20_000_000, generator=torch.Generator().manual_seed(3)) * 3
    inverse = torch.tensor(1.0 / scale, dtype=torch.float32)
    differ = (x / torch.tensor(scale)).round() != (x * inverse).round()
    assert int(differ.sum()) >= count
    return x[differ][:count]


@pytest.mark.parametrize(("dtype", "kind", "device"), QUANTIZED_BLOCKING)
def test_the_blocking_kernel_quantizes_as_a_kernel_quantizes_on_load(dtype, kind, device):
    """Exactly, on values where a division would round to the other step."""
    torch.manual_seed(4)
    scale = 0.0347
    x = torch.randn(2, 3, 12, 16) * 3
    x.view(-1)[::97] = _straddling(scale, x[0].numel() * 2 // 97 + 1)[: x.view(-1)[::97].numel()]
    x = x.to(device)
    out = torch.full((2, 16, 6, 11), 7, dtype=torch.int8, device=device).view(dtype)
    out = out.contiguous(memory_format=torch.channels_last)
    got = copy.space_to_depth(x, out, (2, 1), scale)
    want = space_to_depth.blocked_input(x.cpu(), dtype, columns=(2, 1), scale=scale).to(device)
    assert torch.equal(got.view(torch.int8), want.view(torch.int8))
    steps = quantize_activation(x, scale, kind)
    assert torch.equal(want[:, :3, :, 2].view(torch.int8), steps[:, :, 0::2, 0].view(torch.int8))
    assert not want[:, 3:4].view(torch.int8).any()  # the slot c = 3 of G = 4
    with pytest.raises(ValueError, match="needs a positive scale"):
        copy.space_to_depth(x, out, (2, 1))


def test_an_odd_map_is_refused_by_the_blocking():
    with pytest.raises(ValueError, match="even height and width"):
        space_to_depth.blocked_input(torch.randn(1, 3, 7, 8), torch.float32)
    with pytest.raises(ValueError, match="an even map"):
        copy.space_to_depth(torch.randn(1, 3, 7, 8), torch.empty(1, 16, 3, 4))
    with pytest.raises(ValueError, match="G ≥ C a power of two"):
        copy.space_to_depth(
            torch.randn(1, 3, 8, 8), torch.empty(1, 12, 4, 4).contiguous(memory_format=torch.channels_last)
        )


def _stem(channels=3, cout=16, kernel=7, pad=3, stride=2, size=16):
    """Conv K×K/stride + Relu on a `channels`-channel image, optimized into one FusedConv."""
    return stem_node(channels, cout, kernel, pad, stride, size, activation="relu", scale=kernel)


def test_supports_gives_reasons():
    tactic = tactic_by_key(S2D)
    cuda = torch.device("cuda")
    assert "needs CUDA" in tactic.supports(_stem(), 1, CPU)
    assert tactic.supports(_stem(), 1, cuda) is None
    assert "stride-2" in tactic.supports(_stem(stride=1), 1, cuda)
    assert "at most 4 input channels" in tactic.supports(_stem(channels=8), 1, cuda)
    fitted = tactic.space_for(_stem(), 0)  # 4 taps of 16 blocked channels a row
    assert all(c["block_k"] == 64 and c["block_n"] == 16 for c in fitted) and any(c["tma"] for c in fitted)
    assert all(c["block_k"] == 32 for c in tactic.space_for(_stem(kernel=3, pad=1), 0))  # 2 taps


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("kernel", "pad"), [(7, 3), (3, 1)])
@pytest.mark.parametrize("tma", [False, True])
def test_blocks_the_input_as_it_comes_under_the_interpreter(precision, kernel, pad, tma, monkeypatch):
    """The float32 NCHW input reaches the tactic unconverted and is blocked in the variant's type; the output is
    channels_last in that type and matches the reference; a TMA configuration runs the TMA kernel in boxes."""
    torch.manual_seed(0)
    launches = record_returns(monkeypatch, conv_tma, "launch")
    blocked = record_returns(monkeypatch, triton_conv, "blocked_input")
    node = _stem(kernel=kernel, pad=pad)
    config = {"precision": precision, "layout": "NHWC", **TINY, "tma": tma}
    kernel_ = build_layer_kernel(tactic_by_key(S2D), node, 1, CPU, config, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})
    x = torch.randn(2, 3, 16, 16)
    got = kernel_([x])[0]
    assert got.dtype == {"fp32": torch.float32, "fp16": torch.float16}[precision]
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(got, reference([x])[0]) <= TOLERANCE[precision]
    assert len(blocked) == 1 and blocked[0].shape[:3] == (2, 16, 8)
    assert launches == ([None] if tma else [])


def test_an_odd_map_runs_the_strided_kernel(monkeypatch):
    torch.manual_seed(1)
    blocked = record_returns(monkeypatch, triton_conv, "blocked_input")
    node = _stem(size=15)
    kernel = build_layer_kernel(tactic_by_key(S2D), node, 1, CPU, {"precision": "fp32", "layout": "NHWC", **TINY}, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})
    x = torch.randn(2, 3, 15, 15)
    assert relative_error(kernel([x])[0], reference([x])[0]) <= TOLERANCE["fp32"]
    assert blocked == []


@pytest.mark.gpu
def test_the_s2d_conv_is_a_correct_candidate_on_cuda():
    """ResNet's stem at batch 8: every configuration of both variants correct, except, in fp32, a tile whose
    pipeline does not fit in shared memory at 32 bits (the transposed 256-pixel tile, 240 KiB), which the kernel
    refuses before compiling, saying so."""
    torch.manual_seed(2)
    node = _stem(cout=64, size=224)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    choice = autotune(node, 1, [x, None, None], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == S2D]
    assert len(ours) == 2 * len(tactic_by_key(S2D).space_for(node, 0))
    for c in ours:
        refused = c.config["precision"] == "fp32" and "shared memory at 32-bit" in c.note
        assert math.isfinite(c.median_ms) or refused, (c.config, c.note)
    assert all(math.isfinite(c.median_ms) for c in ours if c.config["precision"] == "fp16")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("tma", [False, True])
def test_a_quantized_stem_blocks_then_quantizes_on_load(precision, tma, monkeypatch):
    """int8: the float32 NCHW input blocked into the variant's type, quantized by the kernel as it loads it, against
    the reference QuantizedConv; a TMA configuration runs the TMA kernel."""
    launches = record_returns(monkeypatch, conv_tma, "launch")
    node, feeds = quantized_stem()
    tactic = tactic_by_key(S2D + "-quantized")
    assert "needs CUDA" in tactic.supports(node, 1, CPU)
    fitted = tactic.space_for(node, 0)
    assert all(c["block_k"] == 64 for c in fitted) and any(c["tma"] for c in fitted)
    config = {"precision": precision, "layout": "NHWC", **TINY, "block_k": 32, "tma": tma}
    kernel = build_layer_kernel(tactic, node, 1, CPU, config, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})
    got = kernel(feeds)[0]
    assert got.dtype == {"fp32": torch.float32, "fp16": torch.float16}[precision]
    assert relative_error(got, reference(feeds)[0]) <= TOLERANCE[precision]
    assert launches == ([None] if tma else [])


@pytest.mark.gpu
def test_the_quantized_s2d_conv_is_a_correct_candidate_on_cuda():
    torch.manual_seed(5)
    node, (x,) = quantized_stem(size=224)
    choice = autotune(node, 1, [x.cuda(), None, None], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == S2D + "-quantized"]
    assert len(ours) == 2 * len(tactic_by_key(S2D + "-quantized").space_for(node, 0))
    assert all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]
