"""Small convolutional models whose quantized layers chain in several ways, calibrated and lowered to their
quantized layers (without the chaining pass), for the tests of `passes.quant_chain` and of the simulation of
its quantized residuals. Every activation is calibrated per tensor, the depthwise layers' inputs too (a reader
quantizing per channel breaks a chain: tests/quant/test_depthwise_channels.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import Model
from tensorforge.ir.clone import clone_model
from tensorforge.ops.infer import infer_model
from tensorforge.passes.pipeline import optimize
from tensorforge.quant import CalibrationTable, calibrate
from tensorforge.quant.lower import quantize_layers
from tests.helpers import make_model, tensor_info

SHAPE = (2, 3, 8, 8)


def chain_model(seed: int = 0, width: int = 8) -> Model:
    """`chain_proto` imported."""
    return import_model(chain_proto(seed, width))


def chain_proto(seed: int = 0, width: int = 8) -> onnx.ModelProto:
    """x[2,3,8,8] → conv1 3→8 (3×3) + Relu = a → conv2 depthwise 3×3 + Relu = b → conv3 1×1 8→8, + a, Relu = d
    → conv4 1×1 8→16 + Relu = e → GlobalAveragePool → Flatten → fc1 16→10 + Relu → fc2 10→4 = y; with
    `width`, that many channels instead of 8 (and twice as many after conv4).

    Chains: b (conv2 → conv3), d (conv3 → conv4), fc1 → fc2. a is also conv3's residual, e is pooled in
    float, y is the graph output: those stay float."""
    rng = np.random.default_rng(seed)
    w, spread = width, 0.4 * (8 / width) ** 0.5
    weights = {
        "w1": rng.normal(0, 0.4, (w, 3, 3, 3)),
        "b1": rng.normal(0, 0.1, w),
        "w2": rng.normal(0, 0.4, (w, 1, 3, 3)),
        "b2": rng.normal(0, 0.1, w),
        "w3": rng.normal(0, spread, (w, w, 1, 1)),
        "w4": rng.normal(0, spread, (2 * w, w, 1, 1)),
        "b4": rng.normal(0, 0.1, 2 * w),
        "w5": rng.normal(0, 0.3 * (8 / width) ** 0.5, (2 * w, 10)),
        "b5": rng.normal(0, 0.1, 10),
        "w6": rng.normal(0, 0.3, (10, 4)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a"], name="relu1"),
        helper.make_node("Conv", ["a", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], group=w),
        helper.make_node("Relu", ["c2"], ["b"], name="relu2"),
        helper.make_node("Conv", ["b", "w3"], ["c3"], name="conv3"),
        helper.make_node("Add", ["c3", "a"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["d"], name="relu3"),
        helper.make_node("Conv", ["d", "w4", "b4"], ["c4"], name="conv4"),
        helper.make_node("Relu", ["c4"], ["e"], name="relu4"),
        helper.make_node("GlobalAveragePool", ["e"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w5"], ["m5"], name="fc1"),
        helper.make_node("Add", ["m5", "b5"], ["g5"], name="fc1_bias"),
        helper.make_node("Relu", ["g5"], ["h"], name="relu5"),
        helper.make_node("MatMul", ["h", "w6"], ["y"], name="fc2"),
    ]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    return make_model(nodes, [tensor_info("x", list(SHAPE))], [tensor_info("y", [2, 4])], 17, initializers)


def skip_proto(seed: int = 0, b_output: bool = False, width: int = 8) -> onnx.ModelProto:
    """x[2,3,8,8] → conv0 3→8 + Relu = t0 → conv1 + Relu = t1 → conv2, + t0, Relu = t2 → conv3, + t1, Relu = t3
    → conv4 8→4 = y: skips over two convolutions (all 3×3 8→8 but conv0 and conv4; `width` channels instead of 8).

    conv2 adds t0 and reads t1, itself the residual conv3 adds: t0's stream forms only once t1's has (the
    residual-stream pass's fixed point). t2 and t3 chain exactly, y is the graph output. With `b_output`, t2 is a
    graph output too: it stays float, and conv3 reads it in float while it adds t1 quantized."""
    rng = np.random.default_rng(seed)
    spread = (8 / width) ** 0.5
    weights = {"w0": rng.normal(0, 0.4, (width, 3, 3, 3)), "w4": rng.normal(0, 0.3 * spread, (4, width, 3, 3))}
    for index in (1, 2, 3):
        weights[f"w{index}"] = rng.normal(0, 0.25 * spread, (width, width, 3, 3))
        weights[f"b{index}"] = rng.normal(0, 0.1, width)
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=pads),
        helper.make_node("Relu", ["c0"], ["t0"], name="relu0"),
        helper.make_node("Conv", ["t0", "w1", "b1"], ["c1"], name="conv1", pads=pads),
        helper.make_node("Relu", ["c1"], ["t1"], name="relu1"),
        helper.make_node("Conv", ["t1", "w2", "b2"], ["c2"], name="conv2", pads=pads),
        helper.make_node("Add", ["c2", "t0"], ["s2"], name="add2"),
        helper.make_node("Relu", ["s2"], ["t2"], name="relu2"),
        helper.make_node("Conv", ["t2", "w3", "b3"], ["c3"], name="conv3", pads=pads),
        helper.make_node("Add", ["c3", "t1"], ["s3"], name="add3"),
        helper.make_node("Relu", ["s3"], ["t3"], name="relu3"),
        helper.make_node("Conv", ["t3", "w4"], ["y"], name="conv4", pads=pads),
    ]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    outputs = [tensor_info("y", [2, 4, 8, 8])] + ([tensor_info("t2", [2, width, 8, 8])] if b_output else [])
    return make_model(nodes, [tensor_info("x", list(SHAPE))], outputs, 17, initializers)


def _weights(seed: int, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Normal weights of `shapes` (w0 the widest spread, as a stem's) and a bias b… for each w…."""
    rng = np.random.default_rng(seed)
    weights = {name: rng.normal(0, 0.4 if name == "w0" else 0.3, shape) for name, shape in shapes.items()}
    for name, shape in shapes.items():
        weights["b" + name[1:]] = rng.normal(0, 0.1, shape[0])
    return weights


def downsample_proto(seed: int = 0) -> onnx.ModelProto:
    """A ResNet stage's first block: x[2,3,8,8] → conv0 3→8 + Relu = t0 → conv1 1×1 8→8 + Relu = t1 → conv2 1×1
    8→16 = c2; the shortcut convd 1×1 8→16 on t0 = cd; c2 + cd, Relu = t2 → conv3 1×1 16→4 = y.

    The optimizer folds the Add into one of conv2 / convd as its residual; the other's output is then only added
    (no layer reads it as its input): it chains on its own calibrated scale."""
    weights = _weights(seed, {"w0": (8, 3, 3, 3), "w1": (8, 8, 1, 1), "w2": (16, 8, 1, 1), "wd": (16, 8, 1, 1)})
    weights["w3"] = np.random.default_rng(seed + 1).normal(0, 0.3, (4, 16, 1, 1))
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["t0"], name="relu0"),
        helper.make_node("Conv", ["t0", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["t1"], name="relu1"),
        helper.make_node("Conv", ["t1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Conv", ["t0", "wd", "bd"], ["cd"], name="convd"),
        helper.make_node("Add", ["c2", "cd"], ["s2"], name="add2"),
        helper.make_node("Relu", ["s2"], ["t2"], name="relu2"),
        helper.make_node("Conv", ["t2", "w3"], ["y"], name="conv3"),
    ]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    return make_model(nodes, [tensor_info("x", list(SHAPE))], [tensor_info("y", [2, 4, 8, 8])], 17, initializers)


def pool_proto(seed: int = 0, pooled_output: bool = False) -> onnx.ModelProto:
    """A ResNet stem and first block's entry: x[2,3,8,8] → conv0 3→8 + Relu → MaxPool 3×3/2 (pads 1) = p →
    conv1 1×1 8→8 + Relu → conv2 1×1 8→4 = y, and convd 1×1 8→4 on p added to it. Both readers of the pool's
    output quantize it with its scale, so conv0 writes int8 through the pool. With `pooled_output`, p is a graph
    output too (it stays float)."""
    weights = _weights(seed, {"w0": (8, 3, 3, 3), "w1": (8, 8, 1, 1), "w2": (4, 8, 1, 1), "wd": (4, 8, 1, 1)})
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["t0"], name="relu0"),
        helper.make_node("MaxPool", ["t0"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["t1"], name="relu1"),
        helper.make_node("Conv", ["t1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Conv", ["p", "wd", "bd"], ["cd"], name="convd"),
        helper.make_node("Add", ["c2", "cd"], ["y"], name="add2"),
    ]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    outputs = [tensor_info("y", [2, 4, 4, 4])] + ([tensor_info("p", [2, 8, 4, 4])] if pooled_output else [])
    return make_model(nodes, [tensor_info("x", list(SHAPE))], outputs, 17, initializers)


def prenorm_proto(
    seed: int = 0, norm_output: bool = False, width: int = 8, post_norm: bool = False, first_norm: bool = True
) -> onnx.ModelProto:
    """A pre-norm transformer's feed-forward block over x[2,3,8,8] as rows of 8 features: fc0 8→w = e → ln1 = n1
    → fc1 w→2w + Relu → fc2 2w→w, + e = r → ln2 = n2 → fc3 w→4 = y (w = `width`). Every norm's output is read by
    one quantized layer as its input: the norms write int8 for them. With `norm_output`, n1 is a graph output
    too. With `post_norm` the block is a post-norm one (BERT's): fc2 adds n1, not e, so n1 is fc1's input and
    fc2's residual. Without `first_norm` (a residual MLP), fc1 reads e itself: e is fc1's input and fc2's
    residual, a residual stream between quantized products."""
    rng = np.random.default_rng(seed)
    w, spread = width, (8 / width) ** 0.5
    weights = {
        "w0": rng.normal(0, 0.4, (8, w)), "g1": 1 + rng.normal(0, 0.2, w), "e1": rng.normal(0, 0.1, w),
        "w1": rng.normal(0, 0.4 * spread, (w, 2 * w)), "b1": rng.normal(0, 0.1, 2 * w),
        "w2": rng.normal(0, 0.3 * spread, (2 * w, w)), "b2": rng.normal(0, 0.1, w),
        "g2": 1 + rng.normal(0, 0.2, w), "w3": rng.normal(0, 0.3 * spread, (w, 4)),
    }  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["e"], name="fc0"),
        *([helper.make_node("LayerNormalization", ["e", "g1", "e1"], ["n1"], name="ln1")] if first_norm else []),
        helper.make_node("MatMul", ["n1" if first_norm else "e", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1_bias"),
        helper.make_node("Relu", ["a1"], ["h"], name="relu1"),
        helper.make_node("MatMul", ["h", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], name="fc2_bias"),
        helper.make_node("Add", ["a2", "n1" if post_norm else "e"], ["r"], name="residual"),
        helper.make_node("LayerNormalization", ["r", "g2"], ["n2"], name="ln2"),
        helper.make_node("MatMul", ["n2", "w3"], ["y"], name="fc3"),
    ]
    if not first_norm:
        del weights["g1"], weights["e1"]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    outputs = [tensor_info("y", [2, 3, 8, 4])] + ([tensor_info("n1", [2, 3, 8, width])] if norm_output else [])
    return make_model(nodes, [tensor_info("x", list(SHAPE))], outputs, 17, initializers)


def calibrated(proto: onnx.ModelProto | None = None) -> tuple[Model, CalibrationTable]:
    """`proto` (by default `chain_proto()`) imported and optimized as a build does, and its minmax table."""
    model, _ = optimize(import_model(proto if proto is not None else chain_proto()))
    infer_model(model, check=False)
    return model, calibrate(model, batches(), "minmax").per_tensor()


def batches(count: int = 3, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, SHAPE).astype(np.float32)} for _ in range(count)]


def lowered(quant: str = "int8", seed: int = 0, width: int = 8, proto: onnx.ModelProto | None = None) -> Model:
    """`chain_model` (or `proto`) optimized, calibrated (minmax) and lowered to quantized layers of type `quant`."""
    model, _ = optimize(import_model(proto) if proto is not None else chain_model(seed, width))
    infer_model(model, check=False)
    quantize_layers(model, calibrate(model, batches(), "minmax").per_tensor(), quant=quant)
    infer_model(model, check=False)
    return model


def copy(model: Model) -> Model:
    return clone_model(model)
