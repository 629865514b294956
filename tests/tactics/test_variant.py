"""How a variant converts a layer's activations: precision and layout in one copy, channel slices of
channels_last tensors passed as they are to tactics that read strides, converted for the others."""

import torch

from tensorforge.ir import DType, Node, Value
from tensorforge.tactics.variant import LayerKernel, Variant, convert


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
