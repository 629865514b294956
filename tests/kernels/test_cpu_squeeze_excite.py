"""The C++ squeeze-and-excitation kernel against the registry's SqueezeExcite in float64 (built with the host's
compiler on first use, then cached; skipped where no compiler or ninja is found)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.kernels.activations import activation_args
from tensorforge.kernels.cpu import squeeze_excite as se
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops import load_all
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.registry import REGISTRY, OpContext

pytestmark = pytest.mark.skipif(compiler_problem() is not None, reason=str(compiler_problem()))

BOUND = 1e-5  # normwise against float64: float32 sums of at most a few thousand terms
# (act1, act1_params, act2, act2_params): EfficientNet's, MobileNetV3's (torch's HardSigmoid, 1/6 and 1/2), ONNX's
# default HardSigmoid, the other activations the kernel has, and none.
PAIRS = {
    "silu-sigmoid": ("SiLU", [], "Sigmoid", []),
    "relu-hardsigmoid": ("Relu", [], "HardSigmoid", [1 / 6, 0.5]),
    "relu-hardsigmoid-onnx-defaults": ("Relu", [], "HardSigmoid", []),
    "leakyrelu-clip": ("LeakyRelu", [0.1], "Clip", [0.1, 0.9]),
    "hardswish-tanh": ("HardSwish", [], "Tanh", []),
    "elu-linear": ("Elu", [0.7], "", []),
}


def _reference(x, w1, b1, w2, b2, attributes) -> torch.Tensor:
    load_all()
    node = Node("SqueezeExcite", [Value(n) for n in ("x", "w1", "b1", "w2", "b2")], [Value("y")], attributes,
                domain=DOMAIN)  # fmt: skip
    ctx = OpContext(node=node, opset=1, device=x.device)
    wide = [t.double() if t is not None else None for t in (x, w1, b1, w2, b2)]
    return REGISTRY.lookup("SqueezeExcite", DOMAIN, 1).impl(ctx, *wide, **attributes)


def _run(x, w1, b1, w2, b2, attributes) -> torch.Tensor:
    a = attributes
    return se.squeeze_excite(
        x, w1.reshape(w1.shape[0], -1), b1, w2.reshape(w2.shape[0], -1), b2,
        a["act1"], activation_args(a["act1"], a["act1_params"])[1:],
        a["act2"], activation_args(a["act2"], a["act2_params"])[1:],
    )  # fmt: skip


def _block(shape, hidden, pair: str, bias: bool = True):
    n, c, h, w = shape
    torch.manual_seed(sum(shape) + hidden)
    x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    w1 = torch.randn(hidden, c, 1, 1) * 2 / c**0.5
    w2 = torch.randn(c, hidden, 1, 1) * 2 / hidden**0.5
    b1, b2 = (torch.randn(hidden), torch.randn(c)) if bias else (None, None)
    act1, p1, act2, p2 = PAIRS[pair]
    return (x, w1, b1, w2, b2), {"act1": act1, "act1_params": p1, "act2": act2, "act2_params": p2}


def _error(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("pair", list(PAIRS))
def test_every_activation_pair_matches_the_reference(pair):
    operands, attributes = _block((2, 40, 5, 7), 10, pair)
    got = _run(*operands, attributes)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert _error(got, _reference(*operands, attributes)) <= BOUND


@pytest.mark.parametrize(
    ("shape", "hidden"),
    [((1, 16, 112, 112), 4), ((1, 960, 7, 7), 240), ((3, 72, 13, 1), 24), ((2, 9, 1, 1), 1), ((1, 200, 3, 5), 50)],
)
def test_network_shapes_odd_sizes_and_batches(shape, hidden):
    """MobileNetV3's first and last blocks, a one-column map, a 1×1 map, channels no vector width divides."""
    operands, attributes = _block(shape, hidden, "relu-hardsigmoid")
    assert _error(_run(*operands, attributes), _reference(*operands, attributes)) <= BOUND


def test_without_biases_and_from_an_nchw_input():
    operands, attributes = _block((2, 24, 6, 6), 6, "silu-sigmoid", bias=False)
    x, rest = operands[0].contiguous(), operands[1:]
    got = _run(x, *rest, attributes)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert _error(got, _reference(x, *rest, attributes)) <= BOUND


def test_a_nan_spreads_as_in_the_reference():
    """A NaN pixel makes its image's mean NaN, so every gate of that image and its whole output; the other image
    is untouched."""
    operands, attributes = _block((2, 8, 4, 4), 4, "relu-hardsigmoid")
    operands[0][0, 3, 1, 2] = math.nan
    got, want = _run(*operands, attributes), _reference(*operands, attributes)
    assert got[0].isnan().all() and want[0].isnan().all()
    assert _error(got[1], want[1]) <= BOUND


def test_an_activation_the_kernel_lacks_is_refused_by_name():
    operands, attributes = _block((1, 8, 2, 2), 2, "silu-sigmoid")
    with pytest.raises(ValueError, match="'Gelu'"):
        _run(*operands, {**attributes, "act1": "Gelu"})


def test_a_source_that_does_not_build_fails_once_with_its_error(monkeypatch, tmp_path):
    """A compile error is reported, and the next call raises the same at once instead of compiling again."""
    from tensorforge.kernels.cpu import extension

    monkeypatch.setenv("TENSORFORGE_CACHE", str(tmp_path))
    source = "#include <torch/extension.h>\nint broken( {"
    with pytest.raises(RuntimeError, match="'broken_probe' did not build"):
        extension.load("broken_probe", source, ("broken",))
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match="'broken_probe' did not build"):
        extension.load("broken_probe", source + "\n", ("broken",))  # another source, same name: not compiled again
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("pair", ["silu-sigmoid", "relu-hardsigmoid"])
def test_the_gate_alone_is_the_factor_the_block_multiplies_by(pair):
    """`se.gate` gives each image's [C] factor: x · gate[n] is the block's output (against float64)."""
    (x, w1, b1, w2, b2), attributes = _block((2, 40, 6, 5), 10, pair)
    a = attributes
    gate = se.gate(
        x, w1.reshape(10, -1), b1, w2.reshape(40, -1), b2,
        a["act1"], activation_args(a["act1"], a["act1_params"])[1:],
        a["act2"], activation_args(a["act2"], a["act2_params"])[1:],
    )  # fmt: skip
    assert gate.shape == (2, 40) and gate.dtype == torch.float32
    want = _reference(x, w1, b1, w2, b2, attributes)
    got = x.double() * gate.double()[:, :, None, None]
    assert ((got - want).abs().max() / want.abs().max()).item() <= BOUND


def test_the_gate_of_a_bf16_input_is_that_of_the_same_values_in_float32():
    """bf16 pixels widen exactly to float32 and are summed in the same order: the same gate, bit for bit."""
    (x, w1, b1, w2, b2), _ = _block((2, 40, 6, 5), 10, "silu-sigmoid")
    x = x.bfloat16()
    matrices = (w1.reshape(10, -1), b1, w2.reshape(40, -1), b2, "SiLU", (0.0, 0.0), "Sigmoid", (0.0, 0.0))
    gate = se.gate(x, *matrices)
    assert gate.dtype == torch.float32 and torch.equal(gate, se.gate(x.float(), *matrices))
