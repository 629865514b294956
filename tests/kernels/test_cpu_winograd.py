"""The C++ Winograd convolution (AVX-512) against a float64 convolution with the fused epilogue, and its transforms
against the definition in exact arithmetic (built with the host's compiler on first use, then cached; skipped where
no compiler, ninja or AVX-512 is found)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import winograd as wg
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or wg.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

# Normwise against float64. F(2×2, 3×3) adds and subtracts its inputs (no rounding beyond the direct sum's);
# F(4×4, 3×3) multiplies by up to 8 and 5 in the transforms and by 1/24 in the filter's, which costs about a
# decimal digit: 2e-5 (measured up to 1e-5 over 512 channels; the autotuner's fp32 tolerance is 1e-4).
BOUND = {2: 2e-6, 4: 2e-5}


def _matrix(rows) -> list[list[Fraction]]:
    return [[Fraction(v) for v in row] for row in rows]


def _product(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def _transposed(a):
    return [list(row) for row in zip(*a, strict=True)]


@pytest.mark.parametrize("m", sorted(wg.TRANSFORMS))
def test_the_transforms_compute_a_correlation_exactly(m):
    """Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A is the m×m valid correlation of an (m+2)×(m+2) tile d with a 3×3 filter g, in
    rational arithmetic: any entry of Bᵀ, G or Aᵀ mistyped breaks it."""
    bt, g_matrix, at = (_matrix(t) for t in wg.TRANSFORMS[m])
    a = m + 2
    d = [[Fraction((7 * i + 3 * j) % 11 - 5, 3) for j in range(a)] for i in range(a)]
    g = [[Fraction((5 * i + 2 * j) % 7 - 3, 2) for j in range(3)] for i in range(3)]
    u = _product(_product(g_matrix, g), _transposed(g_matrix))
    v = _product(_product(bt, d), _transposed(bt))
    y = _product(_product(at, [[u[i][j] * v[i][j] for j in range(a)] for i in range(a)]), _transposed(at))
    want = [[sum(d[i + s][j + t] * g[s][t] for s in range(3) for t in range(3)) for j in range(m)] for i in range(m)]
    assert y == want


def _reference(x, w, b, pads, out_hw, z, pre, post) -> torch.Tensor:
    top, left = pads
    bottom, right = out_hw[0] + 2 - x.shape[2] - top, out_hw[1] + 2 - x.shape[3] - left
    y = F.conv2d(F.pad(x.double(), (left, right, top, bottom)), w.double(), None if b is None else b.double())
    y = apply_activation(y, pre, [])
    return y if z is None else apply_activation(y + z.double(), post, [])


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


CASES = [  # (n, c, k, h, w, pads (top, left), out_hw)
    (1, 32, 64, 9, 11, (1, 1), (9, 11)),  # 'same' padding, sizes no output tile divides
    (2, 17, 37, 10, 7, (1, 1), (10, 7)),  # channels no vector divides, two images, a narrower last block
    (1, 24, 100, 8, 8, (0, 0), (6, 6)),  # no padding; two column blocks, the second narrower
    (1, 16, 16, 3, 3, (2, 2), (5, 5)),  # more padding than input: tiles wholly in it
    (1, 20, 24, 7, 9, (0, 2), (5, 9)),  # padding on one side of one axis
    (3, 64, 48, 14, 14, (1, 1), (14, 14)),  # more tiles than an item holds: several items, several images
]


@needs_kernel
@pytest.mark.parametrize("m", sorted(wg.TRANSFORMS))
@pytest.mark.parametrize("tile", wg.TILES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_it_matches_the_float64_convolution(m, tile, case, residual):
    n, c, k, h, w, pads, out_hw = case
    torch.manual_seed(c + k)
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(k, c, 3, 3) / (9 * c) ** 0.5, torch.randn(k)
    z = torch.randn(n, k, *out_hw).contiguous(memory_format=torch.channels_last) if residual else None
    post = "HardSwish" if residual else ""
    out = torch.full((n, k, *out_hw), math.nan).contiguous(memory_format=torch.channels_last)
    conv = wg.WinogradConv(weight, bias, m, "Relu", post=post, tile=tile)
    got = conv(x, pads, out_hw, z, out)
    assert got is out and not got.isnan().any()
    assert _error(got, _reference(x, weight, bias, pads, out_hw, z, "Relu", post)) <= BOUND[m]


@needs_kernel
@pytest.mark.parametrize("m", sorted(wg.TRANSFORMS))
def test_resnet_layers_stay_within_the_bound(m):
    """ResNet-50's deepest 3×3 layer (512 channels at 7×7, one item a block of output channels), on a post-ReLU
    input as in the network."""
    torch.manual_seed(m)
    x = torch.randn(1, 512, 7, 7).relu().contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(512, 512, 3, 3) / 4608**0.5, torch.randn(512) * 0.1
    got = wg.WinogradConv(weight, bias, m, "Relu")(x, (1, 1), (7, 7))
    assert _error(got, _reference(x, weight, bias, (1, 1), (7, 7), None, "Relu", "")) <= BOUND[m]


PARAMS = {
    "": [], "Relu": [], "Clip": [0.0, 6.0], "LeakyRelu": [0.1], "Sigmoid": [], "HardSigmoid": [1 / 6, 0.5],
    "HardSwish": [], "SiLU": [], "Gelu": [],
}  # fmt: skip


@needs_kernel
@pytest.mark.parametrize("act", wg.ACTIVATIONS)
def test_every_activation_before_and_after_a_residual(act):
    torch.manual_seed(3)
    x = torch.randn(1, 20, 6, 6).contiguous(memory_format=torch.channels_last) * 4  # the saturating parts too
    z = torch.randn(1, 24, 6, 6).contiguous(memory_format=torch.channels_last) * 3
    weight = torch.randn(24, 20, 3, 3) / 180**0.5
    params = tuple(activation_args(act, PARAMS[act])[1:]) if act else (0.0, 0.0)
    conv = F.conv2d(x.double(), weight.double(), None, 1, 1)
    got = wg.WinogradConv(weight, None, 4, pre=act, pre_params=params)(x, (1, 1), (6, 6))
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert _error(got, apply_activation(conv, act, PARAMS[act])) <= BOUND[4]
    got = wg.WinogradConv(weight, None, 4, pre="Relu", post=act, post_params=params)(x, (1, 1), (6, 6), z)
    assert _error(got, apply_activation(torch.relu(conv) + z.double(), act, PARAMS[act])) <= BOUND[4]


@needs_kernel
def test_a_channel_slice_and_an_nchw_input_are_read_as_given():
    torch.manual_seed(5)
    host = torch.randn(1, 48, 7, 9).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(32, 20, 3, 3) / 180**0.5
    conv = wg.WinogradConv(weight)
    want = F.conv2d(host[:, 10:30].double(), weight.double(), None, 1, 1)
    assert _error(conv(host[:, 10:30], (1, 1), (7, 9)), want) <= BOUND[4]
    assert _error(conv(host[:, 10:30].contiguous(), (1, 1), (7, 9)), want) <= BOUND[4]


@needs_kernel
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c(torch.randn(1, 8, 5, 5, dtype=torch.float64), (1, 1), (5, 5)), "x must be a 4-D float32"),
        (lambda c: c(torch.randn(1, 9, 5, 5), (1, 1), (5, 5)), "x has 9 channels; this convolution takes 8"),
        (lambda c: c(torch.randn(1, 8, 5, 5), (1, 1), (5, 5), torch.randn(1, 16, 4, 4)), "residual must be"),
        (lambda c: c(torch.randn(1, 8, 5, 5), (1, 1), (5, 5), None, torch.empty(1, 16, 5, 5)), "out must be"),
    ],
)
def test_bad_operands_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call(wg.WinogradConv(torch.randn(16, 8, 3, 3)))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: wg.WinogradConv(torch.randn(16, 8, 3, 3), pre="Mish"), "no activation 'Mish'"),
        (lambda: wg.WinogradConv(torch.randn(16, 8, 3, 3), tile=(4, 4)), "tiles"),
        (lambda: wg.WinogradConv(torch.randn(16, 8, 3, 3), m=6), "output tiles of"),
        (lambda: wg.WinogradConv(torch.randn(16, 8, 5, 5)), "3×3 weight"),
    ],
)
def test_what_it_cannot_compute_is_refused_on_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_an_item_holds_whole_register_tiles_within_its_scratch():
    for m in wg.TRANSFORMS:
        for channels in (16, 64, 512, 2048):
            tiles = wg.tiles_per_item(m, channels, 3, 8)
            assert tiles % 8 == 0 and tiles >= 8
            assert tiles == 8 or 4 * (m + 2) ** 2 * tiles * (channels + 48) <= wg.SCRATCH_BYTES


@needs_kernel
@pytest.mark.parametrize("m", sorted(wg.TRANSFORMS))
def test_it_writes_into_a_channel_slice_and_nowhere_else(m):
    """Into channels 8 … 8+37 of a wider channels_last tensor (a concatenation's part): the slice gets the
    convolution, the channels around it keep their poison."""
    torch.manual_seed(m)
    x = torch.randn(2, 24, 9, 10).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(37, 24, 3, 3) / 216**0.5, torch.randn(37)
    host = torch.full((2, 64, 9, 10), math.nan).contiguous(memory_format=torch.channels_last)
    got = wg.WinogradConv(weight, bias, m, "Relu")(x, (1, 1), (9, 10), None, host[:, 8:45])
    assert got.data_ptr() == host[:, 8:45].data_ptr()
    assert _error(host[:, 8:45], _reference(x, weight, bias, (1, 1), (9, 10), None, "Relu", "")) <= BOUND[m]
    assert host[:, :8].isnan().all() and host[:, 45:].isnan().all()


# -- bf16 ----------------------------------------------------------------------------------------------------------

bf16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
# F(2×2) in bf16: the output's rounding (2⁻⁸ = 3.9e-3) and as much again from rounding V and U (2⁻⁹ each; a V is
# a signed sum of up to four inputs, a U of up to nine weights over four, and Aᵀ M A adds nine products' errors):
# measured 3.1-5.1e-3 over these cases, against 3-4e-2 for F(4×4) in bf16, which is why that is refused.
BF16_BOUND = 2 * 2.0**-8


@needs_kernel
@bf16
@pytest.mark.parametrize("tile", wg.TILES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_bf16_f2_matches_the_float64_convolution_of_its_bf16_operands(tile, case, residual):
    n, c, k, h, w, pads, out_hw = case
    torch.manual_seed(c + k)
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last).bfloat16()
    weight, bias = (torch.randn(k, c, 3, 3) / (9 * c) ** 0.5).bfloat16(), torch.randn(k).bfloat16()
    z = torch.randn(n, k, *out_hw).contiguous(memory_format=torch.channels_last).bfloat16() if residual else None
    post = "HardSwish" if residual else ""
    out = torch.full((n, k, *out_hw), math.nan, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    got = wg.WinogradConv(weight, bias, 2, "Relu", post=post, tile=tile)(x, pads, out_hw, z, out)
    assert got is out and got.dtype == torch.bfloat16 and not got.isnan().any()
    assert _error(got, _reference(x, weight, bias, pads, out_hw, z, "Relu", post)) <= BF16_BOUND


@needs_kernel
@bf16
def test_bf16_resnet_layers_and_a_channel_slice():
    """ResNet-50's 56² and 7² layers on post-ReLU inputs, the first read from a channel slice and written into one
    whose neighbours keep their poison."""
    for c, size in ((64, 56), (512, 7)):
        torch.manual_seed(c)
        host = torch.randn(1, c + 16, size, size).relu().contiguous(memory_format=torch.channels_last).bfloat16()
        x = host[:, 8 : 8 + c]
        weight, bias = (torch.randn(c, c, 3, 3) / (9 * c) ** 0.5).bfloat16(), (torch.randn(c) * 0.1).bfloat16()
        wide = torch.full((1, c + 32, size, size), math.nan, dtype=torch.bfloat16)
        wide = wide.contiguous(memory_format=torch.channels_last)
        got = wg.WinogradConv(weight, bias, 2, "Relu")(x, (1, 1), (size, size), None, wide[:, 16 : 16 + c])
        assert _error(got, _reference(x, weight, bias, (1, 1), (size, size), None, "Relu", "")) <= BF16_BOUND
        assert wide[:, :16].isnan().all() and wide[:, 16 + c :].isnan().all()


@needs_kernel
@bf16
def test_bf16_refuses_f4_and_float32_operands_by_name():
    weight = torch.randn(8, 8, 3, 3).bfloat16()
    with pytest.raises(ValueError, match=r"F\(4×4, 3×3\) in bf16"):
        wg.WinogradConv(weight, None, 4)
    with pytest.raises(ValueError, match="x must be a 4-D bf16"):
        wg.WinogradConv(weight, None, 2)(torch.randn(1, 8, 5, 5), (1, 1), (5, 5))
