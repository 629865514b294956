"""The Triton depthwise and pooling tactics: their reasons for declining, their kernels through `build` under the
interpreter on the CPU (against the reference tactic), and their candidates in the autotuner on CUDA."""

import math

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import DType, Node, Value
from tensorforge.ops.fused import DOMAIN
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics import triton_family
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
DEPTHWISE = "triton.depthwise"
TINY_TILE = {"block_p": 8, "block_c": 4, "num_warps": 1}


def _depthwise_layer(channels=8, multiplier=1, conv_attributes=None, activation="Relu", residual=False, size=7):
    """Conv with group == channels (+ Add) (+ activation), optimized into one FusedConv."""
    conv_attributes = conv_attributes or {"pads": [1, 1, 1, 1]}
    rng = np.random.default_rng(0)
    cout = channels * multiplier
    w = rng.standard_normal((cout, 1, 3, 3)).astype(np.float32) / 3
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=channels, **conv_attributes)]
    inputs, last = [tensor_info("x", [2, channels, size, size])], "c"
    if residual:
        inputs.append(tensor_info("r", [2, cout, size, size]))
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


def _single_node(op_type, shape, attributes, opset=17, extra_inputs=(), initializers=(), dtype=TensorProto.FLOAT):
    proto = make_model(
        [helper.make_node(op_type, ["x", *[name for name, _ in extra_inputs]], ["y"], **attributes)],
        [tensor_info("x", list(shape), dtype)],
        [tensor_info("y", None, dtype)],
        opset,
        initializers,
    )
    (node,) = import_model(proto).graph.nodes
    return node


def _reference(node, opset, device=CPU):
    return build_layer_kernel(tactic_by_key("reference.registry"), node, opset, device, {}, {})


def _poisoning_alloc(device, made):
    """An `Alloc` that hands out NaN-filled buffers and remembers them."""

    def alloc(index, shape, dtype, memory_format):
        buffer = torch.full(tuple(shape), float("nan"), dtype=dtype, device=device).contiguous(
            memory_format=memory_format
        )
        made.append(buffer)
        return buffer

    return alloc


# -- supports --------------------------------------------------------------------------------------------


def test_depthwise_supports_gives_reasons():
    tactic = tactic_by_key(DEPTHWISE)
    node = _depthwise_layer()
    assert "needs CUDA" in tactic.supports(node, 1, CPU)
    assert tactic.supports(node, 1, CUDA) is None
    assert tactic.supports(_depthwise_layer(multiplier=2), 1, CUDA) is None
    node.attributes["post"] = "Swish"
    assert "Swish" in tactic.supports(node, 1, CUDA)

    def fused(x_shape, w_shape, group, const=True, dtype=DType.FLOAT):
        weight = torch.randn(w_shape).to(dtype.torch)
        inputs = [Value("x", dtype, x_shape), Value("w", dtype, w_shape, const=weight if const else None)]
        return Node("FusedConv", inputs, [Value("y", dtype)], {"group": group}, domain=DOMAIN)

    assert "one input channel per group" in tactic.supports(fused([1, 8, 9, 9], [8, 4, 3, 3], 2), 1, CUDA)
    assert "constant weight" in tactic.supports(fused([1, 8, 9, 9], [8, 1, 3, 3], 8, const=False), 1, CUDA)
    assert "2-D convolutions only" in tactic.supports(fused([1, 8, 9], [8, 1, 3], 8), 1, CUDA)
    assert "DOUBLE" in tactic.supports(fused([1, 8, 9, 9], [8, 1, 3, 3], 8, dtype=DType.DOUBLE), 1, CUDA)
    assert "group == input channels" in tactic.supports(fused([1, 8, 9, 9], [8, 1, 3, 3], 4), 1, CUDA)


def test_pool_supports_give_reasons():
    maxpool, avgpool = tactic_by_key("triton.maxpool"), tactic_by_key("triton.avgpool")
    window = {"kernel_shape": [3, 3], "strides": [2, 2]}
    node = _single_node("MaxPool", [1, 4, 9, 9], window)
    assert "needs CUDA" in maxpool.supports(node, 17, CPU)
    assert maxpool.supports(node, 17, CUDA) is None
    assert avgpool.supports(_single_node("AveragePool", [1, 4, 9, 9], window), 17, CUDA) is None
    pool_1d = _single_node("AveragePool", [1, 4, 9], {"kernel_shape": [3]})
    assert "rank 3" in avgpool.supports(pool_1d, 17, CUDA)
    integer = Node(
        "MaxPool", [Value("x", DType.INT8, [1, 4, 9, 9])], [Value("y", DType.INT8)], {"kernel_shape": [2, 2]}
    )
    assert maxpool.supports(integer, 17, CUDA) is None  # a quantized activation passed through the pool
    wide = Node("MaxPool", [Value("x", DType.INT32, [1, 4, 9, 9])], [Value("y", DType.INT32)], {"kernel_shape": [2, 2]})
    assert "INT32" in maxpool.supports(wide, 17, CUDA)
    averaged = Node(
        "AveragePool", [Value("x", DType.INT8, [1, 4, 9, 9])], [Value("y", DType.INT8)], {"kernel_shape": [2, 2]}
    )
    assert "INT8" in avgpool.supports(averaged, 17, CUDA)
    with_indices = Node(
        "MaxPool",
        [Value("x", DType.FLOAT, [1, 4, 9, 9])],
        [Value("y", DType.FLOAT), Value("i", DType.INT64)],
        {"kernel_shape": [2, 2]},
    )
    assert "indices" in maxpool.supports(with_indices, 17, CUDA)


