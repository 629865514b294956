"""The Triton QuantizedConv tactic: a calibrated layer's kernel through `build` under the interpreter on the CPU
against the reference QuantizedConv, its reasons for declining, and its candidates in the autotuner on CUDA."""

import math

import numpy as np
import pytest
import torch

from tensorforge.ir import Model
from tensorforge.kernels.quantize import quantize_activation
from tensorforge.quant import calibrate
from tensorforge.quant.lower import quantize_layers
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.test_triton_conv_tactic import _layer

TACTIC = "triton.conv-igemm-quantized"
TINY = {"block_m": 16, "block_n": 16, "block_k": 32, "group_m": 2, "num_warps": 1, "num_stages": 1, "split_k": 1}
CPU = torch.device("cpu")


def _quantized_layer(quant="int8", size=7, residual=True):
    """The FusedConv of `_layer` calibrated on random batches and lowered to a QuantizedConv, with feeds."""
    node = _layer(size, residual=residual)
    model = Model(node.graph, {"": 17, "tensorforge": 1})
    rng = np.random.default_rng(3)
    batch = {"x": rng.standard_normal((2, 16, size, size)).astype(np.float32)}
    if residual:
        batch["r"] = rng.standard_normal((2, 16, size, size)).astype(np.float32)
    quantize_layers(model, calibrate(model, [batch], "minmax"), quant=quant)
    (quantized,) = model.graph.nodes
    assert quantized.op_type == "QuantizedConv"
    feeds = [torch.from_numpy(batch["x"])] + ([torch.from_numpy(batch["r"])] if residual else [])
    return quantized, feeds


@pytest.mark.parametrize("residual", [True, False])
def test_the_quantized_kernel_matches_the_reference_quantized_conv(residual):
    node, feeds = _quantized_layer(residual=residual)
    config = {"precision": "fp32", "layout": "NHWC", **TINY}
    kernel = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, config, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})
    got = kernel(feeds)[0]
    assert got.is_contiguous(memory_format=torch.channels_last) and got.dtype == torch.float32
    assert relative_error(got, reference(feeds)[0]) <= TOLERANCE["fp32"]


def test_the_quantized_tactic_declines_off_cuda():
    node, _ = _quantized_layer()
    assert "needs CUDA" in tactic_by_key(TACTIC).supports(node, 1, CPU)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
def test_the_quantized_tactic_is_a_correct_candidate_on_cuda(quant):
    node, (x, r) = _quantized_layer(quant, size=28)
    choice = autotune(
        node, 1, [x.cuda(), None, None, r.cuda()], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True
    )
    ours = [c for c in choice.candidates if c.tactic == TACTIC]
    assert len(ours) == 2 * len(tactic_by_key(TACTIC).space(0))
    # int8 sums are exact: every candidate passes. fp8 tensor cores add in reduced precision (about 1e-3 of
    # the output): the fp16 candidates, held to 5e-3, pass; fp32 ones (1e-4) may be refused.
    passing = ours if quant == "int8" else [c for c in ours if c.config["precision"] == "fp16"]
    assert all(math.isfinite(c.median_ms) for c in passing), [(c.config, c.note) for c in ours]


def test_16_bit_variants_of_a_quantized_layer_are_checked_on_the_input_they_quantize():
    """An fp16 variant reads x rounded to fp16; where that rounding carries x / x_scale across a boundary of
    the E4M3 grid the element moves by a whole step (about 2% normwise error here against the float32 input's
    quantization, four times fp16's bound). Checked against the reference on the same fp16 input, every fp16
    candidate passes with fp16's own bound."""
    node, (x, r) = _quantized_layer("fp8e4m3", size=28)
    choice = autotune(node, 1, [x, None, None, r], "cpu", effort=0, precisions=("fp32", "fp16"))
    fp16 = [c for c in choice.candidates if c.config.get("precision") == "fp16" and c.tactic != "fallback.float-conv"]
    assert fp16 and all(math.isfinite(c.median_ms) for c in fp16), [(c.tactic, c.note) for c in fp16]
    rounded = x.half().float()
    moved = (quantize_activation(rounded, node.attributes["x_scale"], "fp8e4m3").float()
             != quantize_activation(x, node.attributes["x_scale"], "fp8e4m3").float())  # fmt: skip
    assert moved.any()  # the case the rounded reference is for
