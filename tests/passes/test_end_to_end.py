"""The default pipeline on whole models: the optimized graph computes what the original does, and fuses.

Each model is optimized once per module (a clone of the imported model), then both graphs run on the
reference executor, on random inputs and, for the two real models, on real ones. Counts pin down what the
fusions must achieve: no BatchNormalization left, every Conv a FusedConv, every activation and residual
add that follows a convolution absorbed into it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from tensorforge import realdata as rd
from tensorforge import zoo
from tensorforge.frontend import import_model, load_onnx
from tensorforge.ir import DType, Model, Node
from tensorforge.ir.clone import clone_model
from tensorforge.ops import Executor
from tensorforge.passes import qualified_op
from tensorforge.passes.pipeline import optimize
from tests.helpers import relative_error

REL_TOL = 1e-5
FUSED_CONV = "tensorforge::FusedConv"
FUSED_GEMM = "tensorforge::FusedGemm"
CONV_ACTIVATIONS = ("Relu", "HardSwish", "HardSigmoid", "Clip", "LeakyRelu", "Sigmoid")


@dataclass
class Optimized:
    original: Model
    model: Model
    report: object

    def ops(self) -> Counter:
        return Counter(qualified_op(n) for n in self.model.graph)

    def nodes(self, op: str) -> list[Node]:
        return [n for n in self.model.graph if qualified_op(n) == op]

    def compare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = Executor(self.original).run(feeds)
        actual = Executor(self.model).run(feeds)
        assert set(actual) == set(expected)
        for name, value in expected.items():
            got = actual[name].numpy()
            assert got.shape == tuple(value.shape), name
            error = relative_error(got, value.numpy())
            assert error <= REL_TOL, f"{name}: relative error {error:.3g} > {REL_TOL:g}"
        return {name: value.numpy() for name, value in actual.items()}


def _as_float64(model: Model) -> Model:
    """A copy of `model` computing in float64 throughout (float32 weights, values and Casts widened)."""
    copy = clone_model(model)
    graph = copy.graph
    for value in graph.initializers.values():
        if isinstance(value.const, torch.Tensor) and value.const.dtype == torch.float32:
            value.const = value.const.double()
    for value in [*graph.inputs, *graph.outputs, *(v for n in graph.all_nodes() for v in n.outputs)]:
        if value.dtype == DType.FLOAT:
            value.dtype = DType.DOUBLE
    for node in graph.all_nodes():
        if node.op_type == "Cast" and node.attributes.get("to") == DType.FLOAT:
            node.attributes["to"] = int(DType.DOUBLE)
    return copy


# Inputs on which the float32 graph itself is further than this from its float64 evaluation are
# ill-conditioned in float32: two float32 evaluations of the same maths cannot agree to REL_TOL there.
ILL_CONDITIONED = REL_TOL / 2
# On those inputs the optimized graph must stay within this factor of the original's own float64 error.
ERROR_GROWTH = 3.0


def _optimize(model: Model) -> Optimized:
    optimized, report = optimize(clone_model(model))
    failures = [e for e in report.events if e.status == "failed"]
    assert not failures, failures
    return Optimized(model, optimized, report)


def _zoo(name: str, **options) -> Optimized:
    return _optimize(import_model(zoo.export(name, **options)))


def _random(name: str, batch: int = 2, size: int | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"input": rng.standard_normal(zoo.input_shape(name, batch, size)).astype(np.float32)}


def _activation(node: Node) -> list[str]:
    return [a for a in (node.attributes.get("pre", ""), node.attributes.get("post", "")) if a]


def _with_residual(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if len(n.inputs) > 3 and n.inputs[3] is not None]


def _assert_every_conv_fused(result: Optimized, convs: int, merged_away: int = 0) -> None:
    """`convs` Convs before; after, no Conv or BatchNormalization, and one FusedConv per Conv, less those
    that parallel-layer merging folded into a sibling."""
    before = result.report.ops_before
    ops = result.ops()
    assert before.get("Conv") == convs
    assert ops["BatchNormalization"] == 0
    assert ops["Conv"] == 0
    assert ops[FUSED_CONV] == convs - merged_away


# -- ResNet-50 ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet50():
    return _zoo("resnet50", size=64)


@pytest.mark.slow
def test_resnet50_matches_and_fuses_every_conv_bn_relu_and_residual(resnet50):
    resnet50.compare(_random("resnet50"))
    before, ops = resnet50.report.ops_before, resnet50.ops()
    assert (before["BatchNormalization"], before["Relu"], before["Add"]) == (53, 49, 16)
    _assert_every_conv_fused(resnet50, 53)  # 49 in the main path + 4 downsample shortcuts
    fused = resnet50.nodes(FUSED_CONV)
    assert len(_with_residual(fused)) == 16
    assert ops["Add"] == 0 and ops["Relu"] == 0
    assert sum(_activation(n) == ["Relu"] for n in fused) == 49
    assert resnet50.report.nodes_after < resnet50.report.nodes_before - 53 - 49 - 16 + 1


# -- MobileNetV3-Large -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mobilenetv3():
    return _zoo("mobilenetv3", size=64)


def test_mobilenetv3_matches_and_fuses(mobilenetv3):
    mobilenetv3.compare(_random("mobilenetv3"))
    before, ops = mobilenetv3.report.ops_before, mobilenetv3.ops()
    assert (before["BatchNormalization"], before["HardSwish"], before["HardSigmoid"], before["Add"]) == (46, 21, 8, 10)
    _assert_every_conv_fused(mobilenetv3, 62)
    fused = mobilenetv3.nodes(FUSED_CONV)
    # 20 h-swish and 19 ReLU after convolutions (stem, expand, depthwise, last conv; SE squeeze), 8 SE gates
    activations = Counter(a for n in fused for a in _activation(n))
    assert activations == {"HardSwish": 20, "Relu": 19, "HardSigmoid": 8}
    assert len(_with_residual(fused)) == 10
    for op in ("Relu", "HardSigmoid", "Add", "Identity", "BatchNormalization"):
        assert ops[op] == 0, op
    assert ops["HardSwish"] == 0  # the classifier's h-swish went into its Gemm
    assert [_activation(n) for n in mobilenetv3.nodes(FUSED_GEMM)].count(["HardSwish"]) == 1


def test_mobilenetv3_with_relu6_formulas_matches_and_fuses_them():
    result = _zoo("mobilenetv3_relu6", size=64)
    result.compare(_random("mobilenetv3_relu6"))
    _assert_every_conv_fused(result, 62)
    ops = result.ops()
    # x·ReLU6(x+3)/6 and ReLU6(x+3)/6 are chains of Add, Clip, Mul, Div: each became one fused node or less
    for op in ("Clip", "Div", "Identity"):
        assert ops[op] == 0, op
    assert result.report.ops_before["Clip"] == 29


# -- Inception block ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inception():
    return _zoo("inception", size=16)


def test_inception_block_matches_and_merges_parallel_branches(inception):
    inception.compare(_random("inception"))
    ops = inception.ops()
    assert inception.report.ops_before["Conv"] == 6
    assert ops["BatchNormalization"] == ops["Conv"] == ops["Relu"] == 0
    fused = inception.nodes(FUSED_CONV)
    assert all(_activation(n) == ["Relu"] for n in fused)
    # The three 1×1 convolutions reading the block input are one convolution now
    readers = [n for n in fused if n.inputs[0] is inception.model.graph.inputs[0]]
    assert len(readers) == 1
    assert len(fused) == 4


# -- transformer encoder -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformer():
    return _zoo("transformer", size=16)


def test_convnext_folds_its_layer_scales_and_fuses_its_residuals_into_the_linear_layers():
    """Each block ends Linear → Transpose back to NCHW → Mul γ → Add x: hoisted above the Transpose, the layer
    scale folds into the Linear's weights and the residual fuses into its epilogue (no pass of their own)."""
    result = _zoo("convnext_tiny", size=32)
    result.compare(_random("convnext_tiny", size=32))
    before, ops = result.report.ops_before, result.ops()
    assert before["Mul"] >= 18 and before["Transpose"] == 46
    assert ops["Mul"] == 0 and ops["Add"] == 0 and ops["tensorforge::FusedPointwise"] == 0
    assert len(_with_residual(result.nodes(FUSED_GEMM))) == 18  # every block's second Linear
    assert ops["Transpose"] < before["Transpose"]


