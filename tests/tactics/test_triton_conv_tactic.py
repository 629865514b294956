"""The Triton FusedConv tactic: its reasons for declining, its kernel through `build` under the interpreter on the
CPU, and its candidates in the autotuner on CUDA."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import DType, Node, Value
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.pool import window_geometry
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics import triton_conv
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info

TRITON_CONV = "triton.conv-igemm"
TINY = {"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 2, "num_warps": 1, "num_stages": 1, "split_k": 1}
CPU = torch.device("cpu")


def _layer(size=7, conv_attributes=None, residual=True, activation="Relu", channels=16):
    """Conv (+ Add) (+ activation), optimized into one FusedConv; returns the node and its non-constant inputs."""
    conv_attributes = conv_attributes or {"pads": [1, 1, 1, 1]}
    rng = np.random.default_rng(0)
    w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) / 4
    b = rng.standard_normal(channels).astype(np.float32)
    nodes, last = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **conv_attributes)], "c"
    inputs = [tensor_info("x", [2, channels, size, size])]
    if residual:
        inputs.append(tensor_info("r", [2, channels, *_out_size(size, conv_attributes)]))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["y"]))
        last = "y"
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info(last, None)], 17, inits)))
    (node,) = model.graph.nodes
    assert node.op_type == "FusedConv"
    return node


def _out_size(size, conv_attributes):
    a = conv_attributes
    _, _, out = window_geometry(
        [size, size], [3, 3], a.get("strides"), a.get("dilations"), a.get("pads"), a.get("auto_pad", "NOTSET")
    )
    return out


def _feeds(node, size, device="cpu"):
    """Random non-constant inputs of `node` for a `size`² input, and the reference layer kernel."""
    x = torch.randn(2, 16, size, size, device=device)
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, torch.device(device), {}, {})
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return [x, torch.randn(2, 16, *_out_size(size, node.attributes), device=device)], reference
    return [x], reference


def test_supports_gives_reasons():
    tactic = tactic_by_key(TRITON_CONV)
    node = _layer()
    assert "needs CUDA" in tactic.supports(node, 1, CPU)
    cuda = torch.device("cuda")
    assert tactic.supports(node, 1, cuda) is None
    node.attributes["pre"] = "Swish"
    assert "Swish" in tactic.supports(node, 1, cuda)
    x = Value("x", DType.FLOAT, [1, 4, 9])
    w = Value("w", DType.FLOAT, [4, 4, 3], const=torch.randn(4, 4, 3))
    conv1d = Node("FusedConv", [x, w], [Value("y", DType.FLOAT)], domain=DOMAIN)
    assert "2-D convolutions only" in tactic.supports(conv1d, 1, cuda)
    dynamic = Node(
        "FusedConv",
        [Value("x", DType.FLOAT, [1, 4, 9, 9]), Value("w", DType.FLOAT, [4, 4, 3, 3])],
        [Value("y", DType.FLOAT)],
        domain=DOMAIN,
    )
    assert "constant weight" in tactic.supports(dynamic, 1, cuda)
    double = Node(
        "FusedConv",
        [Value("x", DType.DOUBLE, [1, 4, 9, 9]), Value("w", DType.DOUBLE, [4, 4, 3, 3], const=torch.randn(4, 4, 3, 3))],
        [Value("y", DType.DOUBLE)],
        domain=DOMAIN,
    )
    assert "DOUBLE" in tactic.supports(double, 1, cuda)


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", TOLERANCE["fp32"]), ("fp16", TOLERANCE["fp16"])])
def test_built_kernel_matches_the_reference_under_the_interpreter(precision, tolerance, monkeypatch):
    """`build` directly (bypassing `supports`) in a variant: same result as the reference, for two input sizes
    (the geometry follows the shape: the node declares 7², SAME_UPPER pads 8² differently), the weight packed
    only once."""
    torch.manual_seed(0)
    packs = []
    real_pack = triton_conv.pack_weight
    monkeypatch.setattr(triton_conv, "pack_weight", lambda w, groups: packs.append(1) or real_pack(w, groups))
    node = _layer(conv_attributes={"auto_pad": "SAME_UPPER", "strides": [2, 2]})
    config = {"precision": precision, "layout": "NHWC", **TINY}
    kernel = build_layer_kernel(tactic_by_key(TRITON_CONV), node, 1, CPU, config, {})
    for size in (7, 8):
        feeds, reference = _feeds(node, size)
        got = kernel(feeds)[0]
        assert got.dtype == {"fp32": torch.float32, "fp16": torch.float16}[precision]
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert relative_error(got, reference(feeds)[0]) <= tolerance
    assert len(packs) == 1


def test_built_kernel_without_residual_or_activation():
    torch.manual_seed(1)
    node = _layer(9, {"pads": [0, 1, 1, 0], "dilations": [2, 2]}, residual=False, activation="")
    kernel = build_layer_kernel(tactic_by_key(TRITON_CONV), node, 1, CPU, {"layout": "NHWC", **TINY}, {})
    feeds, reference = _feeds(node, 9)
    assert relative_error(kernel(feeds)[0], reference(feeds)[0]) <= TOLERANCE["fp32"]


@pytest.mark.gpu
def test_the_triton_conv_is_a_correct_candidate_on_cuda():
    torch.manual_seed(2)
    node = _layer(28)
    feeds, _ = _feeds(node, 28, "cuda")
    precisions = ("fp32", "tf32", "fp16", "bf16")
    choice = autotune(
        node, 1, [feeds[0], None, None, feeds[1]], "cuda", effort=0, precisions=precisions, exhaustive=True
    )
    candidates = [c for c in choice.candidates if c.tactic == TRITON_CONV]
    assert len(candidates) == len(precisions) * len(tactic_by_key(TRITON_CONV).space_for(node, 0))
    assert all(math.isfinite(c.median_ms) for c in candidates), [c.note for c in candidates]


def test_configs_fit_the_layers_channels():
    """A 16-channel layer gets 16-wide K and N tiles, the duplicates that leaves dropped; a wide layer the space."""
    tactic = tactic_by_key(TRITON_CONV)
    narrow = tactic.space_for(_layer(), 0)
    assert narrow and all(c["block_n"] == 16 and c["block_k"] == 16 for c in narrow)
    assert len({tuple(sorted(c.items())) for c in narrow}) == len(narrow) < len(tactic.space(0))
    quantized = triton_conv.fit_configs(tactic_by_key("triton.conv-igemm-quantized").space(0), 16, 16, 32)
    assert all(c["block_k"] == 32 for c in quantized)
    assert triton_conv.fit_configs(tactic.space(1), 256, 512) == tactic.space(1)


def test_the_tma_tactics_offer_the_transposed_tile_at_effort_0_to_layers_of_64_output_channels():
    for name in ("triton.conv-tma", "triton.conv-tma-quantized"):
        tactic = tactic_by_key(name)
        assert not any(c["swap"] for c in tactic.space(0))
        assert any(c["swap"] for c in tactic.space_for(_layer(channels=64), 0)), name
        assert not any(c["swap"] for c in tactic.space_for(_layer(channels=128), 0)), name
