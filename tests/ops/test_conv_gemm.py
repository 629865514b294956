"""The CPU im2col + GEMM convolution path against torch's convolution in float64."""

import pytest
import torch
import torch.nn.functional as F

from tensorforge.ops import conv


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "dilation", "pads"),
    [
        ((2, 3, 9, 11), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        ((1, 4, 10, 7), (3, 2), (2, 1), (1, 2), (0, 2, 1, 0)),
        ((3, 5, 6, 6), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
        ((1, 2, 13, 8), (5, 3), (3, 2), (2, 1), (2, 1, 2, 1)),
    ],
)
@pytest.mark.parametrize("budget", [1 << 24, 7])  # one chunk, and one output row per chunk
def test_gemm_convolution_matches_direct(monkeypatch, shape, kernel, stride, dilation, pads, budget):
    monkeypatch.setattr(conv, "_GEMM_COLUMN_BUDGET", budget)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    w = torch.randn((6, shape[1], *kernel), generator=generator, dtype=torch.float64)
    b = torch.randn(6, generator=generator, dtype=torch.float64)
    y = conv.convolution(x, w, b, "NOTSET", list(dilation), 1, list(pads), list(stride))
    padded = F.pad(x, (pads[1], pads[3], pads[0], pads[2]))
    expected = F.conv2d(padded, w, b, stride, 0, dilation)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_kernel_larger_than_input_is_an_error():
    with pytest.raises(ValueError, match="exceeds the padded input"):
        conv.convolution(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 3, 3), None, "NOTSET", None, 1, None, None)