def test_transformer_matches_and_fuses(transformer):
    transformer.compare(_random("transformer"))
    before, ops = transformer.report.ops_before, transformer.ops()
    assert (before["MatMul"], before["Erf"], before["LayerNormalization"]) == (16, 2, 5)
    assert ops["Erf"] == 0  # GELU recognized (as a node or as the activation of its Gemm)
    gemms = transformer.nodes(FUSED_GEMM)
    assert ops["MatMul"] <= 4  # only Q·Kᵀ and P·V per layer are left as plain products
    assert len(_with_residual(gemms)) == 4  # x + Attn(...) and x + MLP(...) in both layers
    assert [a for n in gemms for a in _activation(n)].count("Gelu") + ops["tensorforge::Gelu"] == 2


def test_transformer_with_decomposed_layernorm_recognizes_it():
    result = _zoo("transformer", size=16, opset=16)  # LayerNormalization is opset 17: exported as its math
    result.compare(_random("transformer"))
    before, ops = result.report.ops_before, result.ops()
    assert before["ReduceMean"] == 10 and before.get("LayerNormalization", 0) == 0
    assert ops["tensorforge::LayerNormalization"] == 5
    for op in ("ReduceMean", "Pow", "Sqrt", "Erf"):
        assert ops[op] == 0, op


