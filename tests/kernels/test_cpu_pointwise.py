"""The C++ 1×1 convolution (AVX-512) against a float64 convolution with the fused epilogue (built with the host's
compiler on first use, then cached; skipped where no compiler, ninja, AVX-512 or AVX2 is found)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or pw.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

BOUND = 2e-6  # normwise against float64: float32 sums of at most 200 terms, exponentials within 2 ulp
ACTIVATIONS = {
    "": [], "Relu": [], "Clip": [0.0, 6.0], "LeakyRelu": [0.1], "Sigmoid": [], "HardSigmoid": [1 / 6, 0.5],
    "HardSwish": [], "SiLU": [], "Gelu": [],
}  # fmt: skip


def _reference(x, w, b, z, pre, pre_params, post, post_params) -> torch.Tensor:
    y = apply_activation(F.conv2d(x.double(), w.double(), None if b is None else b.double()), pre, pre_params)
    return y if z is None else apply_activation(y + z.double(), post, post_params)


def _run(x, w, b, z=None, pre="", pre_params=(), post="", post_params=(), tile=None, out=None) -> torch.Tensor:
    if out is None:
        out = torch.full((x.shape[0], w.shape[0], *x.shape[2:]), math.nan, dtype=x.dtype)
        out = out.contiguous(memory_format=torch.channels_last)
    conv = pw.PointwiseConv(
        w, b, pre, activation_args(pre, pre_params)[1:], post, activation_args(post, post_params)[1:], tile
    )
    return conv(x, z, out)


def _operands(n, c, k, h, w, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    return x, torch.randn(k, c, 1, 1) / c**0.5, torch.randn(k)


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


# (N, C, K, H, W): output channels of one to seven vectors, whole and partial (16, 24, 32, 48, 64, 80, 100), one
# channel in or out, pixel counts no tile divides (1, 13, 50), two images, a network's shapes shrunk.
SHAPES = [
    (1, 16, 16, 4, 4), (1, 16, 24, 3, 5), (1, 8, 32, 5, 5), (1, 20, 48, 2, 3), (1, 40, 64, 5, 10),
    (1, 72, 80, 7, 7), (1, 17, 100, 1, 13), (1, 1, 40, 3, 3), (1, 64, 1, 3, 3), (1, 3, 16, 1, 1),
    (2, 24, 72, 5, 5), (1, 200, 80, 7, 7), (2, 96, 24, 6, 9),
]  # fmt: skip


@pytest.mark.parametrize("tile", pw.TILES)
@pytest.mark.parametrize(("n", "c", "k", "h", "w"), SHAPES)
def test_shapes_against_the_float64_convolution(n, c, k, h, w, tile):
    x, weight, b = _operands(n, c, k, h, w, seed=c + k)
    got = _run(x, weight, b, pre="Relu", tile=tile)
    want = _reference(x, weight, b, None, "Relu", [], "", [])
    assert not got.isnan().any()  # every element written (the output starts as NaN)
    assert _error(got, want) <= BOUND


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_every_activation_before_and_after_a_residual(act):
    x, weight, b = _operands(1, 24, 40, 5, 6, seed=2)
    x = x * 4  # reach the saturating parts of Clip, HardSigmoid, HardSwish and the exponentials' tails
    z = torch.randn(1, 40, 5, 6).contiguous(memory_format=torch.channels_last) * 3
    params = ACTIVATIONS[act]
    got = _run(x, weight, b, pre=act, pre_params=params)
    assert _error(got, _reference(x, weight, b, None, act, params, "", [])) <= BOUND
    got = _run(x, weight, b, z, "Relu", [], act, params)
    assert _error(got, _reference(x, weight, b, z, "Relu", [], act, params)) <= BOUND


def test_without_bias_and_with_a_residual_only():
    x, weight, _ = _operands(2, 32, 48, 4, 4, seed=4)
    z = torch.randn(2, 48, 4, 4).contiguous(memory_format=torch.channels_last)
    assert _error(_run(x, weight, None, z), _reference(x, weight, None, z, "", [], "", [])) <= BOUND


def test_reads_and_writes_channel_slices_of_larger_tensors():
    """Input, residual and output each a channel slice of a channels_last tensor (values inside concatenations):
    read and written through their strides, the output's neighbouring channels untouched."""
    torch.manual_seed(6)
    x = torch.randn(2, 50, 5, 7).contiguous(memory_format=torch.channels_last)[:, 10:30]
    z = torch.randn(2, 60, 5, 7).contiguous(memory_format=torch.channels_last)[:, 5:45]
    weight, b = torch.randn(40, 20, 1, 1), torch.randn(40)
    host = torch.full((2, 44, 5, 7), 7.0).contiguous(memory_format=torch.channels_last)
    out = host[:, 2:42]
    _run(x, weight, b, z, "", [], "Relu", [], out=out)
    assert _error(out, _reference(x, weight, b, z, "", [], "Relu", [])) <= BOUND
    assert (host[:, :2] == 7.0).all() and (host[:, 42:] == 7.0).all()


