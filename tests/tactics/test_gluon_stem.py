"""The Gluon stems: where they decline and why, their tiles fitted to a stem, what their launch computes (assembled
on the CPU from the recorded descriptors: the blocked input's column-tap view times the regrouped weight is the
strided convolution, exactly), and on the GPU every candidate passing the autotuner's check."""

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.quantize import quantize_activation
from tensorforge.tactics.autotune import autotune, build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.gluon_stem import _stem_problem
from tests.kernels.gluon_support import producer_reads, recorded_launches
from tests.tactics.stem_support import quantized_stem, stem_node

pytest.importorskip("tensorforge.kernels.gluon.gemm", reason="this Triton has no Gluon for Hopper")

FLOAT, QUANTIZED = "gluon.conv-s2d", "gluon.conv-s2d-quantized"
CPU = torch.device("cpu")


def _stem(channels=3, cout=16, kernel=7, pad=3, stride=2, size=16):
    return stem_node(channels, cout, kernel, pad, stride, size, activation="relu", scale=kernel)


def test_the_stem_tactics_decline_on_the_cpu_and_say_which_layers_they_take():
    for key in (FLOAT, QUANTIZED):
        reason = tactic_by_key(key).supports(_stem(), 17, CPU)
        assert reason == "needs CUDA" or "no Gluon" in reason
    assert _stem_problem(_stem()) is None
    assert _stem_problem(_stem(kernel=3, pad=1)) is None
    assert "stride 1 or 2" in _stem_problem(_stem(stride=3))
    assert "stride-2" in _stem_problem(_stem(stride=1))
    assert "at most 4 input channels" in _stem_problem(_stem(channels=8))
    assert "even height and width" in _stem_problem(_stem(size=15))


@pytest.mark.parametrize(("kernel", "pad", "channels"), [(7, 3, 64), (3, 1, 32)])
def test_the_tiles_fit_a_row_of_taps_and_the_output_channels(kernel, pad, channels):
    """ResNet's 7×7 stem reads 4 taps of 16 blocked channels a K row, a 3×3 one 2: K tiles no wider; N tiles no
    wider than the 64 output channels. The quantized space is the same tiles (8-bit K steps fitted alike)."""
    node = _stem(cout=64, kernel=kernel, pad=pad)
    for key in (FLOAT, QUANTIZED):
        assert tactic_by_key(key).space_for(node, 0) == []  # offered from effort 1 (slower on an H100)
        fitted = tactic_by_key(key).space_for(node, 1)
        assert fitted and all(c["block_k"] == channels and c["block_n"] == 64 for c in fitted)


def test_e4m3_stems_also_time_their_configs_without_the_promotion_of_their_sums():
    node, _ = quantized_stem(size=16, quant="fp8e4m3")
    fitted = tactic_by_key(QUANTIZED).space_for(node, 1)
    assert [c.get("promote", True) for c in fitted].count(False) == len(fitted) // 2 > 0


def _launch(monkeypatch, tactic: str, node, config: dict, x: torch.Tensor):
    launches = recorded_launches(monkeypatch)
    kernel = build_layer_kernel(tactic_by_key(tactic), node, 17, CPU, config, {})
    (out,) = kernel([x])
    ((_, args, options),) = launches.calls
    return out, args, options


@pytest.mark.parametrize(("kernel", "pad"), [(7, 3), (3, 1), (5, 2)])
def test_a_float_stem_launches_the_strided_convolution_over_the_column_taps(monkeypatch, kernel, pad):
    """fp16: the float32 NCHW input blocked as it comes; the launch's K rows of taps over the view, times the packed
    weight, are the stride-2 convolution of the fp16 input and weight (float64 sums)."""
    torch.manual_seed(0)
    node = _stem(kernel=kernel, pad=pad)
    config = {"precision": "fp16", "layout": "NHWC", **tactic_by_key(FLOAT).space_for(node, 1)[0]}
    x = torch.randn(2, 3, 16, 16)
    out, args, options = _launch(monkeypatch, FLOAT, node, config, x)
    assert out.dtype == torch.float16 and out.is_contiguous(memory_format=torch.channels_last)
    assert options["BOXED"] and options["STRIDE"] == 1 and options["KW"] == 1 and options["HAS_BIAS"]
    assert args[0].strides[2] == 16  # overlapping pixels: each holds a row of taps, 16 blocked channels apart
    w = torch.as_tensor(node.inputs[1].const)
    want = F.conv2d(x.half().double(), w.half().double(), stride=2, padding=pad)
    got = producer_reads(args, options).permute(0, 3, 1, 2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)


def test_a_quantized_stem_launches_the_int8_products_of_the_blocked_quantized_input(monkeypatch):
    """int8: the blocking pass quantizes the fp16-rounded input (the variant's, as the reference does); the launch's
    sums are the strided convolution of those steps by the int8 weight, exactly; the column scales x_scale · Ws."""
    node, (x,) = quantized_stem(size=16)
    config = {"precision": "fp16", "layout": "NHWC", **tactic_by_key(QUANTIZED).space_for(node, 1)[0]}
    out, args, options = _launch(monkeypatch, QUANTIZED, node, config, x)
    assert out.dtype == torch.float16 and options["HAS_SCALE"] and options["QUANT_Y"] == 0
    a = node.attributes
    steps = quantize_activation(x.half(), float(a["x_scale"]), "int8")
    w = torch.as_tensor(node.inputs[1].const)
    want = F.conv2d(steps.double(), w.double(), stride=2, padding=3)
    assert torch.equal(producer_reads(args, options).permute(0, 3, 1, 2), want)
    w_scale = torch.as_tensor(node.inputs[4].const).double()
    torch.testing.assert_close(args[4].double(), (w_scale * float(a["x_scale"])).float().double())


@pytest.mark.gpu
def test_every_float_stem_candidate_is_correct_on_cuda():
    """ResNet's stem at batch 8: every configuration correct (the autotuner's check against the reference)."""
    torch.manual_seed(2)
    node = _stem(cout=64, size=224)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    choice = autotune(node, 1, [x, None, None], "cuda", effort=1, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == FLOAT]
    assert len(ours) == len(tactic_by_key(FLOAT).space_for(node, 1))
    assert all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
def test_every_quantized_stem_candidate_is_correct_on_cuda(quant):
    torch.manual_seed(5)
    node, (x,) = quantized_stem(size=224, cout=64, quant=quant)
    choice = autotune(node, 1, [x.cuda(), None, None], "cuda", effort=1, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == QUANTIZED]
    assert len(ours) == 2 * len(tactic_by_key(QUANTIZED).space_for(node, 1))  # the fp16 and fp32 variants
    assert all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]
