"""The CPU block fusions (CPU builds with our kernels): a depthwise convolution or a squeeze-excite block with the
1×1 convolution after it, a classifier's head (pool, flatten, product). The fused graph computes what the original
did; what must not fuse stays apart, with the reason."""

import numpy as np
import pytest
import torch
from onnx import helper

from tensorforge import zoo
from tensorforge.frontend import import_model
from tensorforge.passes.cpu_blocks import CpuKernels
from tensorforge.passes.pipeline import default_passes, optimize
from tests.helpers import make_model, tensor_info
from tests.passes.support import init, ops, optimize_and_compare

SHAPE = [2, 16, 9, 9]
KERNELS = CpuKernels(convolution=("", "Relu", "Clip", "HardSwish"), gate=("", "Relu", "HardSigmoid", "Sigmoid"))


def _block(act="Relu", stride=2, residual=False, dw_output=False, act_after="HardSwish"):
    """x → depthwise 3×3 (16 channels, `stride`) → BatchNorm → act → Conv 1×1 (16→24) [+ r] [→ act_after]."""
    rng = np.random.default_rng(0)
    inits = [
        init("wd", rng.standard_normal((16, 1, 3, 3)).astype(np.float32) * 0.3),
        init("bd", rng.standard_normal(16).astype(np.float32)),
        init("scale", rng.uniform(0.5, 1.5, 16).astype(np.float32)),
        init("shift", rng.standard_normal(16).astype(np.float32)),
        init("mean", rng.standard_normal(16).astype(np.float32) * 0.1),
        init("var", rng.uniform(0.5, 1.5, 16).astype(np.float32)),
        init("wp", rng.standard_normal((24, 16, 1, 1)).astype(np.float32) * 0.25),
        init("bp", rng.standard_normal(24).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "wd", "bd"], ["d0"], group=16, pads=[1, 1, 1, 1], strides=[stride] * 2),
        helper.make_node("BatchNormalization", ["d0", "scale", "shift", "mean", "var"], ["d1"]),
        helper.make_node(act, ["d1"], ["d"]),
        helper.make_node("Conv", ["d", "wp", "bp"], ["p"]),
    ]
    last, out_hw = "p", (SHAPE[2] + 2 - 3) // stride + 1
    inputs = [tensor_info("x", SHAPE)]
    if residual:
        inputs.append(tensor_info("r", [2, 24, out_hw, out_hw]))
        nodes.append(helper.make_node("Add", [last, "r"], ["s"]))
        last = "s"
    if act_after:
        nodes.append(helper.make_node(act_after, [last], ["y"]))
        last = "y"
    outputs = [tensor_info(last, None)] + ([tensor_info("d", None)] if dw_output else [])
    return make_model(nodes, inputs, outputs, 17, inits)


def _feeds(residual=False, stride=2):
    out_hw = (SHAPE[2] + 2 - 3) // stride + 1
    feeds = [{"x": torch.randn(*SHAPE)}, {"x": torch.randn(*SHAPE) * 4}]
    for f in feeds:
        if residual:
            f["r"] = torch.randn(2, 24, out_hw, out_hw)
    return feeds


def _passes():
    return default_passes("cpu", KERNELS)


@pytest.mark.parametrize(("stride", "residual"), [(2, False), (1, True)])
def test_a_depthwise_and_its_1x1_fuse_into_one_node_with_the_same_results(stride, residual):
    model, report = optimize_and_compare(_block(stride=stride, residual=residual), _feeds(residual, stride), _passes())
    assert ops(model) == ["DepthwisePointwise"]
    (node,) = model.graph.nodes
    a = node.attributes
    assert a["act"] == "Relu" and a["strides"] == [stride, stride] and a["pads"] == [1, 1, 1, 1]
    assert (a.get("pre", ""), a.get("post", "")) == (("", "HardSwish") if residual else ("HardSwish", ""))
    assert (node.inputs[5] is not None) == residual
    assert any(e.rule == "depthwise-pointwise" and e.status == "fired" for e in report.events)


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (_block(dw_output=True), "is a graph output"),
        (_block(act="Sigmoid"), "no activation 'Sigmoid'"),
        (_block(act_after="Sigmoid"), "no activation 'Sigmoid'"),
    ],
)
def test_what_the_kernel_cannot_take_stays_apart_with_the_reason(block, reason):
    model, report = optimize_and_compare(block, _feeds(), _passes())
    assert "DepthwisePointwise" not in ops(model)
    declined = [e for e in report.events if e.rule == "depthwise-pointwise" and e.status == "declined"]
    assert declined and reason in declined[0].detail


