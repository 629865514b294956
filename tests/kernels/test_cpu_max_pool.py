"""The C++ max pool against the reference MaxPool (exact: a maximum is one of its inputs), in every type it takes,
with a partial chunk of channels, a channel slice read in place, padding, dilation, ceil mode and SAME padding, and
a NaN that the window's maximum keeps (built with the host's compiler on first use; skipped where none is found)."""

from __future__ import annotations

import pytest
import torch

from tensorforge.kernels.cpu import max_pool as mp
from tensorforge.kernels.cpu.extension import compiler_problem
from tests.kernels.test_triton_pool import _geometry, _reference

pytestmark = pytest.mark.skipif(compiler_problem() is not None, reason=str(compiler_problem()))

CASES = [
    ((1, 64, 20, 22), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # ResNet's
    ((2, 70, 8, 9), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),  # 64 + 6 float32 channels
    ((2, 3, 10, 7), {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((1, 300, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),  # int8: 256 + 44
    ((1, 5, 9, 9), {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]}),  # YOLO's SPPF window
]


def _values(shape, dtype, generator):
    x = torch.randn(shape, generator=generator) * 40
    if dtype in (torch.int8, torch.uint8):
        x = x.clamp(-128, 127) if dtype == torch.int8 else x.abs().clamp(max=255)
    return x.to(dtype).contiguous(memory_format=torch.channels_last)


def _pool(x, attributes):
    kernel, strides, dilations, begin, _, out = _geometry(x.shape, attributes)
    return mp.max_pool2d(x, kernel, strides, dilations, begin, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.uint8], ids=str)
@pytest.mark.parametrize(("shape", "attributes"), CASES)
def test_matches_the_reference_exactly(dtype, shape, attributes):
    x = _values(shape, dtype, torch.Generator().manual_seed(sum(shape)))
    got = _pool(x, attributes)
    want = _reference(x.float(), attributes)
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    assert got.shape == want.shape
    assert torch.equal(got.float(), want)


def test_reads_a_channel_slice_in_place():
    whole = _values((2, 48, 9, 9), torch.float32, torch.Generator().manual_seed(3))
    x = whole[:, 8:40]  # channels contiguous, pixels of stride 48
    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    assert torch.equal(_pool(x, attributes), _reference(x.contiguous(), attributes))


def test_a_nan_in_a_window_is_its_maximum():
    x = _values((1, 80, 6, 6), torch.float32, torch.Generator().manual_seed(4))
    x[0, 3, 2, 2] = float("nan")  # in output pixel (1, 1)'s window alone
    x[0, 70, 5, 5] = float("inf")  # the largest value of (2, 2)'s
    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    got = _pool(x, attributes)
    want = _reference(x, attributes)
    assert torch.equal(got.isnan(), want.isnan()) and got[0, 3, 1, 1].isnan() and got.isnan().sum() == 1
    assert got[0, 70, 2, 2] == float("inf")
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


def test_refuses_channels_first_and_other_types():
    with pytest.raises(RuntimeError, match="channels contiguous"):
        mp.max_pool2d(torch.randn(1, 4, 5, 5), [2, 2], [2, 2], [1, 1], [0, 0], [2, 2])
    x = torch.randn(1, 4, 5, 5).to(torch.float64).contiguous(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError, match="float32, bf16, int8 or uint8"):
        mp.max_pool2d(x, [2, 2], [2, 2], [1, 1], [0, 0], [2, 2])
