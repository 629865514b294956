"""The squeeze-and-excitation tactics: `triton.squeeze-excite` (its reasons for declining, its kernel through
`build` under the interpreter on the CPU against the reference tactic) and `vendor.torch-squeeze-excite` in half
precision, and both as candidates of the autotuner on CUDA at the blocks of EfficientNet-B0 and MobileNetV3."""

import math

import numpy as np
import pytest
import torch
from onnx import helper

from tensorforge.frontend import import_model
from tensorforge.ir import DType, Node, Value
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.math_flags import full_float32
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.variant import PRECISION_DTYPE
from tests.helpers import make_model, tensor_info
from tests.passes.support import init

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
TRITON = "triton.squeeze-excite"
VENDOR = "vendor.torch-squeeze-excite"
TINY_TILE = {"block_p": 8, "block_c": 4, "block_r": 2, "num_warps": 1}


def _se_node(channels=10, hidden=3, size=5, batch=2, act1="SiLU", act2="HardSigmoid") -> Node:
    """x → GlobalAveragePool → Conv 1×1 → act1 → Conv 1×1 → act2 → Mul with x, fused for a CUDA build into one
    SqueezeExcite node. SiLU is written x·σ(x) as exporters write it; HardSigmoid takes torch's 1/6 and 1/2."""
    rng = np.random.default_rng(0)
    inits = [
        init("w1", rng.standard_normal((hidden, channels, 1, 1)).astype(np.float32) * 2 / channels**0.5),
        init("b1", rng.standard_normal(hidden).astype(np.float32)),
        init("w2", rng.standard_normal((channels, hidden, 1, 1)).astype(np.float32) * 2 / hidden**0.5),
        init("b2", rng.standard_normal(channels).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["s"]),
        helper.make_node("Conv", ["s", "w1", "b1"], ["h0"], kernel_shape=[1, 1]),
    ]
    if act1 == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["h0"], ["h_sig"]), helper.make_node("Mul", ["h0", "h_sig"], ["h"])]
    else:
        nodes.append(helper.make_node(act1, ["h0"], ["h"]))
    nodes.append(helper.make_node("Conv", ["h", "w2", "b2"], ["g0"], kernel_shape=[1, 1]))
    gate_attributes = {"alpha": 1 / 6, "beta": 0.5} if act2 == "HardSigmoid" else {}
    nodes += [helper.make_node(act2, ["g0"], ["g"], **gate_attributes), helper.make_node("Mul", ["x", "g"], ["y"])]
    shape = [batch, channels, size, size]
    proto = make_model(nodes, [tensor_info("x", shape)], [tensor_info("y", None)], 17, inits)
    model, _ = optimize(import_model(proto), device="cuda")
    (node,) = model.graph.nodes
    assert (node.op_type, node.attributes["act1"], node.attributes["act2"]) == ("SqueezeExcite", act1, act2)
    return node


def _reference(node, device=CPU):
    return build_layer_kernel(tactic_by_key("reference.registry"), node, 1, device, {}, {})


def _poisoning_alloc(device, made):
    """An `Alloc` that hands out NaN-filled buffers and remembers them."""

    def alloc(index, shape, dtype, memory_format):
        buffer = torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
        buffer = buffer.contiguous(memory_format=memory_format)
        made.append(buffer)
        return buffer

    return alloc


def _input(shape, layout, device=CPU):
    x = torch.randn(*shape, device=device)
    return x.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else x


# -- supports --------------------------------------------------------------------------------------------


def test_supports_gives_reasons():
    tactic = tactic_by_key(TRITON)
    node = _se_node()
    assert "needs CUDA" in tactic.supports(node, 1, CPU)
    assert tactic.supports(node, 1, CUDA) is None
    assert tactic.supports(_se_node(act1="Relu", act2="Sigmoid"), 1, CUDA) is None
    node.attributes["act2"] = "Swish"
    assert "Swish" in tactic.supports(node, 1, CUDA)

    def squeeze_excite(x_shape, w1_shape, w2_shape, dtype=DType.FLOAT):
        def weight(name, shape):
            return Value(name, dtype, shape, const=torch.randn(shape).to(dtype.torch))

        inputs = [Value("x", dtype, x_shape), weight("w1", w1_shape), None, weight("w2", w2_shape), None]
        return Node("SqueezeExcite", inputs, [Value("y", dtype, x_shape)], {}, domain=DOMAIN)

    assert tactic.supports(squeeze_excite([1, 8, 5, 5], [2, 8, 1, 1], [8, 2, 1, 1]), 1, CUDA) is None
    assert "DOUBLE" in tactic.supports(squeeze_excite([1, 8, 5, 5], [2, 8, 1, 1], [8, 2, 1, 1], DType.DOUBLE), 1, CUDA)
    assert "rank 3" in tactic.supports(squeeze_excite([1, 8, 5], [2, 8, 1, 1], [8, 2, 1, 1]), 1, CUDA)
    assert "1×1 weights only" in tactic.supports(squeeze_excite([1, 8, 5, 5], [2, 8, 3, 3], [8, 2, 1, 1]), 1, CUDA)
    assert "do not map" in tactic.supports(squeeze_excite([1, 8, 5, 5], [2, 6, 1, 1], [8, 2, 1, 1]), 1, CUDA)


def test_both_tactics_offer_half_precision():
    assert set(tactic_by_key(TRITON).precisions) == {"fp32", "fp16", "bf16"}
    assert set(tactic_by_key(VENDOR).precisions) == {"fp32", "fp16", "bf16"}
    assert tactic_by_key(TRITON).writes_into


