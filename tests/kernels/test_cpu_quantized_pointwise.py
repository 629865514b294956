"""The int8 1×1 convolution kernel for the CPU (AVX-512 VNNI) against QuantizedConv's arithmetic in float64: every
tile, float32 and int8 inputs, float32 and int8 residuals, float32 and int8 outputs, bf16 ones beside bf16 layers,
ragged channel counts, strided inputs; outputs poisoned before the call."""

import pytest
import torch

from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import quantized_pointwise as qp
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.fused import apply_activation, quantize_activation
from tensorforge.ops.math_flags import cpu_native_precisions
from tests.kernels.test_cpu_pointwise import ACTIVATIONS, BF16_BOUND

_PROBLEM = compiler_problem() or qp.problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))

FLOAT_BOUND = 2e-6  # float32 output: normwise, against float64 (one fused multiply-add and the activation's ulps)


def _layer(c: int, k: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    wq = torch.randint(-127, 128, (k, c), generator=generator, dtype=torch.int8)
    w_scale = torch.rand(k, generator=generator) * 1e-2 + 1e-3
    bias = torch.randn(k, generator=generator)
    return wq, w_scale, bias, generator


def _reference(x, wq, w_scale, x_scale, bias, pre=("", ()), post=("", ()), z=None, z_scale=0.0):
    """QuantizedConv's Y in float64 (before any output quantization): the products exact, the factors float32;
    `pre` and `post` (name, parameters)."""
    q = x.double() if x.dtype == torch.int8 else quantize_activation(x, x_scale, "int8").double()
    acc = torch.einsum("nchw,kc->nkhw", q, wq.double())
    factors = (w_scale.float() * torch.tensor(x_scale, dtype=torch.float32)).double()
    v = apply_activation(acc * factors[None, :, None, None] + bias.double()[None, :, None, None], *pre)
    if z is not None:
        v = v + (z.double() * z_scale if z.dtype == torch.int8 else z.double())
    return apply_activation(v, *post)


@pytest.mark.parametrize("tile", qp.TILES)
@pytest.mark.parametrize("quantized_input", [False, True])
@pytest.mark.parametrize("residual", ["", "float", "int8"])
@pytest.mark.parametrize("output", ["float", "int8"])
def test_every_form_matches_the_quantized_layer(tile, quantized_input, residual, output):
    """37 input channels (a last partial quad), 40 outputs (a partial vector, a narrower last block), 2 × 5 × 3
    pixels (partial pixel tiles)."""
    c, k = 37, 40
    wq, w_scale, bias, generator = _layer(c, k)
    x_scale = 0.02
    if quantized_input:
        x = torch.randint(-128, 128, (2, c, 5, 3), generator=generator, dtype=torch.int8)
    else:
        x = torch.randn(2, c, 5, 3, generator=generator)
    x = x.contiguous(memory_format=torch.channels_last)
    z, z_scale = None, 0.0
    if residual == "float":
        z = torch.randn(2, k, 5, 3, generator=generator).contiguous(memory_format=torch.channels_last)
    elif residual == "int8":
        z = torch.randint(-128, 128, (2, k, 5, 3), generator=generator, dtype=torch.int8)
        z, z_scale = z.contiguous(memory_format=torch.channels_last), 0.05
    conv = qp.QuantizedPointwise(wq, w_scale, x_scale, bias, "Relu", post="Clip", post_params=(-1.0, 6.0), tile=tile)
    want = _reference(x, wq, w_scale, x_scale, bias, ("Relu", ()), ("Clip", (-1.0, 6.0)), z, z_scale)
    if output == "float":
        out = torch.full((2, k, 5, 3), float("nan")).contiguous(memory_format=torch.channels_last)
        got = conv(x, z, z_scale, out=out)
        assert got is out and not got.isnan().any()
        error = ((got.double() - want).abs().max() / want.abs().max()).item()
        assert 0 < error <= FLOAT_BOUND or torch.equal(got.double(), want)
    else:
        y_scale = 0.03
        out = torch.full((2, k, 5, 3), -77, dtype=torch.int8).contiguous(memory_format=torch.channels_last)
        got = conv(x, z, z_scale, y_scale=y_scale, out=out)
        exact = quantize_activation(want.float(), y_scale, "int8")
        steps = (got.int() - exact.int()).abs()
        assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01  # a float32 rounding from a grid boundary


def test_pre_activations_and_a_strided_input():
    """Every activation as `pre`, on a strided view (every 2nd pixel of a channels_last tensor, as a strided 1×1
    layer reads its input) of 64 channels into 24 outputs, and a matrix-vector product (one pixel)."""
    wq, w_scale, bias, generator = _layer(64, 24, seed=1)
    base = torch.randn(3, 64, 9, 8, generator=generator).contiguous(memory_format=torch.channels_last)
    x = base[:, :, ::2, ::2]
    for pre, params in ACTIVATIONS.items():
        got = qp.QuantizedPointwise(wq, w_scale, 0.05, bias, pre, activation_args(pre, params)[1:])(x)
        want = _reference(x, wq, w_scale, 0.05, bias, (pre, params))
        assert ((got.double() - want).abs().max() / want.abs().max()).item() <= FLOAT_BOUND, pre
    one = torch.randn(1, 64, 1, 1, generator=generator)
    got = qp.QuantizedPointwise(wq, w_scale, 0.05, bias, tile=(1, 8))(one)
    want = _reference(one, wq, w_scale, 0.05, bias)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= FLOAT_BOUND


@pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize("tile", qp.TILES)
@pytest.mark.parametrize(("quantized_input", "residual"), [(False, "bf16"), (False, ""), (True, "bf16")])
def test_bf16_inputs_and_residuals_make_a_bf16_output(tile, quantized_input, residual):
    """A bf16 x quantized by the kernel (the same values as float32 in the reference), a bf16 residual: the output
    is bf16, within its one rounding; an int8 x with a bf16 residual also gives bf16. A GELU epilogue."""
    c, k = 37, 40
    wq, w_scale, bias, generator = _layer(c, k, seed=3)
    if quantized_input:
        x = torch.randint(-128, 128, (2, c, 5, 3), generator=generator, dtype=torch.int8)
    else:
        x = torch.randn(2, c, 5, 3, generator=generator).bfloat16()
    x = x.contiguous(memory_format=torch.channels_last)
    z = None
    if residual:
        z = torch.randn(2, k, 5, 3, generator=generator).bfloat16().contiguous(memory_format=torch.channels_last)
    conv = qp.QuantizedPointwise(wq, w_scale, 0.02, bias, "Gelu", tile=tile)
    out = torch.full((2, k, 5, 3), float("nan"), dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    got = conv(x, z, out=out)
    x_ref = x if quantized_input else x.float()
    want = _reference(x_ref, wq, w_scale, 0.02, bias, ("Gelu", ()), z=None if z is None else z.float())
    assert got is out and not got.isnan().any()
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= BF16_BOUND
    if quantized_input:  # without the residual, the float type asked for
        got = conv(x, float_type=torch.bfloat16)
        want = _reference(x, wq, w_scale, 0.02, bias, ("Gelu", ()))
        assert got.dtype == torch.bfloat16
        assert ((got.double() - want).abs().max() / want.abs().max()).item() <= BF16_BOUND


def test_the_weight_packs_in_quads_with_the_offsets_start():
    wq = torch.arange(-30, 30, dtype=torch.int8).reshape(6, 10)  # K = 6, C = 10
    packed, start = qp.pack_weight(wq, 1)
    assert packed.numel() == 12 * 16 and start.shape == (16,)
    quads = packed.reshape(3, 16, 4)  # [C/4, 16, 4]
    assert torch.equal(quads[0, 2], wq[2, :4]) and torch.equal(quads[2, 5, :2], wq[5, 8:]) and not quads[2, :, 2:].any()
    assert torch.equal(start[:6], -128 * wq.int().sum(dim=1)) and not start[6:].any()


def test_bad_calls_are_refused_with_the_reason():
    wq, w_scale, bias, _ = _layer(16, 16)
    conv = qp.QuantizedPointwise(wq, w_scale, 0.1, bias)
    with pytest.raises(ValueError, match="channels"):
        conv(torch.randn(1, 8, 2, 2))
    with pytest.raises(ValueError, match="z_scale"):
        conv(torch.randn(1, 16, 2, 2), torch.zeros(1, 16, 2, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match="a float one none"):
        conv(torch.randn(1, 16, 2, 2), torch.zeros(1, 16, 2, 2, dtype=torch.bfloat16), 0.5)
    with pytest.raises(ValueError, match="float32, bf16 or int8"):
        conv(torch.randn(1, 16, 2, 2).half())
    with pytest.raises(ValueError, match="write float32 or bf16, not torch.float16"):
        conv(torch.randn(1, 16, 2, 2), float_type=torch.float16)
    with pytest.raises(ValueError, match="int8 matrix"):
        qp.QuantizedPointwise(wq.float(), w_scale, 0.1)
    with pytest.raises(ValueError, match="tiles"):
        qp.QuantizedPointwise(wq, w_scale, 0.1, tile=(4, 4))
