"""Every CPU tactic of QuantizedConv / QuantizedGemm in the forms chaining gives them (`passes.quant_chain`): a
float input with a quantized output, a quantized input with a float output, quantized both ways; each checked
against the reference layer by the autotuner's own test (a quantized output must be a rounding of the float
reference within the fp32 tolerance) and by the same test here. The float fallback's inner tactics that need
CUDA fail on the CPU, as they do in a CPU build."""

import math

import pytest
import torch

from tensorforge.ir import DType, Node
from tensorforge.ops.fused import QUANT_TYPES
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.tactics.autotune import (
    TOLERANCE,
    autotune,
    build_layer_kernel,
    quantized_mismatch,
    relative_error,
)
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.fallback import float_twin, with_float_output
from tensorforge.tactics.vendor import onednn_int8_problem
from tests.quant.chain_support import lowered

CPU = torch.device("cpu")
CONV_TACTICS = ["vendor.torch-quantized", "vendor.onednn-qconv", "fallback.float-conv"]
GEMM_TACTICS = ["vendor.onednn-qlinear", "fallback.float-gemm"]
# (layer, its form): conv1 reads float and writes int8 (conv2's input and conv3's residual), conv2 (depthwise)
# reads and writes int8, conv3 (1×1) reads int8 and adds an int8 residual, conv4 reads int8 and writes float,
# fc1 reads float and writes int8, fc2 reads int8 and writes float.
LAYERS = {
    "conv1": "float -> int8",
    "conv2": "int8 -> int8",
    "conv3": "int8 -> int8, int8 residual",
    "conv4": "int8 -> float",
    "fc1": "float -> int8",
    "fc2": "int8 -> float",
}


@pytest.fixture(scope="module")
def chained():
    model, section = chain_quantized(lowered())
    assert len(section["chained"]) == 4 and section["quantized_residuals"] == ["conv3"]
    return model


def _node(model, name: str) -> Node:
    return next(node for node in model.graph.nodes if node.name == name)


def _inputs(node: Node, seed: int = 0) -> list[torch.Tensor | None]:
    """Random non-constant inputs of `node` in its declared types (int8 values for a quantized input)."""
    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for value in node.inputs:
        if value is None or value.is_const:
            inputs.append(None)
        elif value.dtype == DType.INT8:
            inputs.append(torch.randint(-128, 128, value.shape, generator=generator, dtype=torch.int8))
        else:
            inputs.append(torch.randn(value.shape, generator=generator).relu())
    return inputs


def _check(node: Node, tactic: str, got: torch.Tensor, args) -> None:
    """`got` against the reference of what `tactic` computes for `node` (its float twin for the float fallback
    of a float-input layer), the quantized output as a rounding of the float reference."""
    semantics = tactic_by_key(tactic).semantics(node)
    reference_node = semantics if semantics is not None else with_float_output(node)
    want = build_layer_kernel(tactic_by_key("reference.registry"), reference_node, 1, CPU, {}, {})(args)[0]
    scale = float(node.attributes.get("y_scale", 0.0))
    if scale:
        assert got.dtype == QUANT_TYPES[node.attributes["quant"]].torch
        assert quantized_mismatch(got, want, scale, node.attributes["quant"], TOLERANCE["fp32"]) == ""
    else:
        assert got.dtype == torch.float32
        assert relative_error(got, want) <= TOLERANCE["fp32"]


@pytest.mark.parametrize("layer", list(LAYERS))
def test_each_cpu_tactic_runs_the_chained_forms_and_matches_the_reference(chained, layer):
    node = _node(chained, layer)
    tactics = GEMM_TACTICS if node.op_type == "QuantizedGemm" else CONV_TACTICS
    if onednn_int8_problem():  # (declined on this CPU, with the reason)
        tactics = [tactic for tactic in tactics if not tactic.startswith("vendor.onednn")]
    inputs = _inputs(node)
    choice = autotune(node, 1, inputs, "cpu", effort=0, exhaustive=True)
    args = [t for t in inputs if t is not None]
    for tactic in tactics:
        ours = [c for c in choice.candidates if c.tactic == tactic and "needs CUDA" not in c.note]
        assert ours and all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]
        for candidate in ours:
            got = build_layer_kernel(tactic_by_key(tactic), node, 1, CPU, candidate.config, {})(args)[0]
            _check(node, tactic, got, args)


