"""Generated FusedPointwise kernels against the registry's FusedPointwise reference (step by step, ONNX ops)."""

import pytest
import torch

from tensorforge.ir import DType, Node, Value
from tensorforge.kernels.triton.pointwise import PointwiseKernel, UnsupportedPointwise, generate_source, load_kernel
from tensorforge.ops import load_all
from tensorforge.ops.fused import DOMAIN, pointwise_program
from tensorforge.ops.registry import REGISTRY, OpContext
from tests.helpers import DEVICES

SMALL = {"BLOCK": 64, "num_warps": 4}


def _reference(steps, inputs, outputs=None):
    load_all()
    attributes = {"program": pointwise_program(steps)}
    if outputs:
        attributes["outputs"] = outputs
    values = [Value(f"x{i}", DType.from_torch(t.dtype)) for i, t in enumerate(inputs)]
    node = Node("FusedPointwise", values, [Value("y")], attributes, domain=DOMAIN)
    ctx = OpContext(node=node, opset=1, device=inputs[0].device)
    result = REGISTRY.lookup("FusedPointwise", DOMAIN, 1).impl(ctx, *inputs, **attributes)
    return result if isinstance(result, tuple) else (result,)


def _run(steps, inputs, outputs=None, constants=None, poison=True):
    kernel = PointwiseKernel(pointwise_program(steps), len(inputs), outputs, constants)
    want = _reference(steps, inputs, outputs)
    out = None
    if poison:
        out = [torch.full_like(w, float("nan")) if w.is_floating_point() else torch.empty_like(w) for w in want]
    got = kernel(*inputs, out=out, config=SMALL)
    assert out is None or all(g is o for g, o in zip(got, out, strict=True))
    return got, want


def _assert_close(got, want, bound=1e-5):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if not w.is_floating_point():
            assert torch.equal(g, w)
            continue
        assert torch.equal(g.isnan(), w.isnan()), "NaN positions differ"
        finite = torch.isfinite(w)
        assert torch.equal(g[~finite & ~w.isnan()], w[~finite & ~w.isnan()])
        if not finite.any():
            continue
        scale = w[finite].double().abs().max().clamp(min=1e-30)
        assert ((g[finite].double() - w[finite].double()).abs().max() / scale).item() <= bound


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_broadcast_dag_with_two_outputs(device, dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 7, device=device).to(dtype)
    x[0, 0, 0] = float("nan")
    bias, scale = torch.randn(7, device=device).to(dtype), torch.randn(3, 1, 1, device=device).to(dtype)
    steps = [
        ("Add", [0, 1], {}),
        ("Relu", [3], {}),
        ("Mul", [4, 2], {}),
        ("Greater", [5, 1], {}),
        ("Where", [6, 5, 0], {}),
        ("Clip", [7, 2, 1], {}),
        ("Cast", [8], {"to": DType.FLOAT16.value}),
    ]
    got, want = _run(steps, [x, bias, scale], outputs=[4, 9])
    _assert_close(got, want, 1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_an_output_smaller_than_the_iteration_space_and_a_transposed_input(device):
    torch.manual_seed(1)
    x = torch.randn(6, 4, device=device).t()  # non-contiguous
    row = torch.randn(6, device=device)
    got, want = _run([("Exp", [1], {}), ("Add", [0, 2], {})], [x, row], outputs=[2, 3])
    assert got[0].shape == (6,)
    _assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_float_division_by_zero_and_nan_propagating_min_max(device):
    a = torch.tensor([1.0, -1.0, 0.0, float("nan"), 2.0, 3.0], device=device)
    b = torch.tensor([0.0, 0.0, 0.0, 1.0, float("nan"), -0.0], device=device)
    steps = [("Div", [0, 1], {}), ("Max", [0, 1], {}), ("Min", [0, 1], {}), ("Sqrt", [0], {})]
    got, want = _run(steps, [a, b], outputs=[2, 3, 4, 5])
    _assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_integer_ops_are_exact(device):
    a = torch.tensor([-7, 7, -7, 100, 5, -128], dtype=torch.int32, device=device)
    b = torch.tensor([2, -2, -2, 3, 7, 3], dtype=torch.int32, device=device)
    steps = [("Div", [0, 1], {}), ("Mul", [0, 1], {}), ("Abs", [3], {}), ("Max", [4, 0], {}), ("Sub", [5, 1], {})]
    got, want = _run(steps, [a, b], outputs=[2, 3, 4, 5, 6], poison=False)
    _assert_close(got, want)
    small = torch.tensor([100, -100, 64, 3], dtype=torch.int8, device=device)
    got, want = _run([("Mul", [0, 0], {}), ("Neg", [1], {})], [small], poison=False)  # wraps like int8
    _assert_close(got, want)


UNARY = [
    ("Sigmoid", {}), ("Tanh", {}), ("Erf", {}), ("Exp", {}), ("Softplus", {}), ("Softsign", {}), ("Sign", {}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}), ("LeakyRelu", {"alpha": 0.2}),
    ("Elu", {"alpha": 0.7}), ("Selu", {}), ("Celu", {"alpha": 1.5}), ("ThresholdedRelu", {"alpha": 0.5}),
    ("Shrink", {"lambd": 0.4, "bias": 0.1}), ("Neg", {}), ("Floor", {}), ("Ceil", {}), ("Sin", {}), ("Cos", {}),
    ("IsNaN", {}), ("IsInf", {"detect_negative": 0}), ("Not", {}), ("Mish", {}),
]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("op", "attrs"), UNARY, ids=[op for op, _ in UNARY])
def test_unary_ops(device, op, attrs):
    torch.manual_seed(2)
    x = torch.cat([torch.randn(40) * 3, torch.tensor([0.0, float("inf"), float("-inf"), float("nan")])]).to(device)
    if op == "Not":
        x = x > 0
    got, want = _run([(op, [0], attrs)], [x], poison=x.is_floating_point())
    _assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, -1.0, 1.7, -3.0])
