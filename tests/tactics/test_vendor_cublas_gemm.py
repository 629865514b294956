"""The cuBLAS tactic for FusedGemm: its kernel against the reference over its epilogues (the torch calls run on
the CPU too, so the logic is checked here; on CUDA it competes in the autotuner), and what it declines."""

import math

import pytest
import torch

from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import fused_gemm

TACTIC = "vendor.cublas-gemm"
CPU = torch.device("cpu")
CASES = [
    ([2, 7, 32], "Gelu", False, False, True),  # GELU after cuBLAS's bias epilogue
    ([5, 32], "Relu", True, False, False),  # ReLU inside cuBLASLt's epilogue
    ([3, 32], "", True, False, False),
    ([2, 7, 32], "", False, True, True),  # the residual added in place
    ([2, 7, 32], "Relu", False, True, True),  # ReLU after the residual
]


@pytest.mark.parametrize(("x_shape", "activation", "trans_b", "residual", "matmul"), CASES)
def test_the_kernel_matches_the_reference(x_shape, activation, trans_b, residual, matmul):
    node, feeds = fused_gemm(x_shape, activation, trans_b, residual, matmul)
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, {}, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    assert got.shape == want.shape and relative_error(got, want) <= 1e-5


def test_it_runs_on_cuda_only_and_needs_a_constant_weight():
    tactic = tactic_by_key(TACTIC)
    node, _ = fused_gemm([4, 16], "Relu")
    assert tactic.supports(node, 1, CPU) == "needs CUDA (cuBLAS)"
    assert tactic.supports(node, 1, torch.device("cuda")) is None


@pytest.mark.gpu
@pytest.mark.parametrize(("x_shape", "activation", "trans_b", "residual", "matmul"), CASES)
def test_on_cuda_every_variant_is_correct(x_shape, activation, trans_b, residual, matmul):
    """Timed beside the others by the autotuner, which checks each variant (fp32, tf32, fp16, bf16) against the
    reference with its precision's tolerance: none may be refused as wrong."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    node, feeds = fused_gemm(x_shape, activation, trans_b, residual, matmul)
    inputs = [feeds[0].cuda(), None, None, *[f.cuda() for f in feeds[1:]]]
    choice = autotune(node, 1, inputs, "cuda", effort=0, precisions=("fp32", "tf32", "fp16", "bf16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == TACTIC]
    assert ours and all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]
