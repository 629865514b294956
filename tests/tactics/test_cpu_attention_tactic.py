"""`cpu.attention`: an Attention node (recognized from MatMul, scale, mask, Softmax, MatMul) through the autotuner in
float32 and bf16 against the reference, in a built engine against ONNX Runtime, and its reasons for declining."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from onnx import helper

from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tensorforge.kernels.cpu import attention as at
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops.math_flags import cpu_native_precisions
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, run_onnxruntime, tensor_info
from tests.passes.support import init

ATTENTION = "cpu.attention"
CPU = torch.device("cpu")
_PROBLEM = compiler_problem() or at.problem()
needs_kernel = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
PRECISIONS = ("fp32", "bf16") if "bf16" in cpu_native_precisions() else ("fp32",)


def _attention_model(q, kt, v, mask, merged=False):
    """softmax(Q @ Kᵀ / √D + mask) @ V with inputs of these shapes; `merged`: its heads then merged, as a
    multi-head layer does (Transpose [0, 2, 1, 3], Reshape to [B, Sq, H·Dv])."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Div", ["s", "c"], ["t"]),
        helper.make_node("Add", ["t", "mask"], ["l"]),
        helper.make_node("Softmax", ["l"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["a" if merged else "y"]),
    ]
    constants = [init("c", np.float32(math.sqrt(q[-1])))]
    if merged:
        nodes += [
            helper.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", ["at", "merged"], ["y"]),
        ]
        constants.append(init("merged", np.array([q[0], q[2], -1], np.int64)))
    inputs = [tensor_info(n, s) for n, s in (("q", q), ("kt", kt), ("v", v), ("mask", mask))]
    return make_model(nodes, inputs, [tensor_info("y", None)], 17, constants)


def _feeds(shapes, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(("q", "kt", "v"), shapes[:3], strict=True)}
    feeds["mask"] = np.where(rng.random(shapes[3]) < 0.3, -1e4, 0).astype(np.float32)
    return feeds


BERT = ([2, 12, 128, 64], [2, 12, 64, 128], [2, 12, 128, 64], [2, 1, 1, 128])
ODD = ([1, 3, 7, 24], [1, 1, 24, 19], [1, 1, 19, 40], [1, 3, 7, 19])  # K and V shared by the heads, a full mask


@needs_kernel
@pytest.mark.parametrize(("shapes", "merged"), [(BERT, False), (ODD, False), (BERT, True), (ODD, True)],
                         ids=["bert", "odd", "bert-merged", "odd-merged"])  # fmt: skip
def test_the_autotuner_times_it_and_it_matches_the_reference(shapes, merged):
    """Also with the heads' Transpose taken in (`transposed`): the result [B, Sq, H, Dv] written in place."""
    model, _ = optimize(import_model(_attention_model(*shapes, merged=merged)))
    node = model.graph.nodes[0]
    assert node.op_type == "Attention" and node.attributes.get("transposed", 0) == merged
    feeds = [torch.from_numpy(a) for a in _feeds(shapes).values()]
    choice = autotune(node, 1, feeds, "cpu", effort=0, precisions=PRECISIONS, exhaustive=True)
    timed = {c.config["precision"]: c for c in choice.candidates if c.tactic == ATTENTION}
    assert set(timed) == set(PRECISIONS)
    assert all(math.isfinite(c.median_ms) for c in timed.values()), [c.note for c in timed.values()]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    for precision, candidate in timed.items():
        kernel = build_layer_kernel(tactic_by_key(ATTENTION), node, 1, CPU, candidate.config, {})
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        got = kernel([f.to(dtype) if i < 3 else f for i, f in enumerate(feeds)])[0]
        assert got.shape == want.shape == node.outputs[0].shape and got.dtype == dtype and got.is_contiguous()
        assert relative_error(got.float(), want) <= TOLERANCE[precision], precision


@needs_kernel
def test_an_engine_times_it_and_matches_onnx_runtime():
    proto = _attention_model(*BERT)
    config = BuildConfig(device="cpu", effort=0, precisions=PRECISIONS, tactic_families=("cpu",))
    engine = build_engine(import_model(proto), config)
    (layer,) = engine.plans[0].layers
    timed = [c for c in layer.candidates if c.tactic == ATTENTION]
    assert len(timed) == len(PRECISIONS) and all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    feeds = _feeds(BERT, seed=1)
    got = torch.as_tensor(np.asarray(engine.create_context().run(feeds)["y"]))
    want = torch.from_numpy(run_onnxruntime(proto, feeds)["y"])
    assert relative_error(got.float(), want) <= TOLERANCE[layer.precision], layer.tactic


def test_declines_what_the_kernel_does_not_run():
    tactic = tactic_by_key(ATTENTION)
    wide = ([1, 2, 4, 8], [1, 2, 8, 4], [1, 2, 4, 160], [1, 1, 1, 4])
    model, _ = optimize(import_model(_attention_model(*wide)))
    (node,) = model.graph.nodes
    assert tactic.supports(node, 1, CPU) == "V's head size a known number up to 128, not 160"
    model, _ = optimize(import_model(_attention_model(*BERT)))
    (node,) = model.graph.nodes
    assert tactic.supports(node, 1, torch.device("cuda")) == "a CPU kernel"
    assert tactic.supports(node, 1, CPU) == _PROBLEM
    crossed = ([2, 12, 128, 64], [3, 12, 64, 128], [2, 12, 128, 64], [2, 1, 1, 128])
    model, _ = optimize(import_model(_attention_model(*crossed)))
    (node,) = model.graph.nodes
    assert tactic.supports(node, 1, CPU) == f"{node.inputs[1].name}'s leading axes broadcast to Q's"