@pytest.mark.parametrize("tile", pw.TILES)
@pytest.mark.parametrize("budget", [pw.SCALED_BYTES, 4000])
@pytest.mark.parametrize(("n", "c", "k", "size"), [(3, 40, 56, 5), (4, 17, 200, 5), (2, 40, 80, 9), (5, 40, 9, 5)])
def test_each_images_input_channels_scaled(tile, budget, n, c, k, size, monkeypatch):
    """A squeeze-excite gate: conv(x · scale[n]) per image on a scaled copy of each image's inputs (fewer pixels than
    output channels rounded up to 16) or of its weight (two column blocks, the second narrower, for 80 channels),
    made all at once or an image or two at a time (a small budget); 5×5 and 9×9 pixels, which tiles of 8 and 6 do
    not divide."""
    monkeypatch.setattr(pw, "SCALED_BYTES", budget)
    x, weight, b = _operands(n, c, k, size, size, seed=11)
    scale = torch.rand(n, c)
    z = torch.randn(n, k, size, size).contiguous(memory_format=torch.channels_last)
    conv = pw.PointwiseConv(weight, b, "Relu", post="HardSwish", tile=tile)
    out = torch.full((n, k, size, size), math.nan).contiguous(memory_format=torch.channels_last)
    got = conv(x, z, out, scale)
    want = _reference(x * scale[:, :, None, None].double(), weight, b, z, "Relu", [], "HardSwish", [])
    assert not got.isnan().any() and _error(got, want) <= BOUND


def test_images_of_no_pixels_with_a_gate():
    """Images of no pixels (a map 0 rows high): an empty output, not a division by their pixel count."""
    conv = pw.PointwiseConv(torch.randn(24, 40, 1, 1))
    x = torch.randn(2, 40, 0, 5).contiguous(memory_format=torch.channels_last)
    assert conv(x, scale=torch.rand(2, 40)).shape == (2, 24, 0, 5)


@pytest.mark.parametrize("tile", pw.TILES)
@pytest.mark.parametrize(("n", "c", "k", "h", "w"), [(1, 960, 1280, 7, 7), (3, 40, 37, 5, 3), (2, 17, 8, 1, 1)])
def test_the_product_of_each_images_mean_pixel(tile, n, c, k, h, w):
    """`pooled`: a global average pool then the product, one call: a classifier's head; a channel count no vector
    divides, images of one pixel, a product as wide as MobileNetV3's."""
    x, weight, b = _operands(n, c, k, h, w, seed=12)
    got = pw.PointwiseConv(weight, b, "HardSwish", tile=tile).pooled(x)
    want = _reference(x.double().mean((2, 3), keepdim=True), weight, b, None, "HardSwish", [], "", [])
    assert got.shape == (n, k) and not got.isnan().any()
    assert _error(got, want.reshape(n, k)) <= BOUND


def test_the_pooled_product_reads_a_channel_slice_and_nchw_input():
    x, weight, b = _operands(2, 20, 24, 4, 5, seed=13)
    host = torch.randn(2, 28, 4, 5).contiguous(memory_format=torch.channels_last)
    host[:, 3:23] = x
    want = _reference(x.double().mean((2, 3), keepdim=True), weight, b, None, "Relu", [], "", []).reshape(2, 24)
    conv = pw.PointwiseConv(weight, b, "Relu")
    assert _error(conv.pooled(host[:, 3:23]), want) <= BOUND
    assert _error(conv.pooled(x.contiguous()), want) <= BOUND


def test_a_nan_reaches_exactly_its_pixel():
    x, weight, b = _operands(1, 16, 24, 5, 5, seed=8)
    x[0, 3, 2, 1] = math.nan
    got = _run(x, weight, b, pre="Relu")
    want = _reference(x, weight, b, None, "Relu", [], "", [])
    assert torch.equal(got.isnan(), want.isnan()) and got[0, :, 2, 1].isnan().all() and got.isnan().sum() == 24
    assert _error(got.nan_to_num(), want.nan_to_num()) <= BOUND


