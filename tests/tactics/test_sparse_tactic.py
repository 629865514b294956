"""`sparse.semi-structured`: 2:4-sparse products and 1×1 convolutions on the sparse tensor cores: what it declines
and why (CPU), and its kernels against the float64 reference and as autotuned candidates (CUDA)."""

import math

import numpy as np
import pytest
import torch

from tensorforge.ir import Model
from tensorforge.kernels.sparse_gemm import BACKENDS, backend_problem
from tensorforge.ops.structured_sparsity import is_2to4, prune_2to4, weight_from_matrix, weight_matrix
from tensorforge.quant import calibrate
from tensorforge.quant.lower import quantize_layers
from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.vendor import ReferenceTactic
from tests.helpers import fused_conv, fused_gemm

TACTIC = "sparse.semi-structured"
CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def _pruned(node):
    node.inputs[1].const = weight_from_matrix(node, prune_2to4(weight_matrix(node)))
    return node


def _conv(x_shape, cout, residual=False, activation="", **conv):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((cout, x_shape[1], 1, 1)).astype(np.float32) / x_shape[1] ** 0.5
    bias = rng.standard_normal(cout).astype(np.float32)
    stride = conv.get("strides", [1, 1])
    out = [x_shape[0], cout, (x_shape[2] - 1) // stride[0] + 1, (x_shape[3] - 1) // stride[1] + 1]
    return _pruned(fused_conv(x_shape, weight, bias, out if residual else None, activation, **conv)), out


def test_it_declines_without_cuda_and_says_why_on_cuda():
    gemm, _ = fused_gemm([4, 64], matmul=False, n=32)
    assert "needs CUDA" in tactic_by_key(TACTIC).supports(_pruned(gemm), 17, CPU)
    dense, _ = fused_gemm([4, 64], matmul=False, n=32)
    assert "not 2:4 sparse" in tactic_by_key(TACTIC).supports(dense, 17, CUDA)
    scaled, _ = fused_gemm([4, 64], matmul=False, n=32)
    scaled.attributes["alpha"] = 0.5
    assert "alpha and beta of 1 only" in tactic_by_key(TACTIC).supports(_pruned(scaled), 17, CUDA)
    padded, _ = _conv([1, 32, 6, 6], 32, pads=[1, 1, 1, 1])
    assert "without padding" in tactic_by_key(TACTIC).supports(padded, 17, CUDA)
    rng = np.random.default_rng(1)
    square = fused_conv([1, 32, 6, 6], rng.standard_normal((32, 32, 3, 3)).astype(np.float32), None)
    assert "1×1 convolution" in tactic_by_key(TACTIC).supports(square, 17, CUDA)


def _runnable(backend):
    """Skip a GPU test of `backend` where this GPU cannot run it (torch's CUTLASS kernels: 8.x only)."""
    if problem := backend_problem(backend):
        pytest.skip(problem)


def _runnable_backends():
    return {b for b in BACKENDS if backend_problem(b) is None}


def _inputs(node, feeds):
    """Every input of `node` in order: the activations from `feeds`, the constants from the graph."""
    activations = iter(feeds)
    return [next(activations) if not v.is_const else v.const for v in node.inputs if v is not None]


def _check_kernel(node, feeds, backend, precision, epilogue="torch"):
    """The kernel's output against the float64 reference on the same (pruned) weights, within the precision's
    bound; its output must not be the reference's untouched buffer."""
    _runnable(backend)
    want = ReferenceTactic().build(node, 17, CPU, {})([t.double() for t in _inputs(node, feeds)])[0]
    config = {"precision": precision, "layout": "any", "backend": backend, "epilogue": epilogue}
    kernel = build_layer_kernel(tactic_by_key(TACTIC), node, 17, CUDA, config, {})
    got = kernel([f.cuda() for f in feeds])[0]
    assert got.shape == want.shape and not got.isnan().any()
    bound = {"fp16": 5e-3, "bf16": 3e-2}[precision]
    assert relative_error(got.cpu().double(), want) <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", ["torch", "triton"])
@pytest.mark.parametrize("backend", ["cusparselt", "cutlass"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize(
    ("shape", "options"),
    [
        ([3, 37, 128], {"activation": "Relu"}),  # rows not a multiple of 8: padded
        ([256, 128], {"trans_b": True, "matmul": False, "residual": True}),
        ([2, 64, 128], {"activation": "Sigmoid", "residual": True}),
    ],
)
def test_products_match_the_reference(epilogue, backend, precision, shape, options):
    torch.manual_seed(0)
    node, feeds = fused_gemm(shape, n=64, **options)
    _check_kernel(_pruned(node), feeds, backend, precision, epilogue)


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", ["torch", "triton"])
@pytest.mark.parametrize("backend", ["cusparselt", "cutlass"])
@pytest.mark.parametrize(
    ("strides", "residual", "activation"), [([1, 1], True, "Relu"), ([2, 2], False, "Relu"), ([1, 1], False, "")]
)
def test_pointwise_convolutions_match_the_reference(epilogue, backend, strides, residual, activation):
    torch.manual_seed(1)
    node, out = _conv([2, 64, 14, 14], 128, residual, activation, strides=strides)
    feeds = [torch.randn(2, 64, 14, 14)] + ([torch.randn(out)] if residual else [])
    _check_kernel(node, feeds, backend, "fp16", epilogue)


@pytest.mark.gpu
def test_it_is_a_correct_candidate_on_cuda():
    torch.manual_seed(2)
    node, feeds = fused_gemm([512, 256], matmul=False, trans_b=True, n=256, activation="Relu")
    choice = autotune(
        _pruned(node), 17, [feeds[0].cuda()], CUDA, effort=0, precisions=("fp32", "fp16"), exhaustive=True
    )
    candidates = [c for c in choice.candidates if c.tactic == TACTIC]
    assert {(c.config["backend"], c.config["epilogue"]) for c in candidates} == {
        (b, e) for b in _runnable_backends() for e in ("torch", "triton")
    }
    assert all(math.isfinite(c.median_ms) for c in candidates), [c.note for c in candidates]


def _dense_stand_in(monkeypatch):
    """The tactic's kernels with the sparse product replaced by a dense one, so that what surrounds it (rows of
    an NHWC view, strides, bias, the epilogue, the output's shape and layout) is checked without a GPU."""
    import tensorforge.tactics.sparse as sparse

    def linear(rows, weight, bias=None, activation=None, algorithm=0):
        y = rows @ weight.t() + (0 if bias is None else bias)
        return torch.relu(y) if activation == "relu" else y

    monkeypatch.setattr(sparse, "compress", lambda matrix, backend: matrix.contiguous())
    monkeypatch.setattr(sparse, "sparse_linear", linear)


@pytest.mark.parametrize("epilogue", ["torch", "triton"])
@pytest.mark.parametrize("backend", ["cusparselt", "cutlass"])
@pytest.mark.parametrize(
    ("strides", "residual", "activation"), [([1, 1], True, "Relu"), ([2, 2], False, "Relu"), ([1, 1], True, "")]
)
def test_around_the_product_the_convolution_kernel_is_right(
    monkeypatch, epilogue, backend, strides, residual, activation
):
    _dense_stand_in(monkeypatch)
    torch.manual_seed(3)
    node, out = _conv([2, 16, 7, 7], 32, residual, activation, strides=strides)
    feeds = [torch.randn(2, 16, 7, 7).contiguous(memory_format=torch.channels_last)]
    feeds += [torch.randn(out)] if residual else []
    want = ReferenceTactic().build(node, 17, CPU, {})([t.double() for t in _inputs(node, feeds)])[0]
    config = {"precision": "fp32", "layout": "any", "backend": backend, "epilogue": epilogue}
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 17, CPU, config, {})(feeds)[0]
    assert got.shape == want.shape and got.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(got.double(), want) <= 1e-5


@pytest.mark.parametrize(
    ("shape", "options"),
    [
        ([3, 5, 32], {"activation": "Relu", "residual": True}),
        ([6, 32], {"trans_b": True, "matmul": False, "activation": "Relu"}),
    ],
)
@pytest.mark.parametrize("epilogue", ["torch", "triton"])
def test_around_the_product_the_gemm_kernel_is_right(monkeypatch, epilogue, shape, options):
    _dense_stand_in(monkeypatch)
    torch.manual_seed(4)
    node, feeds = fused_gemm(shape, n=16, **options)
    config = {"precision": "fp32", "layout": "any", "backend": "cutlass", "epilogue": epilogue}
    got = build_layer_kernel(tactic_by_key(TACTIC), _pruned(node), 17, CPU, config, {})(feeds)[0]
    want = ReferenceTactic().build(node, 17, CPU, {})([t.double() for t in _inputs(node, feeds)])[0]
    assert got.shape == want.shape and relative_error(got.double(), want) <= 1e-5


def _quantized_pruned(x_shape, activation="", residual=False, n=64):
    """A FusedGemm with its weight pruned to 2:4, then calibrated (minmax) and lowered to an int8 QuantizedGemm:
    its int8 weight keeps the pattern (a pruned weight quantizes to 0)."""
    node, feeds = fused_gemm(x_shape, activation, residual=residual, n=n)
    model = Model(_pruned(node).graph, {"": 17, "tensorforge": 1})
    names = [v.name for v in model.graph.inputs]
    table = calibrate(model, [{name: f.numpy() for name, f in zip(names, feeds, strict=True)}], "minmax")
    quantize_layers(model, table)
    (layer,) = model.graph.nodes
    assert layer.op_type == "QuantizedGemm" and is_2to4(weight_matrix(layer))
    return layer, feeds


@pytest.mark.parametrize("residual", [False, True])
def test_around_the_int8_product_the_kernel_is_cublas_int8s(monkeypatch, residual):
    import tensorforge.tactics.sparse as sparse

    monkeypatch.setattr(sparse, "compress", lambda matrix, backend: matrix.contiguous())
    monkeypatch.setattr(
        sparse,
        "sparse_linear",
        lambda q, w, bias=None, activation=None, out_dtype=None, algorithm=0: (q.long() @ w.long().t()).int(),
    )
    torch.manual_seed(5)
    layer, feeds = _quantized_pruned([3, 7, 64], "Relu", residual)
    want = build_layer_kernel(ReferenceTactic(), layer, 1, CPU, {}, {})(feeds)[0]
    config = {"precision": "fp32", "backend": "cusparselt"}
    got = build_layer_kernel(tactic_by_key(f"{TACTIC}-int8"), layer, 1, CPU, config, {})(feeds)[0]
    assert got.shape == want.shape and relative_error(got, want) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True])
