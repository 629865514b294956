"""The CUDA C layer norm (one warp a row): every variant compiles with NVRTC (no GPU needed); on the GPU it matches
float64 over row lengths, vector widths, dtypes and with and without bias, and writes every element."""

import pytest
import torch
import torch.nn.functional as F

from tensorforge.kernels.cuda import layer_norm, nvrtc

needs_nvrtc = pytest.mark.skipif(nvrtc.unavailable() is not None, reason=str(nvrtc.unavailable()))
# Normwise relative error against the float64 reference, by storage type (one rounding of the output).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORFORGE_CACHE", str(tmp_path))


@needs_nvrtc
@pytest.mark.parametrize(("storage", "vec", "n"), [(0, 4, 768), (0, 1, 33), (1, 8, 768), (1, 2, 2046), (2, 8, 384)])
@pytest.mark.parametrize("bias", [0, 1])
def test_layer_norm_compiles(storage, vec, n, bias):
    defines = {"DT": storage, "VEC": vec, "N": n, "ITEMS": -(-n // (32 * vec)), "HAS_BIAS": bias}
    assert len(nvrtc.compile_cubin(layer_norm.SOURCE, "layer_norm_rows", defines, "sm_90")) > 1000


def test_configs_grow_with_effort_and_bad_operands_are_refused():
    assert layer_norm.layer_norm_configs(0) == [{"warps": 4}, {"warps": 8}]
    assert len(layer_norm.layer_norm_configs(2)) == 5
    x, scale = torch.randn(4, 8), torch.ones(8)
    with pytest.raises(ValueError, match="contiguous rows of 8"):
        layer_norm.layer_norm_rows(x.t(), scale)
    with pytest.raises(ValueError, match="float32 vectors"):
        layer_norm.layer_norm_rows(x, scale.half())
    with pytest.raises(ValueError, match="at most 2048"):
        layer_norm.layer_norm_rows(torch.randn(2, 4096), torch.ones(4096))


def _reference(x, scale, bias, epsilon):
    return F.layer_norm(x.double(), scale.shape, scale.double(), None if bias is None else bias.double(), epsilon)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 128, 768), (7, 384), (5, 3, 96), (9, 33), (3, 2048), (2, 1000)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("warps", [1, 4, 8])
def test_layer_norm_matches_float64(dtype, shape, bias, warps):
    torch.manual_seed(0)
    n = shape[-1]
    x = (torch.randn(shape, device="cuda") * 3 + 2).to(dtype)  # a mean far from 0: the variance of x − mean
    scale = torch.randn(n, device="cuda") * 0.2 + 1
    offset = torch.randn(n, device="cuda") * 0.2 if bias else None
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    y = layer_norm.layer_norm_rows(x, scale, offset, epsilon=1e-5, config={"warps": warps}, out=out)
    want = _reference(x, scale, offset, 1e-5)
    assert y is out and not torch.isnan(y).any()
    assert ((y.double() - want).abs().max() / want.abs().max()).item() <= TOLERANCE[dtype]


@pytest.mark.gpu
def test_a_misaligned_view_takes_narrower_vectors():
    base = torch.randn(4 * 768 + 1, device="cuda", dtype=torch.float16)
    x = base[1:].view(4, 768)  # 2 bytes off a 16-byte boundary: one element a load
    assert layer_norm.vector_width(768, x) == 1
    scale = torch.ones(768, device="cuda")
    want = _reference(x, scale, None, 1e-5)
    y = layer_norm.layer_norm_rows(x, scale)
    assert ((y.double() - want).abs().max() / want.abs().max()).item() <= TOLERANCE[torch.float16]