def test_global_pool_supports_reduce_mean_over_h_and_w_only():
    tactic = tactic_by_key("triton.global-avgpool")
    assert tactic.supports(_single_node("GlobalAveragePool", [1, 8, 5, 5], {}), 17, CUDA) is None
    assert "needs CUDA" in tactic.supports(_single_node("GlobalAveragePool", [1, 8, 5, 5], {}), 17, CPU)
    assert tactic.supports(_single_node("ReduceMean", [1, 8, 5, 5], {"axes": [2, 3]}, 13), 13, CUDA) is None
    assert tactic.supports(_single_node("ReduceMean", [1, 8, 5, 5], {"axes": [-1, -2]}, 13), 13, CUDA) is None
    assert "[1]" in tactic.supports(_single_node("ReduceMean", [1, 8, 5, 5], {"axes": [1]}, 13), 13, CUDA)
    not_kept = _single_node("ReduceMean", [1, 8, 5, 5], {"axes": [2, 3], "keepdims": 0}, 13)
    assert "keepdims=1" in tactic.supports(not_kept, 13, CUDA)
    axes = numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes")
    opset18 = _single_node("ReduceMean", [1, 8, 5, 5], {}, 18, [("axes", None)], [axes])
    assert tactic.supports(opset18, 18, CUDA) is None
    every_axis = _single_node("ReduceMean", [1, 8, 5, 5], {}, 18)
    assert "every axis" in tactic.supports(every_axis, 18, CUDA)
    computed_axes = Node(
        "ReduceMean", [Value("x", DType.FLOAT, [1, 8, 5, 5]), Value("a", DType.INT64, [2])], [Value("y")]
    )
    assert "run time" in tactic.supports(computed_axes, 18, CUDA)
    rank3 = _single_node("GlobalAveragePool", [1, 8, 5], {})
    assert "rank 3" in tactic.supports(rank3, 17, CUDA)


# -- kernels through build, under the interpreter -----------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_depthwise_kernel_matches_the_reference_and_packs_once(precision, monkeypatch):
    """`build` directly (bypassing `supports`) in a variant: the reference's result for two input sizes (the
    node declares 7², SAME_UPPER pads 8² differently), the weight packed only once, the output in the buffer
    the context gives."""
    torch.manual_seed(0)
    packs = []
    real_pack = triton_family.pack_depthwise_weight
    monkeypatch.setattr(triton_family, "pack_depthwise_weight", lambda w: packs.append(1) or real_pack(w))
    node = _depthwise_layer(conv_attributes={"auto_pad": "SAME_UPPER", "strides": [2, 2]}, activation="HardSwish")
    config = {"precision": precision, "layout": "NHWC", **TINY_TILE}
    kernel = build_layer_kernel(tactic_by_key(DEPTHWISE), node, 1, CPU, config, {})
    for size in (7, 8):
        x = torch.randn(2, 8, size, size)
        made = []
        got = kernel([x], alloc=_poisoning_alloc(CPU, made))[0]
        assert got is made[0] and got.is_contiguous(memory_format=torch.channels_last)
        assert got.dtype == {"fp32": torch.float32, "fp16": torch.float16}[precision]
        assert relative_error(got, _reference(node, 1)([x])[0]) <= TOLERANCE[precision]
    assert len(packs) == 1


def test_depthwise_kernel_with_multiplier_and_residual():
    torch.manual_seed(1)
    node = _depthwise_layer(channels=4, multiplier=2, activation="Relu", residual=True)
    kernel = build_layer_kernel(tactic_by_key(DEPTHWISE), node, 1, CPU, {"layout": "NHWC", **TINY_TILE}, {})
    feeds = [torch.randn(2, 4, 7, 7), torch.randn(2, 8, 7, 7)]
    assert relative_error(kernel(feeds)[0], _reference(node, 1)(feeds)[0]) <= TOLERANCE["fp32"]