def test_the_float_fallback_of_a_quantized_input_is_checked_against_the_layer_itself(chained):
    node = _node(chained, "conv3")
    fallback = tactic_by_key("fallback.float-conv")
    assert fallback.semantics(node) is None  # DQ(X) is on the grid: the float layer is the quantized one
    twin = float_twin(node)
    assert twin.inputs[0].dtype == DType.FLOAT and twin.outputs[0].dtype == DType.FLOAT
    assert "y_scale" not in twin.attributes
    fc1 = _node(chained, "fc1")
    assert tactic_by_key("fallback.float-gemm").semantics(fc1).op_type == "FusedGemm"


def test_a_wrong_rounding_of_a_quantized_output_is_refused(chained):
    node = _node(chained, "conv2")
    args = [t for t in _inputs(node) if t is not None]
    want = build_layer_kernel(tactic_by_key("reference.registry"), with_float_output(node), 1, CPU, {}, {})(args)[0]
    scale = node.attributes["y_scale"]
    exact = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(args)[0]
    assert quantized_mismatch(exact, want, scale, "int8", TOLERANCE["fp32"]) == ""
    truncated = torch.trunc(want / scale).clamp(-128, 127).to(torch.int8)  # rounds toward zero: wrong
    assert "no rounding of the reference" in quantized_mismatch(truncated, want, scale, "int8", TOLERANCE["fp32"])
    off_by_one = exact.clone()
    off_by_one.view(-1)[0] = off_by_one.view(-1)[0] - 1 if off_by_one.view(-1)[0] > -128 else 1
    assert quantized_mismatch(off_by_one, want, scale, "int8", TOLERANCE["fp32"])


def test_onednn_int8_tactics_decline_fp8_chains():
    model, _ = chain_quantized(lowered("fp8e4m3"))
    node = _node(model, "conv2")
    assert node.outputs[0].dtype == DType.FLOAT8E4M3FN
    assert tactic_by_key("vendor.onednn-qconv").supports(node, 1, CPU) == "int8 only"
    inputs = [
        None if t is None else t.to(torch.float8_e4m3fn) if v.dtype == DType.FLOAT8E4M3FN else t
        for t, v in zip(_inputs(node), node.inputs, strict=True)
    ]
    args = [t for t in inputs if t is not None]
    for tactic in ("vendor.torch-quantized", "fallback.float-conv"):
        choice = autotune(node, 1, inputs, "cpu", effort=0, families=(tactic.split(".")[0],))
        ours = [c for c in choice.candidates if c.tactic == tactic and "needs CUDA" not in c.note]
        assert ours and all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]
        got = build_layer_kernel(tactic_by_key(tactic), node, 1, CPU, ours[0].config, {})(args)[0]
        _check(node, tactic, got, args)


TRITON = "triton.conv-igemm-quantized"
TINY = {"block_m": 16, "block_n": 16, "block_k": 32, "group_m": 2, "num_warps": 1, "num_stages": 1, "split_k": 1}


@pytest.mark.parametrize("layer", ["conv2", "conv3", "conv4"])
def test_the_triton_quantized_kernel_runs_the_chained_forms_under_the_interpreter(chained, layer):
    node = _node(chained, layer)
    assert tactic_by_key(TRITON).supports(node, 1, CPU).startswith("needs CUDA")
    args = [t for t in _inputs(node) if t is not None]
    config = {"precision": "fp32", "layout": "NHWC", **TINY}
    got = build_layer_kernel(tactic_by_key(TRITON), node, 1, CPU, config, {})(args)[0]
    assert got.is_contiguous(memory_format=torch.channels_last)
    _check(node, TRITON, got, args)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
