"""bench/layers_vs_ort.py on a tiny two-convolution model: every ONNX Runtime node lands in exactly one row, and every
layer of our engine in one."""

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from bench import layers_vs_ort
from tensorforge.build.builder import Builder
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.frontend import import_model
from tensorforge.ir import qualified_op
from tests.helpers import make_model, tensor_info

pytest.importorskip("onnxruntime")

SHAPE = (1, 16, 8, 8)  # 16 channels: ONNX Runtime takes its NCHWc path on AVX2 and AVX-512 CPUs


def _two_convs():
    """Conv 3×3 → Relu → Conv 1×1 → Relu, the last node unnamed (our origins then say "Relu(y)")."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) / 12, "w1"),
        numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) / 4, "w2"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["y"]),
    ]
    return make_model(nodes, [tensor_info("x", list(SHAPE))], [tensor_info("y", list(SHAPE))], 17, weights)


def test_every_ort_node_lands_in_one_row_and_every_layer_of_ours_appears():
    proto = _two_convs()
    config = BuildConfig(device="cpu", profiles=(Profile().add("x", SHAPE, SHAPE, SHAPE),), effort=0)
    engine = Builder(config).build(import_model(proto))
    feeds = {"x": torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))}
    result = layers_vs_ort.measure(proto, engine, feeds, runs=2, warmup=1, rounds=2, threads=1, end_to_end=False)

    rows, coverage = result["rows"], result["coverage"]
    placed = [name for row in rows for name in row["ort_nodes"]]
    assert sorted(placed) == sorted(coverage) and len(set(placed)) == len(placed)
    assert result["totals"]["ort_nodes_unmapped"] == []
    ours = [(name, op) for row in rows for name, op in zip(row["layers"], row["layer_ops"], strict=True)]
    nodes = [engine.model.graph.nodes[layer.node] for layer in engine.plans[0].layers]
    assert sorted(ours) == sorted((node.name, qualified_op(node)) for node in nodes)
    # every ONNX node is computed by ONNX Runtime somewhere, and lies in the row of the layer of ours that fused it
    covered = {label for labels in coverage.values() for label in labels}
    assert covered == {"conv1", "relu1", "conv2", "Relu(y)"}
    for row in rows:
        if row["layers"]:
            assert row["ort_nodes"] and row["ours_ms"] > 0 and row["ort_ms"] > 0
            assert len(row["rounds_ms"]["ours"]) == len(row["rounds_ms"]["ort"]) == 2
    assert [row["delta_ms"] for row in rows] == sorted((row["delta_ms"] for row in rows), reverse=True)
    # ONNX Runtime's node times less what of its profiler they hold: the node sum beyond an unprofiled run
    totals = result["totals"]
    assert totals["ort_plain_run_ms"] > 0
    node_sum = sum(row["ort_ms"] for row in rows)
    excess = max(node_sum - totals["ort_plain_run_ms"], 0.0) / totals["ort_nodes"]
    assert totals["ort_profiler_ms_per_node"] == pytest.approx(excess)
    for row in rows:
        assert row["ort_less_profiler_ms"] == pytest.approx(max(row["ort_ms"] - excess * len(row["ort_nodes"]), 0.0))
    assert "| 1 |" in layers_vs_ort.markdown(result, "tiny", top=5)