def test_only_cpu_builds_with_the_kernel_fuse():
    for passes in (default_passes("cpu"), default_passes("cuda", KERNELS), default_passes()):
        model, _ = optimize_and_compare(_block(), _feeds(), passes)
        assert "DepthwisePointwise" not in ops(model)


def test_mobilenetv3_fuses_its_seven_depthwise_blocks_and_eight_squeeze_excite_blocks():
    model = import_model(zoo.export("mobilenetv3", batch=1, size=64, dynamic_batch=False))
    model, _ = optimize(model, device="cpu", cpu_kernels=KERNELS)
    kinds = ops(model)  # six of the seven depthwise + 1×1 blocks then take their expansions too
    assert kinds.count("DepthwisePointwise") + kinds.count("ExpandDepthwise") - 8 == 7
    assert kinds.count("SqueezeExcitePointwise") == 8 and "SqueezeExcite" not in kinds


def _se_block(residual=False, gate_is_output=False, act2="HardSigmoid"):
    """x → squeeze-excite (16 channels through 4, Relu and `act2`) → Conv 1×1 (16→24) [+ r] → Relu."""
    rng = np.random.default_rng(1)
    inits = [
        init("w1", rng.standard_normal((4, 16, 1, 1)).astype(np.float32) * 0.3),
        init("b1", rng.standard_normal(4).astype(np.float32)),
        init("w2", rng.standard_normal((16, 4, 1, 1)).astype(np.float32) * 0.3),
        init("b2", rng.standard_normal(16).astype(np.float32)),
        init("wp", rng.standard_normal((24, 16, 1, 1)).astype(np.float32) * 0.25),
        init("bp", rng.standard_normal(24).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["s"]),
        helper.make_node("Conv", ["s", "w1", "b1"], ["h0"]),
        helper.make_node("Relu", ["h0"], ["h"]),
        helper.make_node("Conv", ["h", "w2", "b2"], ["g0"]),
        helper.make_node(act2, ["g0"], ["g"]),
        helper.make_node("Mul", ["x", "g"], ["gated"]),
        helper.make_node("Conv", ["gated", "wp", "bp"], ["p"]),
    ]
    inputs, last = [tensor_info("x", SHAPE)], "p"
    if residual:
        inputs.append(tensor_info("r", [2, 24, *SHAPE[2:]]))
        nodes.append(helper.make_node("Add", ["p", "r"], ["q"]))
        last = "q"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    outputs = [tensor_info("y", None)] + ([tensor_info("gated", None)] if gate_is_output else [])
    return make_model(nodes, inputs, outputs, 17, inits)


def _se_feeds(residual=False):
    return [
        {"x": torch.randn(*SHAPE) * scale, **({"r": torch.randn(2, 24, *SHAPE[2:])} if residual else {})}
        for scale in (1, 4)
    ]


@pytest.mark.parametrize("residual", [False, True])
def test_a_squeeze_excite_block_and_its_1x1_fuse_into_one_node_with_the_same_results(residual):
    model, report = optimize_and_compare(_se_block(residual), _se_feeds(residual), _passes())
    assert ops(model) == ["SqueezeExcitePointwise"]
    (node,) = model.graph.nodes
    a = node.attributes
    assert (a["act1"], a["act2"]) == ("Relu", "HardSigmoid")
    assert (a.get("pre", ""), a.get("post", "")) == (("", "Relu") if residual else ("Relu", ""))
    assert (node.inputs[7] is not None) == residual
    assert any(e.rule == "squeeze-excite-pointwise" and e.status == "fired" for e in report.events)


@pytest.mark.parametrize(
    ("block", "reason"),
    [(_se_block(gate_is_output=True), "is a graph output"), (_se_block(act2="Tanh"), "no activation 'Tanh'")],
)
def test_a_squeeze_excite_block_the_kernels_cannot_take_stays_apart(block, reason):
    model, report = optimize_and_compare(block, _se_feeds(), _passes())
    assert "SqueezeExcitePointwise" not in ops(model)
    declined = [e for e in report.events if e.rule == "squeeze-excite-pointwise" and e.status == "declined"]
    assert declined and reason in declined[0].detail


