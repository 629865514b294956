"""`triton.cudnn-epilogue`: torch's (cuDNN's) convolution, then FusedConv's epilogue in one Triton pass
(`kernels.triton.conv.conv_epilogue_nhwc`), under the interpreter on the CPU and as a candidate on CUDA."""

import math

import pytest
import torch

from tensorforge.kernels.triton.conv import conv_epilogue_nhwc
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.test_triton_conv_tactic import _feeds, _layer

TACTIC = "triton.cudnn-epilogue"
CPU = torch.device("cpu")
CUDA = torch.device("cuda")


def test_it_leaves_the_epilogues_cudnn_fuses_to_cudnn():
    tactic = tactic_by_key(TACTIC)
    assert "needs CUDA" in tactic.supports(_layer(activation="HardSwish"), 1, CPU)
    assert tactic.supports(_layer(activation="HardSwish"), 1, CUDA) is None
    assert tactic.supports(_layer(residual=False, activation="Sigmoid"), 1, CUDA) is None
    assert "vendor.cudnn-fused" in tactic.supports(_layer(activation="Relu"), 1, CUDA)
    assert "vendor.cudnn-fused" in tactic.supports(_layer(residual=False, activation="Relu"), 1, CUDA)
    assert "vendor.cudnn-fused" in tactic.supports(_layer(residual=False, activation=""), 1, CUDA)
    swish = _layer(activation="HardSwish")
    swish.attributes["post"] = "Swish"
    assert "Swish" in tactic.supports(swish, 1, CUDA)


@pytest.mark.parametrize(
    ("attributes", "residual", "activation"),
    [
        ({"pads": [1, 1, 1, 1]}, True, "HardSwish"),
        ({"pads": [0, 1, 1, 0], "strides": [2, 2]}, False, "Sigmoid"),
        ({"auto_pad": "SAME_UPPER", "dilations": [2, 2]}, True, "Elu"),
        ({"pads": [2, 2, 2, 2], "strides": [3, 3]}, False, "Tanh"),
    ],
)
def test_built_kernel_matches_the_reference_under_the_interpreter(attributes, residual, activation):
    torch.manual_seed(0)
    node = _layer(9, attributes, residual=residual, activation=activation)
    kernel = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, {"precision": "fp32", "layout": "NHWC"}, {})
    feeds, reference = _feeds(node, 9)
    got = kernel(feeds)[0]
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.isnan().any()
    assert relative_error(got, reference(feeds)[0]) <= TOLERANCE["fp32"]


def test_the_epilogue_runs_in_place_with_a_broadcast_residual():
    torch.manual_seed(1)
    acc = torch.randn(2, 24, 5, 6).contiguous(memory_format=torch.channels_last)
    bias, residual = torch.randn(24), torch.randn(1, 24, 1, 6)
    want = torch.nn.functional.hardswish(torch.relu(acc + bias.reshape(1, -1, 1, 1)) + residual)
    got = conv_epilogue_nhwc(
        acc.clone(), bias, residual, pre=activation_args("Relu"), post=activation_args("HardSwish")
    )
    torch.testing.assert_close(got, want)
    inplace = acc.clone()
    assert (
        conv_epilogue_nhwc(
            inplace, bias, residual, pre=activation_args("Relu"), post=activation_args("HardSwish"), out=inplace
        )
        is inplace
    )
    torch.testing.assert_close(inplace, want)


def test_bad_operands_are_named():
    acc = torch.randn(1, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="acc must be a 4-D float16/bfloat16/float32 channels_last tensor"):
        conv_epilogue_nhwc(torch.randn(1, 8, 3, 3)[:, :, :, :2].contiguous())
    with pytest.raises(ValueError, match=r"bias must be \[8\]"):
        conv_epilogue_nhwc(acc, torch.randn(4))
    with pytest.raises(ValueError, match="does not broadcast"):
        conv_epilogue_nhwc(acc, None, torch.randn(1, 8, 2, 2))
    with pytest.raises(ValueError, match="out is"):
        conv_epilogue_nhwc(acc, out=torch.empty(1, 8, 3, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["HardSwish", "Sigmoid"])
def test_it_is_a_correct_candidate_on_cuda(activation):
    torch.manual_seed(2)
    node = _layer(28, activation=activation)
    feeds, _ = _feeds(node, 28, "cuda")
    choice = autotune(
        node, 1, [feeds[0], None, None, feeds[1]], "cuda", effort=0, precisions=("fp16", "bf16"), exhaustive=True
    )
    candidates = [c for c in choice.candidates if c.tactic == TACTIC]
    assert len(candidates) == 2 and all(math.isfinite(c.median_ms) for c in candidates), [c.note for c in candidates]
