"""The triton.gemm, triton.pointwise, triton.softmax and triton.layernorm tactics: what they decline and why,
their kernels against the reference tactic (under the interpreter on the CPU), and as autotuned candidates."""

import pytest
import torch

from tensorforge.ir import DType, Node, Value
from tensorforge.ops.fused import DOMAIN, pointwise_program
from tensorforge.tactics.autotune import autotune
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.vendor import ReferenceTactic

TINY_GEMM = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
CPU = torch.device("cpu")


def _node(op_type, shapes, attributes=None, domain="", dtype=DType.FLOAT, consts=None):
    consts = consts or {}
    inputs = [Value(f"x{i}", dtype, list(s), const=consts.get(i)) for i, s in enumerate(shapes)]
    return Node(op_type, inputs, [Value("y", dtype)], attributes or {}, domain=domain)


def _fused_gemm(**attributes):
    return _node("FusedGemm", [[2, 9, 20], [20, 18], [18], [2, 9, 18]], attributes, DOMAIN)


def test_every_tactic_declines_without_cuda():
    nodes = {
        "triton.gemm": _fused_gemm(),
        "triton.pointwise": _node("FusedPointwise", [[4]], {"program": pointwise_program([("Relu", [0], {})])}, DOMAIN),
        "triton.softmax": _node("Softmax", [[3, 4]]),
        "triton.layernorm": _node("LayerNormalization", [[3, 4], [4]]),
    }
    for key, node in nodes.items():
        assert tactic_by_key(key).supports(node, 17, CPU) == "needs CUDA"


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        (_node("MatMul", [[20], [20, 18]]), "matrix operands only"),
        (_node("MatMul", [[4, 20], [20, 18]], dtype=DType.INT32), "float16/bfloat16/float32"),
        (_fused_gemm(post="Swish"), "no Triton epilogue for post activation 'Swish'"),
    ],
)
def test_the_gemm_tactic_says_why_it_declines(node, reason):
    assert reason in tactic_by_key("triton.gemm").supports(node, 17, torch.device("cuda"))


def test_the_pointwise_tactic_declines_an_op_it_cannot_generate():
    node = _node("FusedPointwise", [[4]], {"program": pointwise_program([("Tan", [0], {})])}, DOMAIN)
    cuda = torch.device("cuda")
    assert "Tan has no generated Triton form" in tactic_by_key("triton.pointwise").supports(node, 17, cuda)
    softmax = _node("Softmax", [[3, 4]], {"axis": 0})
    assert "the last axis only" in tactic_by_key("triton.softmax").supports(softmax, 17, cuda)


def _compare(key, node, inputs, config, bound=1e-5):
    want = ReferenceTactic().build(node, 17, CPU, {})(inputs)
    got = tactic_by_key(key).build(node, 17, CPU, config)(inputs)
    assert len(got) == 1 and got[0].shape == want[0].shape and got[0].dtype == want[0].dtype
    error = (got[0].double() - want[0].double()).abs().max() / want[0].double().abs().max()
    assert error.item() <= bound


@pytest.mark.parametrize(
    ("op", "shapes", "attributes", "domain"),
    [
        ("FusedGemm", [[2, 9, 20], [18, 20], [18], [2, 9, 18]], {"transB": 1, "alpha": 0.7, "pre": "Relu"}, DOMAIN),
        ("Gemm", [[20, 9], [20, 18], [9, 1]], {"transA": 1, "beta": 0.5}, ""),
        ("MatMul", [[3, 1, 9, 20], [2, 20, 18]], {}, ""),
    ],
)
def test_the_gemm_kernel_matches_the_reference_tactic(op, shapes, attributes, domain):
    torch.manual_seed(0)
    node = _node(op, shapes, attributes, domain)
    _compare("triton.gemm", node, [torch.randn(s) for s in shapes], TINY_GEMM)


def test_the_row_and_pointwise_kernels_match_the_reference_tactic():
    torch.manual_seed(1)
    x = torch.randn(6, 40)
    _compare("triton.softmax", _node("Softmax", [[6, 40]]), [x], {"BLOCK": 64, "num_warps": 4})
    scale, bias = torch.randn(40), torch.randn(40)
    layer = _node("LayerNormalization", [[6, 40], [40], [40]], {"epsilon": 1e-3})
    _compare("triton.layernorm", layer, [x, scale, bias], {"BLOCK": 16, "num_warps": 4})
    exponent = torch.tensor(2.0)
    program = pointwise_program([("Pow", [0, 1], {}), ("Add", [2, 0], {}), ("Sigmoid", [3], {})])
    fused = _node("FusedPointwise", [[6, 40], []], {"program": program}, DOMAIN, consts={1: exponent})
    _compare("triton.pointwise", fused, [x, exponent], {"BLOCK": 64, "num_warps": 4})


@pytest.mark.gpu
def test_triton_gemm_candidates_are_correct_on_cuda():
    torch.manual_seed(2)
    consts = {1: torch.randn(768, 3072) / 768**0.5, 2: torch.randn(3072)}
    node = _node("FusedGemm", [[8, 128, 768], [768, 3072], [3072]], {"post": "Gelu"}, DOMAIN, consts=consts)
    x = torch.randn(8, 128, 768, device="cuda")
    choice = autotune(node, 17, [x], "cuda", effort=1, precisions=("fp32", "tf32", "fp16", "bf16"), exhaustive=True)
    candidates = [c for c in choice.candidates if c.tactic == "triton.gemm"]
    # TF32 tiles too wide for the device's shared memory are refused before compiling, by name; every other
    # candidate runs correctly.
    too_wide = [c for c in candidates if "bytes of shared memory" in c.note]
    assert {c.config["precision"] for c in too_wide} <= {"tf32"}, choice.table("ffn")
    ran = [c for c in candidates if c not in too_wide]
    assert len(ran) >= len(candidates) - 4 and all(c.median_ms < float("inf") for c in ran), choice.table("ffn")
