"""QuantizedGemm: the lowering agrees with the Q/DQ simulation (transB included), oneDNN's int8 linear agrees
with the reference, and the float fallback computes the float layer."""

import math

import pytest
import torch

from tensorforge import Executor
from tensorforge.ir import Model
from tensorforge.ir.clone import clone_model
from tensorforge.quant import calibrate, simulate_quantized
from tensorforge.quant.layers import quantizable_layers
from tensorforge.quant.lower import lowerable, quantize_layers
from tensorforge.tactics.autotune import TOLERANCE, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.vendor import CublasInt8GemmTactic, onednn_int8_problem
from tests.helpers import fused_gemm

CPU = torch.device("cpu")
CASES = [
    ([2, 7, 32], "Gelu", False, False, True),
    ([5, 32], "Relu", True, False, False),
    ([2, 7, 32], "", False, True, True),
]


def _quantized(x_shape, activation, trans_b, residual, matmul, n=24):
    node, feeds = fused_gemm(x_shape, activation, trans_b, residual, matmul, n)
    model = Model(node.graph, {"": 17, "tensorforge": 1})
    names = [v.name for v in model.graph.inputs]
    batches = [{name: f.numpy() for name, f in zip(names, feeds, strict=True)}]
    table = calibrate(model, batches, "minmax")
    simulated = simulate_quantized(model, table)
    lowered = clone_model(model)
    quantize_layers(lowered, table)
    (layer,) = lowered.graph.nodes
    assert layer.op_type == "QuantizedGemm"
    return layer, feeds, batches[0], simulated, lowered


@pytest.mark.parametrize(("x_shape", "activation", "trans_b", "residual", "matmul"), CASES)
def test_a_quantized_gemm_computes_the_simulated_int8_layer(x_shape, activation, trans_b, residual, matmul):
    _, _, batch, simulated, lowered = _quantized(x_shape, activation, trans_b, residual, matmul)
    (name,) = [v.name for v in lowered.graph.outputs]
    want = Executor(simulated).run(batch)[name]
    got = Executor(lowered).run(batch)[name]
    assert relative_error(got, want) <= 1e-5


@pytest.mark.parametrize(("x_shape", "activation", "trans_b", "residual", "matmul"), CASES)
def test_onednn_int8_linear_and_the_float_fallback(x_shape, activation, trans_b, residual, matmul):
    layer, feeds, _, _, _ = _quantized(x_shape, activation, trans_b, residual, matmul)
    reference = build_layer_kernel(tactic_by_key("reference.registry"), layer, 1, CPU, {}, {})(feeds)[0]
    qlinear = tactic_by_key("vendor.onednn-qlinear")
    if onednn_int8_problem() is None:
        assert qlinear.supports(layer, 1, CPU) is None
        got = build_layer_kernel(qlinear, layer, 1, CPU, {"precision": "fp32"}, {})(feeds)[0]
        assert relative_error(got, reference) <= TOLERANCE["fp32"]
    else:  # a CPU whose oneDNN int8 products saturate
        assert qlinear.supports(layer, 1, CPU) == onednn_int8_problem()
    fallback = tactic_by_key("fallback.float-gemm")
    twin = fallback.semantics(layer)
    as_float = build_layer_kernel(tactic_by_key("reference.registry"), twin, 1, CPU, {}, {})(feeds)[0]
    for config in fallback.space(0):
        try:
            kernel = build_layer_kernel(fallback, layer, 1, CPU, {"precision": "fp32", **config}, {})
        except ValueError as err:  # a float tactic that does not run here (Triton needs CUDA)
            assert "does not run this layer here" in str(err)
            continue
        ours = kernel(feeds)[0]
        assert relative_error(ours, as_float) <= 1e-5, config
        assert relative_error(ours, reference) > 1e-4, config  # float, not int8


def test_a_gemm_with_alpha_stays_float_with_the_reason():
    node, _ = fused_gemm([4, 16], "Relu")
    node.attributes["alpha"] = 0.5
    model = Model(node.graph, {"": 17, "tensorforge": 1})
    (layer,) = quantizable_layers(model)
    assert "alpha" in lowerable([layer])[layer.name]


@pytest.mark.gpu
def test_the_cublas_int8_product_matches_the_reference_on_cuda():
    from tensorforge.tactics.autotune import autotune

    layer, feeds, _, _, _ = _quantized([4, 8, 32], "Gelu", False, False, True)
    feeds = [f.cuda() for f in feeds]
    choice = autotune(layer, 1, [feeds[0]], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == "vendor.cublas-int8"]
    assert ours and all(c.median_ms < float("inf") for c in ours), [(c.config, c.note) for c in ours]
    assert {c.config["weight"] for c in ours} == {"nk", "kn"}
    # the float fallback through cuBLAS's float product (the fp16 engines' GEMM) passes the check too
    fallback = [
        c for c in choice.candidates if c.tactic == "fallback.float-gemm" and c.config["inner"] == "vendor.cublas-gemm"
    ]
    assert fallback and all(c.median_ms < float("inf") for c in fallback), [(c.config, c.note) for c in fallback]


