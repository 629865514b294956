"""Strided copies and concatenation against torch, under Triton's interpreter (tiny shapes) and on the GPU."""

import pytest
import torch

from tensorforge.kernels.triton.copy import collapse, concat, copy_configs, fit_tile, relayout, strided_copy
from tests.helpers import DEVICES, compile_for_hopper

TINY = {"block_a": 16, "block_b": 16, "num_warps": 1}


def _heads(device, dtype, sides=(5, 3, 2), channels=7, batch=2):
    """A detector's head outputs: channels_last [N, C, S, S] tensors reshaped to [N, C, S·S] (strided views)."""
    maps = [torch.randn(batch, channels, s, s, device=device).to(dtype) for s in sides]
    return [m.contiguous(memory_format=torch.channels_last).reshape(batch, channels, -1) for m in maps]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_concatenates_transposed_views_along_the_last_axis(device, dtype):
    torch.manual_seed(0)
    heads = _heads(device, dtype)
    assert not heads[0].is_contiguous()
    out = torch.full((2, 7, 25 + 9 + 4), float("nan"), device=device, dtype=dtype)
    got = concat(heads, -1, out=out, **TINY)
    assert got is out
    assert torch.equal(got, torch.cat(heads, dim=-1))


@pytest.mark.parametrize("device", DEVICES)
def test_writes_a_channel_slice_of_a_channels_last_buffer_and_nothing_else(device):
    torch.manual_seed(1)
    parts = [torch.randn(2, c, 3, 4, device=device).half() for c in (3, 20)]
    parts[1] = parts[1].contiguous(memory_format=torch.channels_last)
    buffer = torch.full((2, 30, 3, 4), float("nan"), device=device).half()
    buffer = buffer.contiguous(memory_format=torch.channels_last)
    out = buffer[:, 5:28]
    concat(parts, 1, out=out, **TINY)
    assert torch.equal(out, torch.cat(parts, dim=1))
    assert buffer[:, :5].isnan().all() and buffer[:, 28:].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.randn(40, 3, device=d),  # contiguous on both sides: one run, torch's copy
        lambda d: torch.randn(3, 40, device=d).t(),  # a transpose
        lambda d: torch.randn(2, 3, 4, 5, 6, device=d).permute(4, 0, 3, 1, 2),  # five dimensions that stay five
        lambda d: torch.randn(1, 1, 1, device=d),  # one element
        lambda d: torch.randn(4, 6, 9, device=d)[:, ::2, 1:8],  # steps and offsets
    ],
)
def test_copies_any_strides(device, make):
    torch.manual_seed(2)
    src = make(device)
    dst = torch.full(src.shape, float("nan"), device=device).transpose(0, -1).contiguous().transpose(0, -1)
    assert torch.equal(strided_copy(src, dst, **TINY), src)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("source", "target"),
    [
        ((torch.float32, torch.contiguous_format), (torch.float16, torch.channels_last)),  # a network input
        ((torch.float16, torch.channels_last), (torch.float32, torch.contiguous_format)),  # an output back
        ((torch.float16, torch.contiguous_format), (torch.float16, torch.channels_last)),  # layout alone
    ],
)
def test_relayout_matches_torch_bit_for_bit(device, source, target):
    """A Reformat: NCHW ↔ NHWC with a cast in one pass, rounded as torch rounds (to nearest even)."""
    torch.manual_seed(4)
    x = (torch.randn(2, 5, 6, 7, device=device) * 1000).to(source[0]).contiguous(memory_format=source[1])
    got = relayout(x, target[0], target[1], **TINY)
    assert got.dtype == target[0] and got.is_contiguous(memory_format=target[1])
    assert torch.equal(got, x.to(target[0], memory_format=target[1]))


def test_collapse_merges_what_every_side_steps_over_as_one():
    assert collapse((2, 3, 4), (12, 4, 1), (12, 4, 1)) == ([24], [[1], [1]])
    assert collapse((2, 1, 3, 4), (12, 12, 4, 1), (24, 24, 8, 1)) == ([6, 4], [[4, 1], [8, 1]])
    assert collapse((2, 7, 5, 5), (175, 1, 35, 7), (350, 1, 70, 14)) == ([2, 7, 25], [[175, 1, 7], [350, 1, 14]])
    assert collapse((2, 3, 4), (12, 4, 1), (16, 4, 1)) == ([2, 12], [[12, 1], [16, 1]])  # dst rows padded
    assert collapse((1, 1), (1, 1)) == ([], [[]])


