"""`cpu.patchify`: a FusedConv whose windows tile its input through the autotuner and `build_layer_kernel` against
the reference tactic, reading the NCHW network input as it comes, and its reasons for declining."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import fused_conv

PATCHIFY = "cpu.patchify"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or pw.problem()


def _layer(activation="", c=3, k=24, window=4, residual=False, **conv):
    """The fused node of Conv (+ Add) (+ activation) on a [2, c, 18, 20] input, by default with the window as its
    stride and no padding, and its non-constant inputs."""
    rng = np.random.default_rng(c + k)
    w = rng.standard_normal((k, c // conv.get("group", 1), window, window)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    conv.setdefault("strides", [window, window])
    out = (2, k, 18 // window, 20 // window)
    node = fused_conv((2, c, 18, 20), w, b, out if residual else None, activation, **conv)
    torch.manual_seed(c + k)
    return node, [torch.randn(2, c, 18, 20)] + ([torch.randn(*out)] if residual else [])


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
@pytest.mark.parametrize(("activation", "conv"), [("", {}), ("Relu", {"window": 3, "c": 8, "residual": True})])
def test_the_autotuner_times_it_and_it_matches_the_reference(activation, conv):
    node, feeds = _layer(activation, **conv)
    choice = autotune(node, 1, [feeds[0], None, None, *feeds[1:]], "cpu", effort=0)
    timed = [c for c in choice.candidates if c.tactic == PATCHIFY]
    assert timed and all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    kernel = build_layer_kernel(tactic_by_key(PATCHIFY), node, 1, CPU, {"precision": "fp32", "layout": "NHWC",
                                                                        "tile": list(pw.ROW_TILES[0])}, {})  # fmt: skip
    got = kernel(feeds)[0]  # the NCHW input, read as it is
    assert got.is_contiguous(memory_format=torch.channels_last)
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (lambda: _layer(strides=[2, 2]), "windows that tile the input only"),
        (lambda: _layer(pads=[1, 1, 1, 1]), "no padding"),
        (lambda: _layer(window=2, dilations=[2, 2]), "no dilation"),
        (lambda: _layer(window=1), "a 1×1 window"),
        (lambda: _layer(c=4, k=4, group=4), "one group only"),
        (lambda: _layer("Mish"), "no activation 'Mish'"),
    ],
)
def test_declines_what_the_kernel_does_not_run(layer, reason):
    node, _ = layer()
    assert reason in tactic_by_key(PATCHIFY).supports(node, 1, CPU)


def test_declines_off_the_cpu():
    node, _ = _layer()
    assert tactic_by_key(PATCHIFY).supports(node, 1, torch.device("cuda")) == "a CPU kernel"