def test_pow_with_a_constant_exponent(device, exponent):
    torch.manual_seed(3)
    x = torch.randn(33, device=device) * 2
    x[0] = 0.0
    p = torch.tensor(exponent, device=device)
    got, want = _run([("Pow", [0, 1], {}), ("Log", [0], {}), ("Reciprocal", [0], {})], [x, p], [2, 3, 4], {1: exponent})
    _assert_close(got, want)


def test_what_cannot_be_generated_is_named():
    with pytest.raises(UnsupportedPointwise, match="Tan"):
        PointwiseKernel(pointwise_program([("Tan", [0], {})]), 1)
    kernel = PointwiseKernel(pointwise_program([("Pow", [0, 1], {})]), 2)
    with pytest.raises(UnsupportedPointwise, match="constant scalar exponent"):
        kernel.check([torch.float32, torch.float32])
    with pytest.raises(UnsupportedPointwise, match="float operands"):
        PointwiseKernel(pointwise_program([("Exp", [0], {})]), 1).check([torch.int32])
    with pytest.raises(ValueError, match="reads 2 inputs"):
        PointwiseKernel(pointwise_program([("Add", [0, 1], {})]), 2)(torch.randn(3))


def test_sources_are_cached_by_content():
    steps = [("Add", [0, 1], {}), ("Relu", [2], {})]
    source = generate_source(steps, [3], [torch.float32, torch.float32], 2, [[False, False]])
    assert load_kernel(source) is load_kernel(source)
    assert "tl.load" in source and source.count("tl.store") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_bias_gelu_residual_at_bert_scale(dtype):
    torch.manual_seed(4)
    x = torch.randn(8, 128, 3072, device="cuda").to(dtype)
    bias = torch.randn(3072, device="cuda").to(dtype)
    half = torch.tensor(0.5, device="cuda").to(dtype)
    steps = [("Add", [0, 1], {}), ("Mul", [3, 2], {}), ("Erf", [3], {}), ("Mul", [4, 5], {})]
    got, want = _run(steps, [x, bias, half])
    _assert_close(got, want, {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype])
