"""The direct few-channel convolution tactic: its reasons for declining, its kernel through `build` under the
interpreter reading the network's float32 NCHW input as it comes, and its place among the candidates on CUDA."""

import math

import pytest
import torch

from tensorforge.tactics import triton_conv
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.stem_support import stem_node

DIRECT = "triton.conv-direct"
TINY = {"block_m": 16, "block_n": 16, "num_warps": 1}
CPU = torch.device("cpu")


def _stem(channels=3, cout=16, kernel=3, group=1, size=9):
    """Conv 3×3/2 + BatchNorm-free SiLU (Sigmoid · x) on a `channels`-channel image, optimized into one FusedConv."""
    return stem_node(channels, cout, kernel, pad=1, stride=2, size=size, group=group)


def test_supports_gives_reasons():
    tactic = tactic_by_key(DIRECT)
    cuda = torch.device("cuda")
    assert "needs CUDA" in tactic.supports(_stem(), 1, CPU)
    assert tactic.supports(_stem(), 1, cuda) is None
    assert "one group" in tactic.supports(_stem(channels=4, group=2), 1, cuda)
    assert "at most 64 taps" in tactic.supports(_stem(channels=8), 1, cuda)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_reads_the_input_as_it_comes_under_the_interpreter(precision, monkeypatch):
    """In an fp16 variant the float32 NCHW input reaches the kernel unconverted (no cast, no layout pass); the
    output is channels_last in the variant's type and matches the reference."""
    torch.manual_seed(0)
    seen = []
    real = triton_conv.conv2d_direct
    monkeypatch.setattr(triton_conv, "conv2d_direct", lambda x, *a, **k: seen.append(x) or real(x, *a, **k))
    node = _stem()
    kernel = build_layer_kernel(
        tactic_by_key(DIRECT), node, 1, CPU, {"precision": precision, "layout": "NHWC", **TINY}, {}
    )
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})
    x = torch.randn(2, 3, 9, 9)
    got = kernel([x])[0]
    assert seen[0] is x
    assert got.dtype == {"fp32": torch.float32, "fp16": torch.float16}[precision]
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(got, reference([x])[0]) <= TOLERANCE[precision]


@pytest.mark.gpu
def test_the_direct_conv_is_a_correct_candidate_on_cuda():
    torch.manual_seed(1)
    node = _stem(size=64)
    x = torch.randn(2, 3, 64, 64, device="cuda")
    choice = autotune(node, 1, [x, None, None], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == DIRECT]
    assert len(ours) == 2 * len(tactic_by_key(DIRECT).space(0))
    assert all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]