def test_dynamic_batch_survives_optimization(transformer):
    for batch in (1, 3):
        transformer.compare(_random("transformer", batch))


# -- real models -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def orientation():
    return _optimize(load_onnx(rd.orientation_model()))


@pytest.mark.slow
def test_orientation_classifier_matches_on_real_pages_and_fuses(orientation):
    pages = [item for item in rd.rotated_pages() if item.name.startswith("page_rot")]  # the four rotations
    batch = np.concatenate([rd.orientation_input(item.image) for item in pages])
    probabilities = orientation.compare({"x": batch})["fetch_name_0"]
    labels = [rd.ORIENTATION_LABELS.index(item.label) for item in pages]
    assert list(probabilities.argmax(1)) == labels
    rng = np.random.default_rng(3)
    orientation.compare({"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)})
    before, ops = orientation.report.ops_before, orientation.ops()
    assert (before["BatchNormalization"], before["HardSwish"]) == (27, 28)
    _assert_every_conv_fused(orientation, 32)
    for op in ("BatchNormalization", "HardSwish", "Relu", "HardSigmoid", "Identity"):
        assert ops[op] == 0, op


@pytest.fixture(scope="module")
def recognition():
    return _optimize(load_onnx(rd.ocr_model("rec")))


@pytest.mark.slow
def test_text_recognition_matches_on_rendered_lines_and_fuses(recognition):
    characters = recognition.original.metadata["character"].splitlines()
    reference = _as_float64(recognition.original)
    for text in rd.TEXT_LINES:
        x = rd.recognition_input(rd.render_text_line(text))
        exact = Executor(reference).run({"x": x.astype(np.float64)})["fetch_name_0"].numpy()
        original = Executor(recognition.original).run({"x": x})["fetch_name_0"].numpy()
        conditioning = relative_error(original, exact)
        if conditioning <= ILL_CONDITIONED:
            probabilities = recognition.compare({"x": x})["fetch_name_0"]
        else:
            probabilities = Executor(recognition.model).run({"x": x})["fetch_name_0"].numpy()
            error = relative_error(probabilities, exact)
            assert error <= ERROR_GROWTH * conditioning, (text, error, conditioning)
        assert rd.ctc_decode(probabilities[0], characters) == text
    rng = np.random.default_rng(5)
    recognition.compare({"x": rng.uniform(-1, 1, (1, 3, 48, 160)).astype(np.float32)})
    before, ops = recognition.report.ops_before, recognition.ops()
    assert (before["Conv"], before["BatchNormalization"], before["Erf"], before["Pow"]) == (57, 3, 13, 5)
    (merge,) = recognition.report.fired("merge-parallel-conv")  # two sibling 1×1 convs on one input
    assert merge.detail.startswith("2 ")
    _assert_every_conv_fused(recognition, 57, merged_away=1)
    assert ops["tensorforge::LayerNormalization"] == 5  # the SVTR blocks' decomposed LayerNorms
    assert ops["ReduceMean"] == before["ReduceMean"] - 2 * 5  # the others are not normalizations
    for op in ("Erf", "Pow", "Sqrt", "Identity"):
        assert ops[op] == 0, op


@pytest.mark.slow
def test_text_detection_matches_and_fuses():
    detection = _optimize(load_onnx(rd.ocr_model("det")))
    x = rd.detection_input(np.concatenate([rd.render_text_line(t)[:, :400] for t in rd.TEXT_LINES[:3]]))
    detection.compare({"x": x})
    before, ops = detection.report.ops_before, detection.ops()
    assert (before["Erf"], before["Identity"]) == (13, 147)
    _assert_every_conv_fused(detection, 83)
    for op in ("Erf", "Identity", "HardSigmoid", "Add", "Div"):
        assert ops[op] == 0, op


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv3", "inception", "transformer"])
def test_optimized_graphs_match_on_cuda(name, request):
    optimized = request.getfixturevalue(name)
    feeds = _random(name)
    expected = Executor(optimized.original, "cuda").run(feeds)
    actual = Executor(optimized.model, "cuda").run(feeds)
    for output, value in expected.items():
        error = relative_error(actual[output].cpu().numpy(), value.cpu().numpy())
        assert error <= REL_TOL, f"{name} {output}: relative error {error:.3g} on CUDA"
