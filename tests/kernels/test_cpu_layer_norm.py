"""The C++ layer-norm kernel against LayerNormalization in float64 (built with the host's compiler on first use,
then cached; skipped where no compiler, ninja, AVX-512 or AVX2 is found): rows in groups and alone, partial vectors,
several normalized axes, strided rows, large means."""

from __future__ import annotations

import pytest
import torch

from tensorforge.kernels.cpu import layer_norm as ln
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or ln.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

# Normwise against float64 of the same (rounded) input: float32 statistics; in bf16 the output's rounding (2⁻⁹).
BOUND = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8}
_NO_BF16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
DTYPES = [torch.float32, pytest.param(torch.bfloat16, id="bf16", marks=_NO_BF16)]


def _reference(x, gamma, beta, epsilon, axis):
    shape = x.shape[axis % x.dim() :]
    w = gamma.double().reshape(shape)
    b = None if beta is None else beta.double().reshape(shape)
    return torch.nn.functional.layer_norm(x.double(), shape, w, b, epsilon)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "axis", "bias"),
    [
        ((1, 56, 56, 96), -1, True),  # ConvNeXt's first stage: groups of four rows
        ((1, 197, 384), -1, True),  # ViT's: 197 rows, a partial group
        ((3, 5, 37), -1, False),  # a partial vector, no bias
        ((2, 3, 4, 5), 2, True),  # two normalized axes
        ((7, 1), -1, True),  # one value a row: every output is the bias
    ],
)
def test_matches_the_reference(dtype, shape, axis, bias):
    generator = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=generator) * 2 + 5).to(dtype)  # a mean far from zero
    size = torch.Size(shape[axis % len(shape) :]).numel()
    gamma = torch.randn(size, generator=generator)
    beta = torch.randn(size, generator=generator) if bias else None
    got = ln.layer_norm(x, gamma, beta, 1e-6, axis)
    want = _reference(x, gamma, beta, 1e-6, axis)
    assert got.shape == x.shape and got.dtype == dtype
    error = ((got.double() - want).abs().max() / want.abs().max()).item()
    assert error <= BOUND[dtype], error


def test_strided_rows_are_read_in_place_and_the_epsilon_counts():
    generator = torch.Generator().manual_seed(1)
    wide = torch.randn(10, 64, generator=generator)
    x = wide[:, :48]  # rows of stride 64
    gamma, beta = torch.randn(48, generator=generator), torch.randn(48, generator=generator)
    want = _reference(x, gamma, beta, 1e-5, -1)
    got = ln.layer_norm(x, gamma, beta, 1e-5)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= BOUND[torch.float32]
    flat = torch.full((4, 16), 3.0)  # zero variance: the output is the bias, 0 · 1/√ε · γ
    assert torch.equal(ln.layer_norm(flat, gamma[:16], beta[:16], 1e-5), beta[:16].expand(4, 16))
    assert not torch.allclose(ln.layer_norm(x, gamma, beta, 10.0), got)


def test_clear_errors():
    with pytest.raises(RuntimeError, match="a float32 scale of 8 values"):
        ln.layer_norm(torch.randn(2, 8), torch.randn(7), None, 1e-5)
    with pytest.raises(RuntimeError, match="float32 or bf16 operands"):
        ln.layer_norm(torch.randn(2, 8).double(), torch.randn(8), None, 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 197, 384), (3, 5, 37)])
def test_a_quantized_output_is_the_float_result_on_the_int8_grid(dtype, shape):
    """With a `y_scale`: int8, what `ops.fused.quantize_activation` makes of the kernel's float32 result (the
    sums' order differs from the reference's: an element within a float32 rounding of a step's boundary may land
    one step over, rarely), saturating at the ends."""
    from tensorforge.ops.fused import quantize_activation

    generator = torch.Generator().manual_seed(7)
    x = (torch.randn(shape, generator=generator) * 2 + 5).to(dtype)
    gamma, beta = torch.randn(shape[-1], generator=generator) * 2, torch.randn(shape[-1], generator=generator)
    y_scale = 0.03
    got = ln.layer_norm(x, gamma, beta, 1e-6, -1, y_scale)
    want = quantize_activation(_reference(x, gamma, beta, 1e-6, -1).float(), y_scale, "int8")
    assert got.dtype == torch.int8 and got.shape == x.shape
    difference = (got.int() - want.int()).abs()
    assert int(difference.max()) <= 1 and difference.float().mean().item() <= 1e-2
    assert int(want.abs().max()) >= 127  # some saturate
    quantized, copy = ln.layer_norm(x, gamma, beta, 1e-6, -1, y_scale, copy=True)
    assert torch.equal(quantized, got) and copy.dtype == dtype and copy.shape == x.shape
    assert torch.equal(copy, ln.layer_norm(x, gamma, beta, 1e-6, -1))  # Y beside Q(Y), from the same float32 values
