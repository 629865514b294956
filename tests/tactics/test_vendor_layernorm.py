"""The vendor LayerNormalization tactic: torch's one-pass layer norm against the reference, and its declines."""

import math

import pytest
import torch

from tensorforge.ir import DType
from tensorforge.tactics.autotune import autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import DEVICES, layer_norm_node

TACTIC = "vendor.torch-layernorm"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("shape", "axis", "bias"), [([2, 7, 48], -1, True), ([2, 3, 5, 6], -2, False), ([4, 9], 0, True)]
)
def test_vendor_layer_norm_matches_the_reference(device, shape, axis, bias):
    node = layer_norm_node(shape, axis, bias)
    x = torch.randn(shape, device=device) * 3 + 1
    choice = autotune(node, 17, [x], device, effort=0)
    vendor = next(c for c in choice.candidates if c.tactic == TACTIC)
    assert math.isfinite(vendor.median_ms), vendor.note
    dev = torch.device(device)
    ours = build_layer_kernel(tactic_by_key(TACTIC), node, 17, dev, vendor.config, {})([x])[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, dev, vendor.config, {})([x])[0]
    assert relative_error(ours, want) <= 1e-5


def test_vendor_layer_norm_declines_the_statistics_outputs_and_other_stash_types():
    tactic, cpu = tactic_by_key(TACTIC), torch.device("cpu")
    assert "Mean and InvStdDev" in tactic.supports(layer_norm_node([2, 8], -1, outputs=("y", "mean")), 17, cpu)
    assert "stash_type" in tactic.supports(layer_norm_node([2, 8], -1, stash_type=11), 17, cpu)


def test_a_quantized_layer_norm_runs_where_a_kernel_quantizes():
    """A norm with `y_scale` (writing its readers' int8 input) is declined, with the reason, by the tactics whose
    kernels write float; `triton.layernorm` (on CUDA) and `cpu.layernorm` take it, the latter in int8 only."""
    node = layer_norm_node([2, 7, 48], -1)
    node.attributes.update(y_scale=0.05, quant="int8")
    assert "y_scale" in tactic_by_key(TACTIC).supports(node, 17, torch.device("cpu"))
    cuda = tactic_by_key("cuda.layernorm").supports(node, 17, torch.device("cuda"))
    assert "y_scale" in cuda or not torch.cuda.is_available()
    for key in ("triton.layernorm", "cpu.layernorm"):
        assert "y_scale" not in (tactic_by_key(key).supports(node, 17, torch.device("cpu")) or ""), key
    node.attributes["quant"] = "fp8e4m3"
    reason = tactic_by_key("cpu.layernorm").supports(node, 17, torch.device("cpu"))
    assert reason is not None and "int8 only" in reason


@pytest.mark.gpu
def test_a_quantized_layer_norm_on_the_gpu_matches_the_reference():
    node = layer_norm_node([4, 50, 384], -1)
    node.domain = "tensorforge"  # the chaining pass's norm: the domain's, which takes y_scale
    node.attributes.update(y_scale=0.03, quant="int8")
    node.outputs[0].dtype = DType.INT8  # as the chaining pass declares it
    x = torch.randn(4, 50, 384, device="cuda", dtype=torch.float16) * 2
    choice = autotune(node, 17, [x], torch.device("cuda"), effort=0)
    triton = next(c for c in choice.candidates if c.tactic == "triton.layernorm")
    assert math.isfinite(triton.median_ms), triton.note
    dev = torch.device("cuda")
    ours = build_layer_kernel(tactic_by_key("triton.layernorm"), node, 17, dev, triton.config, {})([x])[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, dev, {}, {})([x])[0]
    assert ours.dtype == want.dtype == torch.int8
    assert int((ours.int() - want.int()).abs().max()) <= 1 and (ours != want).float().mean().item() <= 1e-3


def test_a_quantized_layer_norm_is_checked_as_a_rounding_of_its_float_values():
    """The autotuner holds a norm's int8 output to "a rounding of the float result within tolerance" (as a
    quantized layer's), not to bit equality with the reference: a kernel that sums in another order may round an
    element on a step's boundary the other way. The CPU kernel passes and is timed."""
    from tensorforge.kernels.cpu import layer_norm as ln
    from tensorforge.kernels.cpu.extension import compiler_problem

    if compiler_problem() or ln.problem():
        pytest.skip(str(compiler_problem() or ln.problem()))
    node = layer_norm_node([2, 197, 384], -1)
    node.domain = "tensorforge"
    node.attributes.update(y_scale=0.02, quant="int8")
    x = torch.randn(2, 197, 384) * 3 + 1
    choice = autotune(node, 17, [x], "cpu", effort=0)
    cpu = next(c for c in choice.candidates if c.tactic == "cpu.layernorm")
    assert math.isfinite(cpu.median_ms), cpu.note


def test_a_norm_writing_its_quantized_output_and_y_runs_where_a_kernel_writes_both():
    """The domain's norm with `y_scale` and a second output (Y beside Q(Y), `passes.quant_chain`): declined by the
    tactics that write Y alone, taken by `triton.layernorm` and `cpu.layernorm`; its float twin (the autotuner's
    reference, Y twice) runs on the reference alone. The CPU kernel writes both and passes the autotuner's check on
    each (the quantized one as a rounding of the float values, Y against the reference's)."""
    from tensorforge.kernels.cpu import layer_norm as ln
    from tensorforge.kernels.cpu.extension import compiler_problem
    from tensorforge.tactics.fallback import with_float_output

    node = layer_norm_node([2, 197, 384], -1, outputs=("y", "y_float"))
    node.domain = "tensorforge"
    node.attributes.update(y_scale=0.02, quant="int8")
    node.outputs[0].dtype = DType.INT8
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert "y_scale" in tactic_by_key(TACTIC).supports(node, 17, cpu)
    assert "y_scale" in tactic_by_key("cuda.layernorm").supports(node, 17, cuda)
    assert tactic_by_key("triton.layernorm").supports(node, 17, cuda) is None
    twin = with_float_output(node)
    for key in ("triton.layernorm", "cpu.layernorm", "cuda.layernorm"):
        assert "Y beside Q(Y)" in tactic_by_key(key).supports(twin, 17, cuda if key != "cpu.layernorm" else cpu)
    if compiler_problem() or ln.problem():
        pytest.skip(str(compiler_problem() or ln.problem()))
    x = torch.randn(2, 197, 384) * 3 + 1
    choice = autotune(node, 17, [x], "cpu", effort=0)
    kernel = next(c for c in choice.candidates if c.tactic == "cpu.layernorm")
    assert math.isfinite(kernel.median_ms), kernel.note
    quantized, y = build_layer_kernel(tactic_by_key("cpu.layernorm"), node, 17, cpu, kernel.config, {})([x])
    _, want = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, cpu, {}, {})([x])
    assert quantized.dtype == torch.int8 and relative_error(y, want) <= 1e-5