def test_tiles_fit_narrow_boxes_keeping_their_size():
    assert fit_tile(64, 64, 144, 6400) == (64, 64)  # the detector's heads: unchanged
    assert fit_tile(64, 64, 3, 50176) == (4, 1024)  # a 3-channel image: 4 rows, not 64 with 61 masked
    assert fit_tile(64, 64, 50176, 3) == (1024, 4)
    assert fit_tile(64, 64, 3, 5) == (4, 8)  # both sides small: no larger than the box
    assert fit_tile(32, 128, 1, 1) == (1, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_a_three_channel_image_to_channels_last(device):
    torch.manual_seed(6)
    x = torch.randn(2, 3, 9, 11, device=device)
    got = relayout(x, torch.float16, torch.channels_last, block_a=16, block_b=16, num_warps=1)
    assert torch.equal(got, x.to(torch.float16, memory_format=torch.channels_last))


def test_bad_arguments_are_named():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="must agree on every dimension but axis 1"):
        concat([x, torch.randn(3, 3)], 1)
    with pytest.raises(ValueError, match="one type and device"):
        concat([x, x.double()], 0)
    with pytest.raises(ValueError, match="no inputs"):
        concat([], 0)
    with pytest.raises(ValueError, match="out of range"):
        concat([x], 2)
    with pytest.raises(ValueError, match="the concatenation"):
        concat([x, x], 0, out=torch.empty(4, 4))
    with pytest.raises(ValueError, match="must agree"):
        strided_copy(x, torch.empty(3, 2))
    with pytest.raises(ValueError, match="unless both are floating point"):
        strided_copy(x, torch.empty(2, 3, dtype=torch.int32))


def test_configs_by_effort():
    assert [len(copy_configs(e)) for e in (0, 1)] == [2, 4]


_COMPILE_FOR_HOPPER = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tensorforge.kernels.triton.copy import _strided_copy as fn
for ones in ({"s1": 1, "d2": 1}, {"s1": 1, "d1": 1}):  # a transpose, then both sides contiguous along one dim
    constants = {"BLOCK_A": 64, "BLOCK_B": 64, **ones}
    signature = {n: "constexpr" if n in constants else "*fp16" if n in ("src", "dst") else "i32" for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in fn.arg_names if n not in constants}
    source = ASTSource(fn, signature, constants, attrs)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    patterns = (r"ld\\.global\\.v4", r"st\\.global\\.v4", r"ld\\.global\\.b16", r"st\\.global\\.b16")
    print(*[len(re.findall(p, ptx)) for p in patterns])
"""


def test_both_sides_move_in_vectors_when_compiled_for_hopper():
    """Through Triton's real compiler for sm_90 (no GPU needed), with the strides of 1 and the multiples of 16
    that Triton's launcher specializes: the tile is loaded along the source's contiguous dimension and stored along
    the destination's in 16-byte vectors, no element-wise access, for a transpose too."""
    for vector_loads, vector_stores, scalar_loads, scalar_stores in compile_for_hopper(_COMPILE_FOR_HOPPER):
        assert int(vector_loads) > 0 and int(vector_stores) > 0
        assert int(scalar_loads) == 0 and int(scalar_stores) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_config_on_the_gpu(dtype):
    """The detector's output concatenation at batch 8 (three head maps of 144 channels, channels_last views)."""
    torch.manual_seed(3)
    heads = _heads("cuda", dtype, sides=(80, 40, 20), channels=144, batch=8)
    want = torch.cat(heads, dim=2)
    for config in copy_configs(1):
        out = torch.full_like(want, float("nan"))
        assert torch.equal(concat(heads, 2, out=out, **config), want), config


@pytest.mark.gpu
@pytest.mark.parametrize("target", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("source", [torch.float32, torch.float16, torch.bfloat16])
def test_relayout_on_the_gpu(source, target):
    """Every float type to every other, NCHW → NHWC and back, against torch bit for bit."""
    torch.manual_seed(5)
    x = (torch.randn(8, 96, 28, 28, device="cuda") * 100).to(source)
    for memory_format, y in (
        (torch.channels_last, x),
        (torch.contiguous_format, x.contiguous(memory_format=torch.channels_last)),
    ):
        for config in copy_configs(1):
            got = relayout(y, target, memory_format, **config)
            assert torch.equal(got, y.to(target, memory_format=memory_format)), config
