"""`cpu.expand-depthwise`: an ExpandDepthwise block (made by `passes.cpu_blocks`) through the autotuner and
`build_layer_kernel` against the reference tactic, both schedules (one pass, apart), the schedule chosen by the
expanded tensor's size, and its reasons for declining."""

from __future__ import annotations

import math

import pytest
import torch

from tensorforge.frontend import import_model
from tensorforge.kernels.cpu import expand_depthwise as ed
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.passes.test_cpu_blocks import KERNELS, SHAPE, _expanded

EXPAND = "cpu.expand-depthwise"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or ed.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _node():
    model, _ = optimize(import_model(_expanded()), device="cpu", cpu_kernels=KERNELS)
    (node,) = model.graph.nodes
    assert node.op_type == "ExpandDepthwise"
    return node


@needs_kernel
def test_both_schedules_match_the_reference_and_the_autotuner_times_the_one_for_the_size():
    node = _node()
    torch.manual_seed(0)
    feeds = [torch.randn(*SHAPE).contiguous(memory_format=torch.channels_last)]
    constants = [None] * (len(node.inputs) - 1)
    choice = autotune(node, 1, [feeds[0], *constants], "cpu", effort=0)
    timed = [c for c in choice.candidates if c.tactic == EXPAND]
    # 9×9 pixels of 16 expanded channels: far smaller than any L2, so the kernels apart
    assert {(tuple(c.config["tile"]), c.config["schedule"]) for c in timed} == {(t, "apart") for t in ed.TILES}
    assert all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for schedule in ("one pass", "apart"):
        config = {"precision": "fp32", "layout": "NHWC", "tile": list(ed.TILES[-1]), "schedule": schedule}
        got = build_layer_kernel(tactic_by_key(EXPAND), node, 1, CPU, config, {})(feeds)[0]
        assert got.shape == want.shape and relative_error(got, want) <= TOLERANCE["fp32"], schedule


def test_the_one_pass_where_the_expanded_tensor_outgrows_l2(monkeypatch):
    node = _node()
    tactic = tactic_by_key(EXPAND)
    monkeypatch.setattr(ed, "l2_bytes", lambda: 9 * 9 * 16 * 4 - 1)
    assert {c["schedule"] for c in tactic.space_for(node, 0)} == {"one pass"}
    monkeypatch.setattr(ed, "l2_bytes", lambda: 9 * 9 * 16 * 4)
    assert {c["schedule"] for c in tactic.space_for(node, 0)} == {"apart"}


def test_declines_off_the_cpu_and_activations_the_kernel_lacks():
    node = _node()
    tactic = tactic_by_key(EXPAND)
    assert tactic.supports(node, 1, torch.device("cuda")) == "a CPU kernel"
    node.attributes["expand_act"] = "Tanh"
    assert "no activation 'Tanh'" in tactic.supports(node, 1, CPU)
