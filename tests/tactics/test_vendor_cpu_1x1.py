"""`vendor.cpu-matmul-1x1`: a 1×1 FusedConv on the CPU as one matrix product into the channels-last output, its
activations and residual in place, against the reference FusedConv."""

import pytest
import torch

from tensorforge.ir import DType, Node, Value
from tensorforge.ops.fused import DOMAIN
from tensorforge.tactics.autotune import TOLERANCE, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.test_triton_family import _poisoning_alloc

TACTIC = "vendor.cpu-matmul-1x1"
CPU = torch.device("cpu")
CONFIG = {"precision": "fp32", "layout": "NHWC"}


def _layer(kernel=1, bias=True, residual=False, cin=24, cout=40, **attributes) -> Node:
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(cout, cin // attributes.get("group", 1), kernel, kernel, generator=generator) / cin**0.5
    inputs = [Value("x", DType.FLOAT, (2, cin, 7, 9)), Value("w", DType.FLOAT, tuple(w.shape), const=w)]
    inputs.append(Value("b", DType.FLOAT, (cout,), const=torch.randn(cout, generator=generator)) if bias else None)
    if residual:
        inputs.append(Value("z", DType.FLOAT, (2, cout, 7, 9)))
    attributes = {"pre": "", "pre_params": [], "post": "", "post_params": [], **attributes}
    return Node("FusedConv", inputs, [Value("y", DType.FLOAT, (2, cout, 7, 9))], attributes, domain=DOMAIN)


def test_it_takes_only_the_convolutions_that_are_matrix_products():
    tactic = tactic_by_key(TACTIC)
    assert tactic.supports(_layer(), 1, CPU) is None
    assert tactic.supports(_layer(pads=[0, 0, 0, 0], auto_pad="VALID"), 1, CPU) is None
    assert "CPU" in tactic.supports(_layer(), 1, torch.device("cuda"))
    assert "1x1" in tactic.supports(_layer(kernel=3), 1, CPU)
    assert "stride 1" in tactic.supports(_layer(strides=[2, 2]), 1, CPU)
    assert "ungrouped" in tactic.supports(_layer(group=4), 1, CPU)
    assert "unpadded" in tactic.supports(_layer(pads=[1, 1, 1, 1]), 1, CPU)
    assert "Swish" in tactic.supports(_layer(pre="Swish"), 1, CPU)


@pytest.mark.parametrize(
    ("pre", "post", "params"),
    [
        ("", "", []),
        ("Relu", "", []),
        ("HardSwish", "", []),
        ("SiLU", "", []),
        ("Clip", "", [0.0, 6.0]),
        ("HardSigmoid", "", [0.25, 0.5]),  # no in-place form in torch
        ("Gelu", "", []),
        ("", "Relu", []),
        ("Sigmoid", "HardSwish", []),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_it_computes_the_fused_convolution_into_the_given_buffer(pre, post, params, bias):
    residual = bool(post)
    node = _layer(bias=bias, residual=residual, pre=pre, pre_params=params, post=post)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, 7, 9, generator=generator).contiguous(memory_format=torch.channels_last)
    feeds = [x] + ([torch.randn(2, 40, 7, 9, generator=generator)] if residual else [])
    made = []
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, CONFIG, {})(feeds, alloc=_poisoning_alloc(CPU, made))[
        0
    ]
    assert got is made[0] and got.is_contiguous(memory_format=torch.channels_last)
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]


def test_an_nchw_input_and_a_broadcast_residual():
    node = _layer(residual=True, post="Relu")
    node.inputs[3].shape = (1, 40, 1, 9)
    generator = torch.Generator().manual_seed(2)
    feeds = [torch.randn(2, 24, 7, 9, generator=generator), torch.randn(1, 40, 1, 9, generator=generator)]
    got = build_layer_kernel(tactic_by_key(TACTIC), node, 1, CPU, CONFIG, {})(feeds)[0]
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, CPU, {}, {})(feeds)[0]
    assert relative_error(got, want) <= TOLERANCE["fp32"]
