"""The Triton epilogue's activations against `ops.fused.ACTIVATIONS`, under the interpreter and on the GPU."""

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tensorforge.kernels.activations import GELU_SQUARE, GELU_T, GELU_TAIL, GELU_TAIL_16
from tensorforge.kernels.triton.epilogue import ACTIVATION_CODES, RELU, activate, activation_args, quantize
from tensorforge.ops.fused import ACTIVATIONS, apply_activation
from tests.helpers import DEVICES

PARAMS = {"Clip": [-1.5, 2.0], "LeakyRelu": [0.2], "HardSigmoid": [0.3, 0.4], "Elu": [0.7]}


@triton.jit
def _apply(x, y, n, ACT: tl.constexpr, p0, p1, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    value = tl.load(x + offsets, mask=inside).to(tl.float32)
    tl.store(y + offsets, activate(value, ACT, p0, p1), mask=inside)


@triton.jit
def _apply_narrow(x, y, n, ACT: tl.constexpr, NARROW: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    value = tl.load(x + offsets, mask=inside).to(tl.float32)
    tl.store(y + offsets, activate(value, ACT, 0.0, 0.0, NARROW), mask=inside)


def test_every_fused_activation_has_a_code():
    assert set(ACTIVATION_CODES) == set(ACTIVATIONS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(ACTIVATION_CODES))
def test_activation_matches_the_reference(device, name):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(200) * 3, torch.tensor([0.0, -30.0, 30.0, -100.0, 100.0, float("nan")])]).to(device)
    y = torch.full_like(x, float("nan"))
    code, p0, p1 = activation_args(name, PARAMS.get(name, []))
    _apply[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), code, p0, p1, BLOCK=128)
    want = apply_activation(x.double(), name, PARAMS.get(name, [])).float()
    torch.testing.assert_close(y, want, rtol=2e-6, atol=2e-6, equal_nan=True)
    assert torch.isnan(y[-1]), "NaN must propagate"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gelu_for_16_bit_outputs_is_within_their_rounding(device, dtype):
    """The form for outputs of 16 bits or fewer (`NARROW`: the tail of degree 5, `GELU_TAIL_16`) on values of that
    type: within 2e-5 of the exact GELU, relative, and rounded to the type (here by torch: the interpreter's bf16
    conversion truncates) nearly always the exact GELU rounded; across the tail (to -10), the bend and large
    positive values."""
    x = torch.cat([torch.linspace(-10, 10, 4001), torch.linspace(-1e-3, 1e-3, 401)]).to(dtype).to(device)
    y = torch.full(x.shape, float("nan"), device=device)
    _apply_narrow[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), ACTIVATION_CODES["Gelu"], True, BLOCK=128)
    exact = (x.double() * torch.special.erfc(-x.double() / math.sqrt(2)) / 2).cpu()
    got = y.cpu()
    assert ((got.double() - exact).abs() / exact.abs().clamp_min(1e-300)).max().item() <= 2e-5  # (x = 0 too)
    assert (got.to(dtype) == exact.to(dtype)).double().mean() >= 0.99


def test_default_parameters_and_bad_names():
    assert activation_args("LeakyRelu") == (ACTIVATION_CODES["LeakyRelu"], 0.01, 0.0)
    assert activation_args("Elu", [0.5]) == (ACTIVATION_CODES["Elu"], 0.5, 0.0)
    with pytest.raises(ValueError, match="Swish"):
        activation_args("Swish")
    with pytest.raises(ValueError, match="two bounds"):
        activation_args("Clip", [0.0])


def test_gelu_tail_fit_is_within_float32_rounding():
    """The kernels' Gaussian tail evaluated in float64, on all of the range they use (a ≤ 20): the fit's error
    (6.5e-8) and its coefficients' rounding to float32 leave a relative error within float32's."""
    a = np.linspace(0.0, 20.0, 100_001)
    t = 1.0 / (1.0 + GELU_T * a)
    tail = t * np.exp2(np.polynomial.polynomial.polyval(t, GELU_TAIL) - GELU_SQUARE * a * a)
    exact = np.array([math.erfc(v / math.sqrt(2.0)) / 2.0 for v in a])
    assert np.max(np.abs(tail / exact - 1.0)) < 1.5e-7


def test_gelu_tail_of_degree_5_is_within_its_stated_error():
    """`GELU_TAIL_16`'s tail, in float64 over a ≤ 20: relative error under 1.2e-5 (the fit's 1.1e-5), far under an
    fp16 ulp (9.8e-4)."""
    a = np.linspace(0.0, 20.0, 100_001)
    t = 1.0 / (1.0 + GELU_T * a)
    tail = t * np.exp2(np.polynomial.polynomial.polyval(t, GELU_TAIL_16) - GELU_SQUARE * a * a)
    exact = np.array([math.erfc(v / math.sqrt(2.0)) / 2.0 for v in a])
    assert np.max(np.abs(tail / exact - 1.0)) < 1.2e-5


@triton.jit
def _quantize_relu(x, y, n, inv_scale, QUANT: tl.constexpr, NONNEG: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    value = activate(tl.load(x + offsets, mask=inside), RELU, 0.0, 0.0)
    tl.store(y + offsets, quantize(value, inv_scale, QUANT, NONNEG=NONNEG), mask=inside)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", [torch.int8, torch.float8_e4m3fn], ids=["int8", "e4m3"])
def test_a_relu_output_quantizes_the_same_without_the_lower_clip(device, kind):
    """`quantize(..., NONNEG=True)` after a ReLU gives the same values as with both clips (zeros, ties, values
    past the top saturating), for int8 and E4M3; an int8 NaN saturates to 127 (to −128 with both clips). E4M3 on
    the GPU only: the interpreter's float8 cast does not round to nearest."""
    if kind == torch.float8_e4m3fn and device == "cpu":
        pytest.skip("the interpreter's float32 → float8 cast does not round to nearest")
    torch.manual_seed(4)
    x = torch.cat([torch.randn(500) * 200, torch.tensor([0.0, -0.0, 2.5, 3.5, -7.0, 1e6, float("nan")])]).to(device)
    quant = 1 if kind == torch.int8 else 2
    got = {}
    for nonneg in (False, True):
        y = torch.full(x.shape, 77, dtype=torch.int8, device=device).view(kind)
        _quantize_relu[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), 0.9, quant, nonneg, BLOCK=128)
        got[nonneg] = y.view(torch.int8)
    assert torch.equal(got[False][:-1], got[True][:-1])
    if kind == torch.int8:
        assert (got[False][-1].item(), got[True][-1].item()) == (-128, 127)
        want = torch.relu(x[:-1]).mul(torch.tensor(0.9, device=device)).round().clamp(-128, 127).to(torch.int8)
        assert torch.equal(got[True][:-1], want)
