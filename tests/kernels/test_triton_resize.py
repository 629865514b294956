"""The nearest upsampling kernel against torch's, under Triton's interpreter (tiny shapes) and on the GPU."""

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.triton.resize import upsample_configs, upsample_nearest
from tests.helpers import DEVICES

TINY = {"block_p": 16, "block_c": 16, "num_warps": 1}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("factors", [(2, 2), (3, 1), (1, 4)])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_matches_torch_nearest(device, factors, layout):
    torch.manual_seed(0)
    x = torch.randn(2, 20, 5, 3, device=device)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    want = F.interpolate(x, scale_factor=factors, mode="nearest")
    got = upsample_nearest(x, factors, **TINY)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_writes_a_channel_slice_and_nothing_else(device):
    torch.manual_seed(1)
    x = torch.randn(2, 6, 4, 4, device=device).half().contiguous(memory_format=torch.channels_last)
    buffer = torch.full((2, 16, 8, 8), float("nan"), device=device).half().contiguous(memory_format=torch.channels_last)
    out = buffer[:, 3:9]
    got = upsample_nearest(x, (2, 2), out=out, **TINY)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, F.interpolate(x, scale_factor=2, mode="nearest"))
    assert buffer[:, :3].isnan().all() and buffer[:, 9:].isnan().all()


def test_bad_arguments_are_named():
    x = torch.randn(1, 2, 3, 3)
    with pytest.raises(ValueError, match="4-D float"):
        upsample_nearest(torch.randn(2, 3), (2, 2))
    with pytest.raises(ValueError, match="two integers >= 1"):
        upsample_nearest(x, (2, 0))
    with pytest.raises(ValueError, match="needs"):
        upsample_nearest(x, (2, 2), out=torch.empty(1, 2, 3, 3))


def test_configs_by_effort():
    assert [len(upsample_configs(e)) for e in (0, 1)] == [2, 4]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_config_on_the_gpu(dtype):
    torch.manual_seed(2)
    x = torch.randn(8, 128, 40, 40, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    want = F.interpolate(x, scale_factor=2, mode="nearest")
    for config in upsample_configs(1):
        assert torch.equal(upsample_nearest(x, (2, 2), **config), want), config