@pytest.mark.parametrize("weight", ["nk", "kn"])
def test_the_cublas_int8_product_reads_the_weight_either_way_exactly(weight):
    """`torch._int_mm` runs on the CPU too: the product's two weight forms give the exact int32 sums."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randint(-128, 128, (40, 64), generator=generator, dtype=torch.int8)
    w = torch.randint(-128, 128, (64, 24), generator=generator, dtype=torch.int8)
    product = CublasInt8GemmTactic().product({"weight": weight})
    got = product(q, w)
    assert got.dtype == torch.int32 and torch.equal(got.long(), q.long() @ w.long())


@pytest.mark.parametrize("key", ["vendor.onednn-qlinear", "cpu.gemm-int8", "triton.gemm-quantized"])
def test_a_quantized_residual_is_added_as_its_real_values(key):
    """A QuantizedGemm whose residual arrives int8 (`z_scale`, a post-norm transformer's norm output chained): each
    int8 linear tactic the CPU can run (the Triton one under the interpreter, 16-byte int8 rows) adds Z · z_scale,
    as the reference."""
    from tensorforge.ir import DType
    from tensorforge.kernels.quantize import quantize_activation

    layer, feeds, _, _, _ = _quantized([2, 7, 32], "", False, True, True, n=32)
    z_scale = float(feeds[1].abs().max()) / 127
    z = quantize_activation(feeds[1], z_scale, "int8")
    with_float_z = build_layer_kernel(tactic_by_key("reference.registry"), layer, 1, CPU, {}, {})
    want = with_float_z([feeds[0], z.float() * z_scale])[0]  # the same layer adding those real values
    layer.attributes["z_scale"] = z_scale
    layer.inputs[3].dtype = DType.INT8
    tactic = tactic_by_key(key)
    reason = tactic.supports(layer, 1, CPU)
    if key == "triton.gemm-quantized":  # off CUDA it declines; its kernel runs under the interpreter all the same
        config = {"precision": "fp16", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4,
                  "num_stages": 2, "TMA": True}  # fmt: skip
    elif reason is not None:
        pytest.skip(reason)
    else:
        config = {**tactic.space_for(layer, 0)[0], "precision": "fp32"}
    reference = build_layer_kernel(tactic_by_key("reference.registry"), layer, 1, CPU, {}, {})([feeds[0], z])[0]
    assert relative_error(reference, want) <= 1e-6
    got = build_layer_kernel(tactic, layer, 1, CPU, config, {})([feeds[0], z])[0]
    assert relative_error(got, want) <= TOLERANCE[config["precision"]]


def test_the_float_fallback_with_a_quantized_residual_is_checked_against_the_float_layer():
    """A float input and an int8 residual (BERT's attention output projection adding its norm's int8 output): the
    fallback computes the float layer plus the residual's real values, and the autotuner holds it to exactly that
    (it held it to the quantized layer before, which differs by the input's quantization error: inf at fp32)."""
    from tensorforge.ir import DType
    from tensorforge.kernels.quantize import quantize_activation
    from tensorforge.tactics.autotune import autotune
    from tensorforge.tactics.fallback import float_twin

    layer, feeds, _, _, _ = _quantized([2, 7, 32], "", False, True, True, n=32)
    z_scale = float(feeds[1].abs().max()) / 127
    z = quantize_activation(feeds[1], z_scale, "int8")
    twin = build_layer_kernel(tactic_by_key("reference.registry"), float_twin(layer), 1, CPU, {}, {})
    want = twin([feeds[0], z.float() * z_scale])[0]
    layer.attributes["z_scale"] = z_scale
    layer.inputs[3].dtype = DType.INT8
    choice = autotune(layer, 1, [feeds[0], None, None, z], CPU, effort=0, precisions=("fp32",), exhaustive=True)
    fallback = [c for c in choice.candidates if c.tactic == "fallback.float-gemm"]
    assert fallback and any(math.isfinite(c.median_ms) for c in fallback), [c.note for c in fallback]
    config = next(c.config for c in fallback if math.isfinite(c.median_ms))
    got = build_layer_kernel(tactic_by_key("fallback.float-gemm"), layer, 1, CPU, config, {})([feeds[0], z])[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]