def test_nchw_operands_are_made_channels_last_and_a_new_output_returned():
    x, weight, b = _operands(2, 20, 24, 5, 6, seed=10)
    z = torch.randn(2, 24, 5, 6)
    got = pw.PointwiseConv(weight, b, post="Relu")(x.contiguous(), z)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert _error(got, _reference(x, weight, b, z, "", [], "Relu", [])) <= BOUND


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda w, x: pw.PointwiseConv(w, pre="Mish"), "no activation 'Mish'"),
        (lambda w, x: pw.PointwiseConv(w, tile=(4, 4)), "tiles"),
        (lambda w, x: pw.PointwiseConv(w)(x.double()), "x must be a 4-D float32"),
        (lambda w, x: pw.PointwiseConv(w)(x, torch.randn(1, 24, 4, 4).half()), "residual must be a 4-D float32"),
        (lambda w, x: pw.PointwiseConv(w)(x, None, torch.empty(1, 24, 4, 4)), "out must be a 4-D float32"),
        (lambda w, x: pw.PointwiseConv(w)(x[:, :8]), "x has 8 channels; this 1×1 convolution takes 16"),
        (lambda w, x: pw.PointwiseConv(w)(x, scale=torch.ones(2, 16)), r"scale must be a float32 tensor of shape \(1,"),
        (lambda w, x: pw.PointwiseConv(w).pooled(x[:, :8]), "x has 8 channels; this 1×1 convolution takes 16"),
    ],
)
def test_bad_arguments_are_refused_by_name(make, message):
    x, weight, _ = _operands(1, 16, 24, 4, 4)
    with pytest.raises(ValueError, match=message):
        make(weight, x)


# -- bf16 ----------------------------------------------------------------------------------------------------------

bf16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
BF16_BOUND = 2.0**-8 + 1e-5  # the output's one rounding to bf16 (half an ulp of 8 significant bits), float32 sums


def _bf16_case(n, c, k, h, w, seed):
    """bf16 operands, and the same values in float64 for the reference (so only the arithmetic differs)."""
    x, weight, b = _operands(n, c, k, h, w, seed)
    return x.bfloat16(), weight.bfloat16(), b.bfloat16()