def _head(flatten_axis=1, residual=False, pooled_output=False, activation="HardSwish", trans_b=1):
    """x [2, 16, 5, 5] → GlobalAveragePool → Flatten → Gemm (16→24, `trans_b`) [+ r] [→ activation]."""
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((24, 16) if trans_b else (16, 24)).astype(np.float32) * 0.3
    inits = [init("w", weight), init("b", rng.standard_normal(24).astype(np.float32))]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=flatten_axis),
        helper.make_node("Gemm", ["f", "w", "b"], ["g"], transB=trans_b),
    ]
    inputs, last = [tensor_info("x", [2, 16, 5, 5])], "g"
    if residual:
        inputs.append(tensor_info("r", [2, 24]))
        nodes.append(helper.make_node("Add", [last, "r"], ["s"]))
        last = "s"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["y"]))
        last = "y"
    outputs = [tensor_info(last, None)] + ([tensor_info("p", None)] if pooled_output else [])
    return make_model(nodes, inputs, outputs, 17, inits)


def _head_feeds(residual=False):
    feeds = [{"x": torch.randn(2, 16, 5, 5)}, {"x": torch.randn(2, 16, 5, 5) * 4}]
    for f in feeds:
        if residual:
            f["r"] = torch.randn(2, 24)
    return feeds


@pytest.mark.parametrize("trans_b", [1, 0])
def test_a_classifier_head_becomes_one_pooled_product_with_the_same_results(trans_b):
    model, report = optimize_and_compare(_head(trans_b=trans_b), _head_feeds(), _passes())
    assert ops(model) == ["PooledGemm"]
    (node,) = model.graph.nodes
    assert node.attributes.get("transB", 0) == trans_b and node.attributes["pre"] == "HardSwish"
    assert node.inputs[0].name == "x"
    assert any(e.rule == "pooled-gemm" and e.status == "fired" for e in report.events)


@pytest.mark.parametrize(
    ("head", "residual", "reason"),
    [
        (_head(pooled_output=True), False, "is a graph output"),
        (_head(activation="Sigmoid"), False, "no activation 'Sigmoid'"),
        (_head(residual=True, activation=""), True, "adds a residual"),
    ],
)
def test_a_head_the_kernel_cannot_take_stays_apart_with_the_reason(head, residual, reason):
    model, report = optimize_and_compare(head, _head_feeds(residual), _passes())
    assert "PooledGemm" not in ops(model)
    declined = [e for e in report.events if e.rule == "pooled-gemm" and e.status == "declined"]
    assert declined and reason in declined[0].detail


def _conv_head(reader="Flatten", group=1):
    """x [2, 16, 5, 5] → GlobalAveragePool → Conv 1×1 (16→24, `group`) → HardSwish → `reader` (Flatten, a Reshape to
    [2, 24], or a second 1×1 convolution) → Gemm (24→3): PP-LCNet's head."""
    rng = np.random.default_rng(2)
    inits = [
        init("w", rng.standard_normal((24, 16 // group, 1, 1)).astype(np.float32) * 0.3),
        init("b", rng.standard_normal(24).astype(np.float32)),
        init("w2", rng.standard_normal((3, 24)).astype(np.float32) * 0.3),
        init("shape", np.array([2, 24], np.int64)),
        init("w3", rng.standard_normal((24, 24, 1, 1)).astype(np.float32) * 0.3),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["p"]),
        helper.make_node("Conv", ["p", "w", "b"], ["c"], group=group),
        helper.make_node("HardSwish", ["c"], ["h"]),
    ]
    if reader == "Flatten":
        nodes.append(helper.make_node("Flatten", ["h"], ["f"]))
    elif reader == "Reshape":
        nodes.append(helper.make_node("Reshape", ["h", "shape"], ["f"]))
    else:
        nodes += [helper.make_node("Conv", ["h", "w3"], ["c3"]), helper.make_node("Flatten", ["c3"], ["f"])]
    nodes.append(helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1))
    return make_model(nodes, [tensor_info("x", [2, 16, 5, 5])], [tensor_info("y", None)], 17, inits)


@pytest.mark.parametrize("reader", ["Flatten", "Reshape"])
def test_a_head_with_a_1x1_convolution_on_the_pooled_features_becomes_one_pooled_product(reader):
    model, report = optimize_and_compare(_conv_head(reader), _head_feeds(), _passes())
    assert ops(model) == ["PooledGemm", "FusedGemm"]
    pooled = model.graph.nodes[0]
    assert pooled.attributes["transB"] == 1 and pooled.attributes["pre"] == "HardSwish"
    assert tuple(pooled.inputs[1].shape) == (24, 16) and pooled.inputs[0].name == "x"
    assert any(e.rule == "pooled-conv" and e.status == "fired" for e in report.events)


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (_conv_head(reader="Conv"), "not flattened by its only reader"),
        (_conv_head(group=2), "grouped or padded"),
    ],
)
def test_a_convolution_head_the_kernel_cannot_take_stays_apart_with_the_reason(head, reason):
    model, report = optimize_and_compare(head, _head_feeds(), _passes())
    assert "PooledGemm" not in ops(model)
    declined = [e for e in report.events if e.rule == "pooled-conv" and e.status == "declined"]
    assert declined and reason in declined[0].detail


