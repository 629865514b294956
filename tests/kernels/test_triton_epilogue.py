"""The Triton epilogue's activations against `ops.fused.ACTIVATIONS`, under the interpreter and on the GPU."""

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tensorforge.kernels.activations import GELU_SQUARE, GELU_T, GELU_TAIL
from tensorforge.kernels.triton.epilogue import ACTIVATION_CODES, activate, activation_args
from tensorforge.ops.fused import ACTIVATIONS, apply_activation
from tests.helpers import DEVICES

PARAMS = {"Clip": [-1.5, 2.0], "LeakyRelu": [0.2], "HardSigmoid": [0.3, 0.4], "Elu": [0.7]}


@triton.jit
def _apply(x, y, n, ACT: tl.constexpr, p0, p1, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    value = tl.load(x + offsets, mask=inside).to(tl.float32)
    tl.store(y + offsets, activate(value, ACT, p0, p1), mask=inside)


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