@bf16
@pytest.mark.parametrize("tile", pw.TILES)
@pytest.mark.parametrize(("n", "c", "k", "h", "w"), SHAPES)
def test_bf16_shapes_against_the_float64_convolution(n, c, k, h, w, tile):
    """Odd channel counts (17, 1, 3) pair their last channel with a zero; every element is written."""
    x, weight, b = _bf16_case(n, c, k, h, w, seed=c + k)
    z = torch.randn(n, k, h, w).contiguous(memory_format=torch.channels_last).bfloat16()
    out = torch.full((n, k, h, w), math.nan, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    got = _run(x, weight, b, z, "Relu", [], "SiLU", [], tile=tile, out=out)
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    assert _error(got, _reference(x, weight, b, z, "Relu", [], "SiLU", [])) <= BF16_BOUND


@bf16
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_bf16_every_activation(act):
    x, weight, b = _bf16_case(1, 24, 40, 5, 6, seed=2)
    x = x * 4
    params = ACTIVATIONS[act]
    assert (
        _error(_run(x, weight, b, pre=act, pre_params=params), _reference(x, weight, b, None, act, params, "", []))
        <= BF16_BOUND
    )


def test_gelu_value_by_value_across_its_tail_and_through_nan_and_inf():
    """float32 GELU through an identity product (exact): each value within 1e-6 of the exact GELU, relative, or
    1e-9 absolute (the deep tail: its exponent −0.72·x² carries float32's rounding of x², 6e-6 relative at
    x = −11.5, where GELU is 4e-30; past x = −13 the kernel's 2^x stops at 2^−126, `vexp2_normal`). Through a
    product of one channel (an identity of 16 would multiply them by the other channels' zeros): NaN stays NaN,
    +inf is +inf, −inf within 1e-35 of 0."""
    values = torch.cat([torch.linspace(-40, 12, 15000), torch.linspace(-1e-3, 1e-3, 1000), torch.zeros(32)])
    x = values.reshape(1, 16, 1002, 1).contiguous(memory_format=torch.channels_last)
    got = _run(x, torch.eye(16).reshape(16, 16, 1, 1), torch.zeros(16), pre="Gelu").double()
    exact = x.double() * torch.special.erfc(-x.double() / math.sqrt(2)) / 2
    assert bool(((got - exact).abs() <= 1e-6 * exact.abs() + 1e-9).all())
    special = torch.tensor([math.nan, math.inf, -math.inf, -1e30, 1e30]).reshape(1, 1, 5, 1)
    got = _run(special, torch.ones(1, 1, 1, 1), torch.zeros(1), pre="Gelu").flatten()
    assert got[0].isnan() and got[1] == math.inf and got[4] == 1e30
    assert got[2].abs() <= 1e-35 and got[3].abs() <= 1e-35


@bf16
def test_bf16_gelu_value_by_value_against_the_exact_one_rounded():
    """bf16 outputs take a GELU of lower degree (`GELU_TAIL_16`, `EXP2_16`): through an identity product (exact), each
    value within 2^-8 (relative, half a bf16 ulp and its own error) of the exact GELU, and nearly all of them the
    exact GELU rounded to bf16, across the tail (to -10), the bend and the large positive side."""
    values = torch.cat([torch.linspace(-10, 10, 8000), torch.linspace(-1e-3, 1e-3, 800)]).bfloat16()
    x = values.reshape(1, 16, 25, 22).contiguous(memory_format=torch.channels_last)
    got = _run(x, torch.eye(16).reshape(16, 16, 1, 1).bfloat16(), torch.zeros(16), pre="Gelu")
    exact = x.double() * torch.special.erfc(-x.double() / math.sqrt(2)) / 2  # (1 + erf loses the tail in float64)
    relative = (got.double() - exact).abs() / exact.abs().clamp_min(1e-300)
    assert relative.max() <= 2.0**-8
    assert (got == exact.bfloat16()).double().mean() >= 0.99


@bf16
def test_bf16_reads_and_writes_channel_slices_and_nothing_else():
    """A channel slice of a channels_last input read as it is, the output written into a channel slice of a larger
    tensor (a concatenation) whose other channels keep their poison."""
    x, weight, b = _bf16_case(2, 48, 40, 5, 7, seed=5)
    wide = torch.randn(2, 64, 5, 7).contiguous(memory_format=torch.channels_last).bfloat16()
    wide[:, 8:56] = x
    concat = torch.full((2, 72, 5, 7), math.nan, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    _run(wide[:, 8:56], weight, b, pre="Gelu", out=concat[:, 16:56])
    assert _error(concat[:, 16:56], _reference(x, weight, b, None, "Gelu", [], "", [])) <= BF16_BOUND
    assert concat[:, :16].isnan().all() and concat[:, 56:].isnan().all()


@bf16
@pytest.mark.parametrize("tile", pw.TILES)
@pytest.mark.parametrize("budget", [pw.SCALED_BYTES, 4000])
@pytest.mark.parametrize(("n", "c", "k", "size"), [(3, 40, 56, 5), (4, 17, 200, 5), (2, 33, 80, 9), (5, 40, 9, 5)])
def test_bf16_each_images_input_channels_scaled(tile, budget, n, c, k, size, monkeypatch):
    """The scaled copies in bf16: of the inputs (fewer pixels than output channels), or of the weight's rows a pair
    at a time (an odd channel count's last pair with its zero row); both rounded to bf16 once more, so the bound is
    the output's rounding and that of the copy."""
    monkeypatch.setattr(pw, "SCALED_BYTES", budget)
    x, weight, b = _bf16_case(n, c, k, size, size, seed=11)
    scale = torch.rand(n, c)
    z = torch.randn(n, k, size, size).contiguous(memory_format=torch.channels_last).bfloat16()
    out = torch.full((n, k, size, size), math.nan, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    got = pw.PointwiseConv(weight, b, "Relu", post="HardSwish", tile=tile)(x, z, out, scale)
    want = _reference(x.double() * scale[:, :, None, None].double(), weight, b, z, "Relu", [], "HardSwish", [])
    assert not got.isnan().any() and _error(got, want) <= 2 * BF16_BOUND


@bf16
@pytest.mark.parametrize("tile", pw.TILES)
def test_bf16_the_product_of_each_images_mean_pixel(tile):
    """The means rounded to bf16 (as a pool's output), then the product: the reference rounds them too."""
    x, weight, b = _bf16_case(3, 37, 50, 5, 3, seed=12)
    got = pw.PointwiseConv(weight, b, "HardSwish", tile=tile).pooled(x)
    means = x.double().mean((2, 3), keepdim=True).bfloat16()
    want = _reference(means, weight, b, None, "HardSwish", [], "", []).reshape(3, 50)
    assert got.dtype == torch.bfloat16 and _error(got, want) <= BF16_BOUND


@bf16
def test_bf16_refuses_float32_operands_by_name():
    x, weight, b = _bf16_case(1, 16, 24, 4, 4, seed=1)
    conv = pw.PointwiseConv(weight, b)
    with pytest.raises(ValueError, match="x must be a 4-D bf16"):
        conv(x.float())
    with pytest.raises(ValueError, match="residual must be a 4-D bf16"):
        conv(x, torch.randn(1, 24, 4, 4))
    with pytest.raises(ValueError, match="x must be a 4-D bf16"):
        conv.pooled(x.float())