def test_the_int8_products_are_correct_candidates_on_cuda(residual):
    torch.manual_seed(6)
    layer, feeds = _quantized_pruned([4, 40, 128], "Relu", residual, n=128)
    feeds = [f.cuda() for f in feeds]
    activations = iter(feeds)
    inputs = [None if v is None or v.is_const else next(activations) for v in layer.inputs]
    choice = autotune(layer, 1, inputs, CUDA, effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == f"{TACTIC}-int8"]
    assert {c.config["backend"] for c in ours} == _runnable_backends()
    assert all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]


def test_the_one_pass_epilogue_is_timed_only_where_there_is_more_than_a_bias():
    tactic = tactic_by_key(TACTIC)
    plain, _ = fused_gemm([8, 128], matmul=False, trans_b=True, n=64)
    residual, _ = fused_gemm([8, 128], matmul=False, trans_b=True, n=64, residual=True)
    epilogues = {c["epilogue"] for c in tactic.space_for(_pruned(plain), 0)}
    assert epilogues <= {"torch"}
    with_residual = tactic.space_for(_pruned(residual), 0)
    assert {c["epilogue"] for c in with_residual} == ({"torch", "triton"} if with_residual else set())
    assert all(c["backend"] in ("cusparselt", "cutlass") for c in with_residual)