POOL_NODES = {
    "maxpool": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 17),
    "avgpool": (
        "AveragePool",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
        19,
    ),
    "avgpool-exclude-pad": ("AveragePool", {"kernel_shape": [2, 3], "pads": [0, 1, 1, 0]}, 17),
    "global-avgpool": ("GlobalAveragePool", {}, 17),
}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", list(POOL_NODES))
def test_pool_kernels_match_the_reference(name, layout, precision):
    """On inputs that fp16 holds exactly, a max is exact and averages tight: in fp16 both round the reference's
    float32 result once."""
    torch.manual_seed(2)
    op_type, attributes, opset = POOL_NODES[name]
    node = _single_node(op_type, [2, 6, 9, 8], attributes, opset)
    key = "triton." + name.removesuffix("-exclude-pad")
    tile = TINY_TILE if op_type != "GlobalAveragePool" else {**TINY_TILE, "splits": 2}
    kernel = build_layer_kernel(
        tactic_by_key(key), node, opset, CPU, {"precision": precision, "layout": layout, **tile}, {}
    )
    x = torch.randn(2, 6, 9, 8).half().float()
    made = []
    got = kernel([x], alloc=_poisoning_alloc(CPU, made))[0]
    assert got is made[0]
    want = _reference(node, opset)([x])[0].to(got.dtype)
    if op_type == "MaxPool":
        assert torch.equal(got, want)
    else:
        eps = torch.finfo(got.dtype).eps if precision == "fp16" else 1e-6
        torch.testing.assert_close(got.float(), want.float(), rtol=eps, atol=1e-6)


def test_reduce_mean_runs_as_the_global_pool():
    torch.manual_seed(3)
    axes = numpy_helper.from_array(np.array([-2, -1], dtype=np.int64), "axes")
    node = _single_node("ReduceMean", [1, 16, 6, 6], {"keepdims": 1}, 18, [("axes", None)], [axes])
    config = {"layout": "NHWC", **TINY_TILE, "splits": "auto"}
    kernel = build_layer_kernel(tactic_by_key("triton.global-avgpool"), node, 18, CPU, config, {})
    x = torch.randn(1, 16, 6, 6)
    got = kernel([x])[0]
    assert got.shape == (1, 16, 1, 1)
    torch.testing.assert_close(got, _reference(node, 18)([x])[0], rtol=1e-6, atol=1e-6)


# -- the autotuner on CUDA ------------------------------------------------------------------------------------


def _assert_all_candidates_ran(choice, key, count):
    candidates = [c for c in choice.candidates if c.tactic == key]
    assert len(candidates) == count
    assert all(math.isfinite(c.median_ms) for c in candidates), [c.note for c in candidates]


@pytest.mark.gpu
def test_the_depthwise_conv_is_a_correct_candidate_on_cuda():
    torch.manual_seed(4)
    node = _depthwise_layer(channels=96, conv_attributes={"pads": [1, 1, 1, 1]}, activation="HardSwish", size=56)
    x = torch.randn(8, 96, 56, 56, device="cuda")
    precisions = ("fp32", "fp16", "bf16")
    choice = autotune(node, 1, [x], "cuda", effort=0, precisions=precisions, exhaustive=True)
    print(choice.table("depthwise 3x3 C=96 56x56 batch 8"))
    _assert_all_candidates_ran(choice, DEPTHWISE, len(precisions) * len(tactic_by_key(DEPTHWISE).space(0)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(POOL_NODES))
def test_the_pools_are_correct_candidates_on_cuda(name):
    torch.manual_seed(5)
    op_type, attributes, opset = POOL_NODES[name]
    node = _single_node(op_type, [8, 64, 56, 56], attributes, opset)
    x = torch.randn(8, 64, 56, 56, device="cuda").contiguous(memory_format=torch.channels_last)
    key = "triton." + name.removesuffix("-exclude-pad")
    choice = autotune(node, opset, [x], "cuda", effort=1, precisions=("fp32", "fp16"), exhaustive=True)
    print(choice.table(name))
    _assert_all_candidates_ran(choice, key, 2 * len(tactic_by_key(key).space(1)))


@pytest.mark.gpu
def test_reduce_mean_is_a_correct_candidate_on_cuda():
    axes = numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes")
    node = _single_node("ReduceMean", [1, 72, 56, 56], {}, 18, [("axes", None)], [axes])
    x = torch.randn(1, 72, 56, 56, device="cuda").contiguous(memory_format=torch.channels_last)
    choice = autotune(node, 18, [x], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    key = "triton.global-avgpool"
    _assert_all_candidates_ran(choice, key, 2 * len(tactic_by_key(key).space(0)))
