"""How a variant converts a layer's activations: precision and layout in one copy, channel slices of
channels_last tensors passed as they are to tactics that read strides, converted for the others."""

import pytest
import torch

from tensorforge.ir import DType, Node, Value
from tensorforge.ops.fused import DOMAIN
from tensorforge.tactics import autotune  # noqa: F401 - registers the tactic families
from tensorforge.tactics import variant as variant_module
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.variant import (
    LayerKernel,
    Variant,
    convert,
    has_float_activation,
    layout_free,
    precision_choices,
    variants,
)


def _echo(strided: bool) -> LayerKernel:
    """A layer kernel that returns its input as the kernel received it."""
    node = Node("Relu", [Value("x", DType.FLOAT, (2, 8, 3, 3))], [Value("y", DType.FLOAT, (2, 8, 3, 3))])
    return LayerKernel(node, lambda inputs: (inputs[0],), Variant("fp16", "NHWC"), {}, strided_inputs=strided)


def test_cast_and_layout_in_one_copy():
    x = torch.randn(2, 8, 3, 3)
    got = convert(x, DType.FLOAT, Variant("fp16", "NHWC"))
    assert got.dtype == torch.float16 and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, x.half())


def test_channel_slices_reach_strided_kernels_uncopied():
    whole = torch.randn(2, 20, 3, 3).half().contiguous(memory_format=torch.channels_last)
    part = whole[:, 4:12]
    assert _echo(strided=True)([part])[0] is part
    copied = _echo(strided=False)([part])[0]
    assert copied is not part and copied.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(copied, part)


def test_a_channel_slice_that_needs_a_cast_is_copied_channels_last():
    part = torch.randn(2, 20, 3, 3).contiguous(memory_format=torch.channels_last)[:, 4:12]
    got = _echo(strided=True)([part])[0]
    assert got.dtype == torch.float16 and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, part.half())


@pytest.mark.gpu
def test_layout_changes_on_cuda_run_the_tiled_copy(monkeypatch):
    """On CUDA a layout change (with or without a cast) is `relayout`, the tiled copy, and equals torch's."""
    calls = []
    real = variant_module.relayout
    monkeypatch.setattr(variant_module, "relayout", lambda *a, **k: calls.append(a[1:]) or real(*a, **k))
    x = torch.randn(4, 24, 9, 9, device="cuda")
    got = convert(x, DType.FLOAT, Variant("fp16", "NHWC"))
    assert calls == [(torch.float16, torch.channels_last)]
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, x.to(torch.float16, memory_format=torch.channels_last))
    assert torch.equal(_echo(strided=False)([x.half()])[0], x.half().contiguous(memory_format=torch.channels_last))
    assert len(calls) == 2


def test_only_float_activations_make_precision_choices():
    """A quantized layer between int8 activations runs one kernel whatever the precision (its float32 bias and
    scales are constants): fp32 only, except for a tactic that computes in the variant's type (the float
    fallback). With a float output, the float types it can write."""
    allowed = ["fp32", "tf32", "fp16", "bf16"]
    bias = Value("b", DType.FLOAT, (8,), const=torch.randn(8))
    scales = Value("s", DType.FLOAT, (8,), const=torch.rand(8))
    weight = Value("w", DType.INT8, (8, 8, 1, 1), const=torch.zeros(8, 8, 1, 1, dtype=torch.int8))
    floats = ["fp32", "fp16", "bf16"]
    for out_dtype, wanted, computing in ((DType.INT8, ["fp32"], floats), (DType.FLOAT, floats, floats)):
        x, y = Value("x", DType.INT8, (1, 8, 4, 4)), Value("y", out_dtype, (1, 8, 4, 4))
        node = Node("QuantizedConv", [x, weight, bias, None, scales], [y], {}, domain=DOMAIN)
        assert precision_choices(node, allowed) == wanted
        assert precision_choices(node, allowed, computes_in_it=True) == computing
        assert has_float_activation(node) == (out_dtype == DType.FLOAT)


def test_a_tactic_without_fp32_keeps_one_variant_for_a_layer_between_int8_activations():
    """int8 in, int8 out: one variant, fp32 where the tactic has it, else its first precision the build allows
    (the Gluon int8 product runs fp16 / bf16 variants only; with none of them its candidates vanished from BERT's
    feed-forward layers); none where the build allows none of its precisions."""

    weight = Value("w", DType.INT8, (64, 64), const=torch.zeros(64, 64, dtype=torch.int8))
    scales = Value("s", DType.FLOAT, (64,), const=torch.rand(64))
    x, y = Value("x", DType.INT8, (2, 9, 64)), Value("y", DType.INT8, (2, 9, 64))
    node = Node("QuantizedGemm", [x, weight, None, None, scales], [y], {"x_scale": 0.1}, domain=DOMAIN)
    cpu = torch.device("cpu")
    gluon = tactic_by_key("gluon.gemm-ws-quantized")
    assert [v.precision for v in variants(gluon, node, ["fp32", "fp16", "bf16", "int8"], cpu)] == ["fp16"]
    assert [v.precision for v in variants(gluon, node, ["bf16", "int8"], cpu)] == ["bf16"]
    assert variants(gluon, node, ["fp32", "int8"], cpu) == []
    fallback = tactic_by_key("reference.registry")
    assert [v.precision for v in variants(fallback, node, ["fp32", "fp16", "int8"], cpu)] == ["fp32"]


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "free"),
    [
        ((2, 512, 1, 1), (2, 1280, 1, 1), True),
        ((1, 64, 7, 7), (1, 64, 1, 1), False),
        ((1, 8, "h", 1), (1, 8, 1, 1), False),
    ],
)
def test_layout_free_when_every_activation_has_a_one_by_one_map(x_shape, y_shape, free):
    """NCHW and NHWC are the same memory for (N, C, 1, 1); a map of unknown size is not assumed to be 1×1."""
    weight = Value("w", DType.FLOAT, (y_shape[1], x_shape[1], 1, 1), const=torch.zeros(y_shape[1], x_shape[1], 1, 1))
    x, y = Value("x", DType.FLOAT, x_shape), Value("y", DType.FLOAT, y_shape)
    assert layout_free(Node("FusedConv", [x, weight], [y], {}, domain=DOMAIN)) == free
    nchw = torch.randn(2, 512, 1, 1)
    assert nchw.is_contiguous() and nchw.is_contiguous(memory_format=torch.channels_last)