def test_the_heads_of_the_zoo_s_classifiers_fuse():
    for name in ("mobilenetv3", "efficientnet_b0", "resnet50"):
        model = import_model(zoo.export(name, batch=1, size=64, dynamic_batch=False))
        model, _ = optimize(model, device="cpu", cpu_kernels=KERNELS)
        assert ops(model).count("PooledGemm") == 1, name


def _expanded(act="Relu", expand_act="HardSwish", squeeze_excite=False, stride=2):
    """x → 1×1 expansion (16→32) → `expand_act` → the depthwise block of `_block` (on 32 channels) [or, with
    `squeeze_excite`, the depthwise convolution alone, then a squeeze-excite block and the 1×1]."""
    rng = np.random.default_rng(2)
    block = _block(act=act, stride=stride) if not squeeze_excite else None
    inits = [init("we", rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.25),
             init("be", rng.standard_normal(16).astype(np.float32))]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x0", "we", "be"], ["e0"]), helper.make_node(expand_act, ["e0"], ["x"])]
    graph = block.graph
    model = make_model(nodes + list(graph.node), [tensor_info("x0", SHAPE)], list(graph.output), 17,
                       inits + list(graph.initializer))  # fmt: skip
    return model


def test_an_expansion_joins_the_depthwise_block_after_it_with_the_same_results():
    feeds = [{"x0": torch.randn(*SHAPE)}, {"x0": torch.randn(*SHAPE) * 4}]
    model, report = optimize_and_compare(_expanded(), feeds, _passes())
    assert ops(model) == ["ExpandDepthwise"]
    (node,) = model.graph.nodes
    a = node.attributes
    assert (a["expand_act"], a["act"], a.get("pre", "")) == ("HardSwish", "Relu", "HardSwish")
    assert len(node.inputs) > 5 and node.inputs[5] is not None  # the projection
    assert any(e.rule == "expand-depthwise-pointwise" and e.status == "fired" for e in report.events)


def test_an_expansion_the_kernel_cannot_take_stays_apart():
    feeds = [{"x0": torch.randn(*SHAPE)}]
    model, report = optimize_and_compare(_expanded(expand_act="Sigmoid"), feeds, _passes())
    assert "ExpandDepthwise" not in ops(model) and "DepthwisePointwise" in ops(model)
    declined = [e for e in report.events if e.rule == "expand-depthwise-pointwise" and e.status == "declined"]
    assert declined and "no activation 'Sigmoid'" in declined[0].detail


def test_mobilenetv3_and_efficientnet_expansions_join_their_blocks():
    counts = {}
    for name in ("mobilenetv3", "efficientnet_b0"):
        model = import_model(zoo.export(name, batch=1, size=64, dynamic_batch=False))
        kernels = CpuKernels(convolution=(*KERNELS.convolution, "SiLU"), gate=KERNELS.gate)
        model, _ = optimize(model, device="cpu", cpu_kernels=kernels)
        counts[name] = {op: ops(model).count(op) for op in ("ExpandDepthwise", "DepthwisePointwise")}
        with_projection = [n for n in model.graph.nodes if n.op_type == "ExpandDepthwise" and len(n.inputs) > 5]
        counts[name]["projected"] = len(with_projection)
    # MobileNetV3: 6 of its 7 depthwise + 1×1 blocks have an expansion (the first has none), and the 8 depthwise
    # convolutions before a squeeze-excite block join theirs; EfficientNet-B0: 15 of 16 blocks have one, all with
    # squeeze-excite.
    assert counts["mobilenetv3"] == {"ExpandDepthwise": 14, "DepthwisePointwise": 1, "projected": 6}
    assert counts["efficientnet_b0"] == {"ExpandDepthwise": 15, "DepthwisePointwise": 0, "projected": 0}
