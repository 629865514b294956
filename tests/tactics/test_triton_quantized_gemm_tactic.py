"""The Triton QuantizedGemm tactic (`triton.gemm-quantized`, the TMA rows kernel): calibrated int8 linear layers
through `build` under the interpreter on the CPU against the reference QuantizedGemm in the same variant, an int8
input and an int8 output, its reasons for declining, and its candidates in the autotuner on CUDA."""

import math

import pytest
import torch

from tensorforge.kernels.quantize import quantize_activation
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.test_quantized_gemm_tactics import CASES, _quantized

TACTIC = "triton.gemm-quantized"
TINY = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2, "TMA": True}
CPU = torch.device("cpu")


def _kernels(layer, precision):
    config = {"precision": precision}
    ours = build_layer_kernel(tactic_by_key(TACTIC), layer, 1, CPU, {**config, **TINY}, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), layer, 1, CPU, config, {})
    return ours, reference


@pytest.mark.parametrize(("x_shape", "activation", "trans_b", "residual", "matmul"), CASES)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_quantized_linear_matches_the_reference(x_shape, activation, trans_b, residual, matmul, precision):
    """Float A quantized on load, bias, residual, activations; batch dims folded into rows."""
    layer, feeds, _, _, _ = _quantized(x_shape, activation, trans_b, residual, matmul)
    ours, reference = _kernels(layer, precision)
    got, want = ours(feeds)[0], reference(feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert relative_error(got, want) <= TOLERANCE[precision]


def test_an_int8_input_and_an_unaligned_int8_output():
    """The chained forms: A already int8 is read as it is; an int8 output of 24 channels (24-byte rows, TMA needs
    multiples of 16) is refused with the reason when run (`supports` declines such shapes first). (Requantized
    outputs are checked on the kernel: `test_triton_conv_tma`.)"""
    layer, feeds, _, _, _ = _quantized([2, 8, 32], "Relu", False, False, True)
    quantized = [quantize_activation(feeds[0], float(layer.attributes["x_scale"]), "int8")]
    ours, reference = _kernels(layer, "fp16")
    got, want = ours(quantized)[0], reference(quantized)[0]
    assert relative_error(got, want) <= TOLERANCE["fp16"]
    layer.attributes["y_scale"] = 0.02
    ours, _ = _kernels(layer, "fp16")
    with pytest.raises(ValueError, match="16-byte aligned"):
        ours(quantized)


def test_the_tactic_declines_off_cuda():
    layer, _, _, _, _ = _quantized([5, 32], "Relu", True, False, False)
    assert "needs CUDA" in tactic_by_key(TACTIC).supports(layer, 1, CPU)


@pytest.mark.gpu
def test_the_quantized_linear_is_a_correct_candidate_on_cuda():
    layer, feeds, _, _, _ = _quantized([4, 64, 64], "Gelu", False, True, True, n=48)
    choice = autotune(
        layer, 1, [feeds[0].cuda(), None, None, feeds[1].cuda()], "cuda", effort=0, precisions=("fp32", "fp16"),
        exhaustive=True,
    )  # fmt: skip
    ours = [c for c in choice.candidates if c.tactic == TACTIC]
    assert ours and all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]
