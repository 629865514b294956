"""2:4 sparsity in a build: `force` prunes and says so, `auto` finds a model's own pattern, `off` keeps the sparse
family out; the engine computes the pruned model."""

import warnings

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge import Executor
from tensorforge.build.builder import build_engine, build_families
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tensorforge.ops.structured_sparsity import is_2to4, prune_2to4
from tensorforge.runtime.inspect import sparsity_lines
from tests.helpers import DEVICES, make_model, relative_error, tensor_info


def _model(pruned: bool = False):
    """x [4, 16, 8, 8] → 1×1 conv (32) → ReLU → 3×3 conv (8) → flatten → Gemm (10): two weights a sparse kernel
    could take (the 1×1 and the product), one it could not (the 3×3)."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((32, 16, 1, 1)).astype(np.float32) / 4,
        "w2": rng.standard_normal((8, 32, 3, 3)).astype(np.float32) / 17,
        "wf": rng.standard_normal((10, 512)).astype(np.float32) / 23,
    }
    if pruned:
        weights["w1"] = prune_2to4(torch.from_numpy(weights["w1"]).reshape(32, 16)).reshape(32, 16, 1, 1).numpy()
        weights["wf"] = prune_2to4(torch.from_numpy(weights["wf"])).numpy()
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["c"], ["f"]),
        helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    return make_model(nodes, [tensor_info("x", [4, 16, 8, 8])], [tensor_info("y", None)], 17, inits)


@pytest.mark.parametrize("device", DEVICES)
def test_force_prunes_the_eligible_weights_and_the_engine_computes_the_pruned_model(device):
    engine = build_engine(import_model(_model()), BuildConfig(device=device, effort=0, sparsity="force"))
    section = engine.report["sparsity"]
    assert section["mode"] == "force" and len(section["pruned"]) == 2 and len(section["layers"]) == 2
    assert any("pruned to 2:4" in note for note in engine.report["notes"])
    assert "sparsity force: 2 weights pruned to 2:4" in sparsity_lines(engine.report)[0]
    feeds = {"x": torch.randn(4, 16, 8, 8, generator=torch.Generator().manual_seed(1))}
    want = Executor(import_model(_model(pruned=True))).run(feeds)["y"]
    got = engine.create_context().run({"x": feeds["x"].to(device)})["y"].cpu()
    assert relative_error(got.numpy(), want.numpy()) <= 1e-4
    unpruned = Executor(import_model(_model())).run(feeds)["y"]
    assert relative_error(got.numpy(), unpruned.numpy()) > 1e-2  # (pruning changed the answers, as it says)
    for node in engine.model.graph.nodes:
        if node.op_type == "FusedGemm" or (node.op_type == "FusedConv" and node.inputs[1].shape[2:] == [1, 1]):
            const = node.inputs[1].const
            assert is_2to4(const.reshape(const.shape[0], -1) if node.op_type == "FusedConv" else const)


def test_auto_finds_a_models_own_pattern_and_prunes_nothing():
    engine = build_engine(import_model(_model(pruned=True)), BuildConfig(effort=0))
    section = engine.report["sparsity"]
    assert section["mode"] == "auto" and section["pruned"] == [] and len(section["layers"]) == 2
    assert any("run dense here" in note for note in engine.report["notes"])  # (no sparse kernels on the CPU)
    assert sparsity_lines(engine.report) == ["2:4 sparse weights: 2 layers; on sparse kernels: 0 (per profile)"]
    dense = build_engine(import_model(_model()), BuildConfig(effort=0))
    assert dense.report["sparsity"]["layers"] == [] and sparsity_lines(dense.report) == []


def test_off_keeps_the_sparse_family_out_and_reports_nothing():
    engine = build_engine(import_model(_model(pruned=True)), BuildConfig(effort=0, sparsity="off"))
    assert engine.report["sparsity"] is None
    feeds = {"x": torch.randn(4, 16, 8, 8, generator=torch.Generator().manual_seed(2))}
    assert engine.create_context().run(feeds)["y"].shape == (4, 10)  # (a context reads the absent section)
    families = build_families(BuildConfig(sparsity="off"))
    assert "sparse" not in families and {"vendor", "triton", "reference"} <= set(families)
    assert build_families(BuildConfig(sparsity="off", tactic_families=("vendor", "sparse"))) == ("vendor",)
    assert build_families(BuildConfig()) is None


@pytest.mark.gpu
def test_a_context_without_cuda_graphs_warns_when_layers_run_on_sparse_kernels():
    """Eagerly, torch's cuSPARSELt products cost far more than in a graph replay (docs/design.md)."""
    engine = build_engine(
        import_model(_model()), BuildConfig(device="cuda", effort=0, sparsity="force", precisions=("fp32", "fp16"))
    )
    sparse = any(nodes for nodes in engine.report["sparsity"]["sparse_kernels"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.create_context(cuda_graphs=False)
        engine.create_context()
    said = [w for w in caught if "2:4 sparse kernels" in str(w.message)]
    assert len(said) == (1 if sparse else 0)