def test_every_quantized_tactic_on_cuda_runs_the_chained_forms_or_declines(quant):
    """On CUDA, every chained layer's candidates: the Triton kernel (int8 / E4M3 in and out), the torch reference
    tactic, cuBLAS int8 for the products and the float fallback all run correctly or decline with a reason.
    fp8 tensor cores add in reduced precision: the fp16 candidates are held to fp16's bound and pass."""
    model, _ = chain_quantized(lowered(quant))
    storage = QUANT_TYPES[quant].torch
    for name in LAYERS:
        node = _node(model, name)
        inputs = [
            None if t is None else t.to(storage).cuda() if v.dtype == QUANT_TYPES[quant] else t.cuda()
            for t, v in zip(_inputs(node), node.inputs, strict=True)
        ]
        choice = autotune(node, 1, inputs, "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
        ran = [c for c in choice.candidates if math.isfinite(c.median_ms)]
        wrong = [(c.tactic, c.config, c.note) for c in choice.candidates if c.note.startswith("wrong result")]
        if quant == "int8":
            assert not wrong, wrong
        if node.op_type == "QuantizedConv":
            ours = [c for c in ran if c.tactic == TRITON]
            triton = [(c.config["precision"], c.median_ms, c.note) for c in choice.candidates if c.tactic == TRITON]
            assert ours, (name, triton)


@pytest.mark.gpu
@pytest.mark.parametrize("inner", ["cuda.depthwise", "triton.depthwise"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_float_fallback_of_a_depthwise_layer_runs_on_our_cuda_depthwise_kernels(chained, inner, precision):
    """On CUDA a depthwise layer's fallback may run on our depthwise kernels (MobileNetV3's int8 build at batch 256
    timed it on cuDNN's and torch's convolutions only, 3.6-7× slower than these in its fp16 engine): int8 in and out,
    the output a rounding of the float layer on the dequantized input within the variant's bound."""
    node = _node(chained, "conv2")
    args = [t for t in _inputs(node) if t is not None]
    config = {"precision": precision, "layout": "NHWC", "inner": inner}
    fallback = tactic_by_key("fallback.float-conv")
    cuda = torch.device("cuda")
    got = build_layer_kernel(fallback, node, 1, cuda, config, {})([t.to(cuda) for t in args])[0].cpu()
    want = build_layer_kernel(tactic_by_key("reference.registry"), with_float_output(node), 1, CPU, {}, {})(args)[0]
    assert got.dtype == torch.int8
    assert quantized_mismatch(got, want, float(node.attributes["y_scale"]), "int8", TOLERANCE[precision]) == ""


@pytest.mark.parametrize("layer", ["conv3", "conv4"])
def test_the_float_fallback_dequantizes_a_quantized_input_into_the_variants_type(chained, layer, monkeypatch):
    """In an fp16 variant the inner float kernel gets the dequantized activation in fp16, like the bias and the
    residual the variant converted: mixed float32 / fp16 operands ran cuDNN's fused convolution on misread
    memory on CUDA (wrong values, then an illegal address)."""
    node = _node(chained, layer)
    inner = tactic_by_key("vendor.torch-direct")
    seen: list[torch.dtype] = []
    build = type(inner).build

    def spying_build(self, *args, **kwargs):
        kernel = build(self, *args, **kwargs)

        def run(inputs, **kw):
            seen.extend(t.dtype for t in inputs if isinstance(t, torch.Tensor))
            return kernel(inputs, **kw)

        return run

    monkeypatch.setattr(type(inner), "build", spying_build)
    args = [t for t in _inputs(node) if t is not None]
    config = {"precision": "fp16", "layout": "NCHW", "inner": "vendor.torch-direct"}
    got = build_layer_kernel(tactic_by_key("fallback.float-conv"), node, 1, CPU, config, {})(args)[0]
    assert seen and set(seen) == {torch.float16}, seen
    want = build_layer_kernel(tactic_by_key("reference.registry"), with_float_output(node), 1, CPU, {}, {})(args)[0]
    scale = float(node.attributes.get("y_scale", 0.0))
    if scale:
        assert quantized_mismatch(got, want, scale, "int8", TOLERANCE["fp16"]) == ""
    else:
        assert got.dtype == torch.float16 and relative_error(got.float(), want) <= TOLERANCE["fp16"]


def test_the_float_fallback_offers_our_cpu_kernels_where_they_run(chained):
    """The depthwise layer's fallback may run on our depthwise kernel, not on the 1×1 or the direct one; the
    product's on our product kernel (where the CPU runs them)."""
    from tensorforge.kernels.cpu import pointwise
    from tensorforge.kernels.cpu.extension import compiler_problem

    if compiler_problem() or pointwise.problem():
        pytest.skip("our CPU kernels do not run here")
    inner = {c["inner"] for c in tactic_by_key("fallback.float-conv").space_for(_node(chained, "conv2"), 0)}
    assert "cpu.depthwise" in inner and "vendor.onednn-fused" in inner
    assert "cpu.pointwise" not in inner and "cpu.conv" not in inner  # (one group only)
    inner = {c["inner"] for c in tactic_by_key("fallback.float-gemm").space_for(_node(chained, "fc2"), 0)}
    assert "cpu.gemm" in inner