# -- kernels through build, under the interpreter -----------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(("act1", "act2"), [("SiLU", "Sigmoid"), ("Relu", "HardSigmoid")])
def test_triton_kernel_matches_the_reference(precision, layout, act1, act2):
    """`build` directly (bypassing `supports`) in a variant: the reference's result in the buffer the context
    gives, in the input's memory format, and again at another batch size with the same prepared weights."""
    torch.manual_seed(0)
    node = _se_node(act1=act1, act2=act2)
    config = {"precision": precision, "layout": "any", **TINY_TILE}
    kernel = build_layer_kernel(tactic_by_key(TRITON), node, 1, CPU, config, {})
    for batch in (2, 3):
        x = _input((batch, 10, 5, 5), layout)
        made = []
        got = kernel([x], alloc=_poisoning_alloc(CPU, made))[0]
        assert got is made[0]
        assert got.dtype == PRECISION_DTYPE[precision]
        assert got.is_contiguous(memory_format=torch.channels_last) == (layout == "NHWC")
        assert relative_error(got, _reference(node)([x])[0]) <= TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_vendor_kernel_runs_in_half_precision(precision):
    torch.manual_seed(1)
    node = _se_node(act1="Relu", act2="HardSigmoid")
    kernel = build_layer_kernel(tactic_by_key(VENDOR), node, 1, CPU, {"precision": precision}, {})
    x = _input((2, 10, 5, 5), "NHWC")
    got = kernel([x])[0]
    assert got.dtype == PRECISION_DTYPE[precision]
    assert relative_error(got, _reference(node)([x])[0]) <= TOLERANCE[precision]


def test_the_autotuner_on_the_cpu_leaves_the_triton_kernel_out_with_its_reason():
    node = _se_node()
    choice = autotune(node, 1, [torch.randn(2, 10, 5, 5)], "cpu", effort=0)
    (triton_candidate,) = [c for c in choice.candidates if c.tactic == TRITON]
    assert "needs CUDA" in triton_candidate.note
    assert choice.tactic in (VENDOR, "cpu.squeeze-excite", "reference.registry")  # a CPU tactic, timed


# -- the autotuner on CUDA -----------------------------------------------------------------------------------

# (channels, hidden units, map size, act1, act2) of EfficientNet-B0's and MobileNetV3-Large's blocks at 224×224
REAL_BLOCKS = {
    "effnet-32-112": (32, 8, 112, "SiLU", "Sigmoid"),
    "effnet-96-56": (96, 4, 56, "SiLU", "Sigmoid"),
    "effnet-240-28": (240, 10, 28, "SiLU", "Sigmoid"),
    "effnet-672-14": (672, 28, 14, "SiLU", "Sigmoid"),
    "effnet-1152-7": (1152, 48, 7, "SiLU", "Sigmoid"),
    "mnv3-72-28": (72, 24, 28, "Relu", "HardSigmoid"),
    "mnv3-480-14": (480, 120, 14, "Relu", "HardSigmoid"),
    "mnv3-960-7": (960, 240, 7, "Relu", "HardSigmoid"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("name", list(REAL_BLOCKS))
def test_both_tactics_are_correct_candidates_on_cuda_in_fp16(batch, name):
    """Every Triton configuration at effort 0 and the vendor tactic, in fp16 on a channels_last fp16 input (as
    the engine's convolutions deliver it), run correctly; the table shows which is faster. (Every configuration
    of every effort is checked against the reference in the kernel's own GPU tests.)"""
    torch.manual_seed(2)
    channels, hidden, size, act1, act2 = REAL_BLOCKS[name]
    node = _se_node(channels, hidden, size, batch, act1, act2)
    x = _input((batch, channels, size, size), "NHWC", CUDA).half()
    choice = autotune(node, 1, [x], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    print(choice.table(f"SqueezeExcite {name} batch {batch}"))
    triton_fp16 = [c for c in choice.candidates if c.tactic == TRITON and c.config["precision"] == "fp16"]
    assert len(triton_fp16) == len(tactic_by_key(TRITON).space(0))
    assert all(math.isfinite(c.median_ms) for c in triton_fp16), [c.note for c in triton_fp16]
    vendor_fp16 = [c for c in choice.candidates if c.tactic == VENDOR and c.config["precision"] == "fp16"]
    assert len(vendor_fp16) == 1 and math.isfinite(vendor_fp16[0].median_ms), vendor_fp16[0].note


@pytest.mark.gpu
def test_the_triton_kernel_writes_into_the_given_buffer_on_cuda():
    torch.manual_seed(3)
    node = _se_node(1152, 48, 7, 1, "SiLU", "Sigmoid")
    config = {"precision": "fp16", "layout": "any", **tactic_by_key(TRITON).space(0)[0]}
    kernel = build_layer_kernel(tactic_by_key(TRITON), node, 1, CUDA, config, {})
    x = _input((1, 1152, 7, 7), "NHWC", CUDA).half()
    made = []
    got = kernel([x], alloc=_poisoning_alloc(CUDA, made))[0]
    assert got is made[0] and got.is_contiguous(memory_format=torch.channels_last)
    with full_float32():  # no TF32 in the reference's convolutions
        want = _reference(node, CUDA)([x.float()])[0]
    assert relative_error(got, want) <= TOLERANCE["fp16"]
