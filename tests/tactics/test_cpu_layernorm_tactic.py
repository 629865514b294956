"""`cpu.layernorm`: LayerNormalization through the autotuner in float32 and bf16 against the reference (one and
several normalized axes, with and without a bias), and its reasons for declining."""

import math

import pytest
import torch

from tensorforge.kernels.cpu import layer_norm as ln
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.math_flags import cpu_native_precisions
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import layer_norm_node

TACTIC = "cpu.layernorm"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or ln.problem()
PRECISIONS = ("fp32", "bf16") if "bf16" in cpu_native_precisions() else ("fp32",)


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
@pytest.mark.parametrize(
    ("shape", "axis", "bias"), [([1, 197, 384], -1, True), ([2, 3, 5, 6], -2, False), ([4, 9], 0, True)]
)
def test_the_autotuner_times_it_and_it_matches_the_reference(shape, axis, bias):
    node = layer_norm_node(shape, axis, bias)
    x = torch.randn(shape) * 3 + 1
    choice = autotune(node, 17, [x], "cpu", effort=0, precisions=PRECISIONS, exhaustive=True)
    timed = {c.config["precision"]: c for c in choice.candidates if c.tactic == TACTIC}
    assert set(timed) == set(PRECISIONS)
    assert all(math.isfinite(c.median_ms) for c in timed.values()), [c.note for c in timed.values()]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, CPU, {}, {})([x])[0]
    for precision, candidate in timed.items():
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        got = build_layer_kernel(tactic_by_key(TACTIC), node, 17, CPU, candidate.config, {})([x.to(dtype)])[0]
        assert got.shape == want.shape and got.dtype == dtype
        assert relative_error(got.float(), want) <= TOLERANCE[precision], precision


def test_declines_the_statistics_outputs_other_stash_types_and_other_devices():
    tactic = tactic_by_key(TACTIC)
    assert "Mean and InvStdDev" in tactic.supports(layer_norm_node([2, 8], -1, outputs=("y", "mean")), 17, CPU)
    assert "stash_type" in tactic.supports(layer_norm_node([2, 8], -1, stash_type=11), 17, CPU)
    assert tactic.supports(layer_norm_node([2, 8], -1), 17, torch.device("cuda")) == "a CPU kernel"
    assert tactic.supports(layer_norm_node([2, 8], -1), 17, CPU) == _PROBLEM
