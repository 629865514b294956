"""The C++ attention kernel against softmax(Q·Kᵀ·scale + B)·V in float64 (built with the host's compiler on first
use, then cached; skipped where no compiler, ninja, AVX-512 or AVX2 is found): strided views as a QKV projection leaves
them, masks, broadcast operands, odd sizes, outputs poisoned before the call."""

from __future__ import annotations

import pytest
import torch

from tensorforge.kernels.cpu import attention as at
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.math_flags import cpu_native_precisions

_PROBLEM = compiler_problem() or at.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

# Normwise against float64 of the same (rounded) inputs: float32 sums; bf16 exponentials and output rounded to bf16
# (2⁻⁹ each), products and sums in float32.
BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
_NO_BF16 = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
DTYPES = [torch.float32, pytest.param(torch.bfloat16, id="bf16", marks=_NO_BF16)]


def _reference(q, kt, v, bias, scale) -> torch.Tensor:
    scores = q.double() @ kt.double() * scale
    if bias is not None:
        scores = scores + bias.double()
    return torch.softmax(scores, dim=-1) @ v.double()


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _projection_views(batch, seq, heads, size, dtype, generator):
    """Q, Kᵀ and V as strided views of one [batch, seq, 3, heads, size] projection output (ViT's and BERT's)."""
    qkv = torch.randn(batch, seq, 3, heads, size, generator=generator).to(dtype)
    q, k, v = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    return q, k.transpose(-1, -2), v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "seq", "heads", "size"), [(1, 197, 6, 64), (2, 128, 12, 64), (1, 50, 3, 128)])
def test_strided_views_of_a_projection(dtype, batch, seq, heads, size):
    generator = torch.Generator().manual_seed(seq)
    q, kt, v = _projection_views(batch, seq, heads, size, dtype, generator)
    assert not q.is_contiguous() and kt.stride(-2) == 1  # read in place
    out = torch.full((batch, heads, seq, size), float("nan"), dtype=dtype)
    got = at.attention(q, kt, v, None, size**-0.5, out=out)
    assert got.data_ptr() == out.data_ptr()
    error = _error(got, _reference(q, kt, v, None, size**-0.5))
    assert error <= BOUND[dtype], error


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "seq", "heads", "size"), [(1, 197, 6, 64), (2, 33, 3, 40)])
def test_written_through_the_transposed_view_of_the_heads_merged(dtype, batch, seq, heads, size):
    """`out` the transposed view of a [batch, seq, heads, size] tensor (with poisoned padding around each head's
    rows): every head's rows land in place, nothing beside them is written."""
    generator = torch.Generator().manual_seed(heads)
    q, kt, v = _projection_views(batch, seq, heads, size, dtype, generator)
    host = torch.full((batch, seq, heads, size + 3), float("nan"), dtype=dtype)
    out = host[..., 1 : size + 1].transpose(1, 2)
    assert at.attention(q, kt, v, None, size**-0.5, out=out) is out
    error = _error(out, _reference(q, kt, v, None, size**-0.5))
    assert error <= BOUND[dtype], error
    assert host[..., 0].isnan().all() and host[..., size + 1 :].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("q_shape", "kt_shape", "v_shape", "bias_shape"),
    [
        ((2, 3, 5, 13), (2, 3, 13, 7), (2, 3, 7, 17), None),  # odd features, keys and rows; Dv ≠ D
        ((1, 2, 33, 64), (1, 2, 64, 65), (1, 2, 65, 128), (1, 2, 33, 65)),  # a full bias; the widest V
        ((2, 4, 9, 16), (2, 1, 16, 70), (2, 1, 70, 16), (2, 1, 1, 70)),  # K, V and a key mask shared by the heads
        ((3, 6, 8), (3, 8, 6), (3, 6, 8), (6,)),  # 3-D, a bias over the keys alone
        ((1, 1, 1, 8), (1, 1, 8, 1), (1, 1, 1, 8), None),  # one key
    ],
)
def test_shapes_and_broadcasts(dtype, q_shape, kt_shape, v_shape, bias_shape):
    generator = torch.Generator().manual_seed(len(q_shape) + q_shape[-1])
    q, kt, v = (torch.randn(shape, generator=generator).to(dtype) for shape in (q_shape, kt_shape, v_shape))
    bias = None if bias_shape is None else torch.randn(bias_shape, generator=generator)
    got = at.attention(q, kt, v, bias, 0.3)
    want = _reference(q, kt, v, bias, 0.3)
    assert got.shape == want.shape and got.dtype == dtype
    error = _error(got, want)
    assert error <= BOUND[dtype], error


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_keys_take_no_weight_and_a_row_masked_whole_is_nan_as_in_the_reference(dtype):
    generator = torch.Generator().manual_seed(3)
    q, kt, v = _projection_views(2, 40, 2, 64, dtype, generator)
    mask = torch.zeros(2, 1, 1, 40)
    mask[0, ..., 25:] = float("-inf")  # padding, as BERT's attention mask makes it
    mask[1, ..., 3:] = -10000.0
    got = at.attention(q, kt, v, mask, 0.125)
    error = _error(got, _reference(q, kt, v, mask, 0.125))
    assert error <= BOUND[dtype], error
    cut = torch.full((40,), float("-inf"))
    assert torch.isnan(at.attention(q, kt, v, cut, 0.125)).all()


def test_the_result_is_not_the_reference_by_accident():
    generator = torch.Generator().manual_seed(5)
    q, kt, v = _projection_views(1, 30, 2, 64, torch.float32, generator)
    want = _reference(q, kt, v, None, 0.125)
    assert _error(at.attention(q, kt, v, None, 0.125), want) <= BOUND[torch.float32]
    assert _error(at.attention(q, kt, v, None, 0.25), want) > 100 * BOUND[torch.float32]  # the scale counts
    shuffled = v[..., torch.randperm(30, generator=generator), :]
    assert _error(at.attention(q, kt, shuffled, None, 0.125), want) > 100 * BOUND[torch.float32]


def test_clear_errors():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="V's head size up to 128, not 160"):
        at.attention(q, torch.randn(1, 2, 8, 4), torch.randn(1, 2, 4, 160))
    with pytest.raises(ValueError, match="3-D or 4-D q, kt and v of one rank"):
        at.attention(q, torch.randn(2, 8, 4), torch.randn(1, 2, 4, 8))
    with pytest.raises(RuntimeError, match="all float32 or all bf16"):
        at.attention(q, torch.randn(1, 2, 8, 4).bfloat16(), torch.randn(1, 2, 4, 8))
    with pytest.raises(ValueError, match=r"`out` must be torch.float32 \[1, 2, 4, 8\] with its last axis contiguous"):
        at.attention(q, torch.randn(1, 2, 8, 4), torch.randn(1, 2, 4, 8), out=torch.empty(1, 2, 8, 4).transpose(2, 3))
