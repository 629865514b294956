"""The Triton GEMM against the FusedGemm reference: under the interpreter on tiny shapes, on the GPU at scale."""

import pytest
import torch

from tensorforge.kernels.triton.gemm import gemm, gemm_configs, shared_memory_bytes
from tensorforge.ops.fused import apply_activation
from tests.helpers import DEVICES

TINY = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
# Normwise relative error bounds by input dtype (fp32 products use IEEE dots here).
BOUND = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# (A shape, B shape, C shape or None, residual shape or None, trans_a, trans_b)
CASES = [
    ((19, 23), (23, 17), (17,), None, False, False),  # odd sizes, bias row
    ((2, 3, 19, 10), (10, 21), (19, 1), (2, 3, 19, 21), False, False),  # shared weight folds into M, column C
    ((3, 10, 19), (2, 1, 21, 10), (21,), None, True, True),  # broadcast batch both ways, transposed operands
    ((2, 5, 7), (2, 7, 9), (2, 5, 9), (9,), False, False),  # batched weights, full C
    ((2, 2, 3, 4, 6), (2, 1, 6, 5), None, None, False, False),  # three batch dims, one looped by the launcher
    ((1, 33), (33, 5), (), None, False, False),  # one row, scalar C, K not a multiple of the tile
]


def _reference(a, b, c, z, alpha, beta, trans_a, trans_b, pre, post):
    a, b = a.double(), b.double()
    y = alpha * ((a.mT if trans_a else a) @ (b.mT if trans_b else b))
    if c is not None:
        y = y + beta * c.double()
    y = apply_activation(y, pre, [0.1] if pre == "LeakyRelu" else [])
    if z is not None:
        y = y + z.double()
    return apply_activation(y, post)


def _error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("a_shape", "b_shape", "c_shape", "z_shape", "trans_a", "trans_b"), CASES)
def test_gemm_matches_the_reference(device, dtype, a_shape, b_shape, c_shape, z_shape, trans_a, trans_b):
    torch.manual_seed(0)
    a = torch.randn(a_shape, device=device).to(dtype)
    b = torch.randn(b_shape, device=device).to(dtype)
    c = None if c_shape is None else torch.randn(c_shape, device=device).to(dtype)
    z = None if z_shape is None else torch.randn(z_shape, device=device).to(dtype)
    want = _reference(a, b, c, z, 0.5, 1.5, trans_a, trans_b, "LeakyRelu", "Tanh")
    poisoned = torch.full(want.shape, float("nan"), dtype=dtype, device=device)
    got = gemm(
        a, b, c, z, alpha=0.5, beta=1.5, trans_a=trans_a, trans_b=trans_b,
        pre="LeakyRelu", pre_params=[0.1], post="Tanh", out=poisoned, config=TINY,
    )  # fmt: skip
    assert got is poisoned and not got.isnan().any()
    assert _error(got, want) <= BOUND[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_writes_through_a_strided_out_and_skips_c_when_beta_is_zero(device):
    torch.manual_seed(1)
    a, b = torch.randn(2, 18, 20, device=device), torch.randn(20, 24, device=device)
    c = torch.full((24,), float("inf"), device=device)  # beta = 0: C is not read (Gemm's rule)
    wide = torch.full((2, 18, 40), float("nan"), device=device)
    view = wide[:, :, 8:32]
    gemm(a, b, c, beta=0.0, post="Relu", out=view, config=TINY)
    assert _error(view, torch.relu(a.double() @ b.double())) <= 1e-5
    assert wide[:, :, :8].isnan().all() and wide[:, :, 32:].isnan().all()


def test_gemm_allocates_its_output_and_handles_empty_k():
    a, b, c = torch.randn(3, 0), torch.randn(0, 5), torch.randn(5)
    y = gemm(a, b, c, beta=2.0, config=TINY)  # an empty sum is 0: Y = beta · C
    assert y.shape == (3, 5) and y.dtype == torch.float32
    assert torch.equal(y, (2.0 * c).expand(3, 5))


def test_bad_operands_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="inner dims"):
        gemm(torch.randn(4, 5), torch.randn(4, 5), config=TINY)
    with pytest.raises(ValueError, match="at least 2 dims"):
        gemm(torch.randn(5), torch.randn(5, 4), config=TINY)
    with pytest.raises(ValueError, match="share one of"):
        gemm(torch.randn(4, 5), torch.randn(5, 4).half(), config=TINY)
    with pytest.raises(ValueError, match="does not broadcast"):
        gemm(torch.randn(4, 5), torch.randn(5, 6), torch.randn(3), config=TINY)
    with pytest.raises(ValueError, match="out is"):
        gemm(torch.randn(4, 5), torch.randn(5, 6), out=torch.empty(4, 5), config=TINY)


def test_configs_grow_with_effort():
    sizes = [len(gemm_configs(e)) for e in range(3)]
    assert sizes[0] < sizes[1] < sizes[2]
    assert gemm_configs(0) == gemm_configs(0)[: sizes[0]] == gemm_configs(2)[: sizes[0]]


# -- GPU: realistic shapes ---------------------------------------------------------------------------------

GPU_CASES = [
    ((8, 128, 768), (768, 3072), (3072,), None, "", "Gelu"),  # BERT-base FFN up
    ((8, 128, 3072), (3072, 768), (768,), (8, 128, 768), "", ""),  # FFN down + residual
    ((64, 197, 768), (768, 2304), (2304,), None, "", ""),  # ViT-B/16 QKV
    ((8, 12, 128, 64), (8, 12, 64, 128), None, None, "", ""),  # attention scores, batched
    ((1000, 1000), (1000, 999), (1000, 1), None, "Relu", ""),  # odd sizes
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("a_shape", "b_shape", "c_shape", "z_shape", "pre", "post"), GPU_CASES)
@pytest.mark.parametrize("config", gemm_configs(1))
def test_gemm_on_the_gpu(dtype, a_shape, b_shape, c_shape, z_shape, pre, post, config):
    torch.manual_seed(2)
    a = torch.randn(a_shape, device="cuda").to(dtype)
    b = (torch.randn(b_shape, device="cuda") / b_shape[-2] ** 0.5).to(dtype)
    c = None if c_shape is None else torch.randn(c_shape, device="cuda").to(dtype)
    z = None if z_shape is None else torch.randn(z_shape, device="cuda").to(dtype)
    want = _reference(a, b, c, z, 1.0, 1.0, False, False, pre, post)
    out = torch.full(want.shape, float("nan"), dtype=dtype, device="cuda")
    gemm(a, b, c, z, pre=pre, post=post, out=out, config=config)
    assert _error(out, want) <= BOUND[dtype]


@pytest.mark.gpu
def test_tf32_dot_is_close_and_ieee_is_exact_enough():
    torch.manual_seed(3)
    a, b = torch.randn(512, 768, device="cuda"), torch.randn(768, 1024, device="cuda")
    want = a.double() @ b.double()
    assert _error(gemm(a, b, input_precision="ieee"), want) <= 1e-5
    assert _error(gemm(a, b, input_precision="tf32"), want) <= 5e-3


def test_shared_memory_of_a_tile():
    """An A and a B block per pipeline stage: 128x256x64 in float32 on 3 stages is 288 KiB, over the H100/H200
    limit of 227 KiB (so the launcher refuses it there for TF32 products before compiling); in fp16 it fits."""
    config = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    assert shared_memory_bytes(config, 4) == 3 * (128 * 64 + 64 * 256) * 4 == 294912
    assert shared_memory_bytes(config, 2) == 147456
