"""`gemm` with a "TMA" configuration: one 2-D product (every batch folded into M) with alpha 1 and a bias row
runs `conv_tma.gemm_rows` (operands through tensor descriptors); anything else the pointer kernel with the same
tiles. Against the float64 reference of `test_triton_gemm`, under the interpreter on tiny shapes, compiled
through the conv tests' sm_90 check (same kernel), on the GPU with BERT-base's linear layers. Every case checks
which kernel ran."""

import pytest
import torch

from tensorforge.ir import DType, Node, Value
from tensorforge.kernels.triton import conv_tma
from tensorforge.kernels.triton.gemm import gemm, gemm_configs, gemm_tma_configs
from tensorforge.ops.fused import DOMAIN
from tensorforge.tactics.triton_gemm import TritonGemmTmaTactic
from tests.helpers import DEVICES, record_returns
from tests.kernels.test_triton_gemm import BOUND, TINY, _error, _reference

TINY_TMA = {**TINY, "TMA": True}


@pytest.fixture
def launches(monkeypatch) -> list[str | None]:
    """What each `conv_tma.gemm_rows` call returned: None where the TMA kernel ran, else why not."""
    return record_returns(monkeypatch, conv_tma, "gemm_rows")


def _case(device, dtype, a_shape, b_shape, c_shape, z_shape, *, trans_b=False, alpha=1.0, config=TINY_TMA):
    a = torch.randn(a_shape, device=device).to(dtype)
    b = torch.randn(b_shape, device=device).to(dtype)
    c = None if c_shape is None else torch.randn(c_shape, device=device).to(dtype)
    z = None if z_shape is None else torch.randn(z_shape, device=device).to(dtype)
    want = _reference(a, b, c, z, alpha, 1.0, False, trans_b, "LeakyRelu", "Tanh")
    poisoned = torch.full(want.shape, float("nan"), dtype=dtype, device=device)
    got = gemm(
        a, b, c, z, alpha=alpha, trans_b=trans_b, pre="LeakyRelu", pre_params=[0.1], post="Tanh", out=poisoned,
        config=config,
    )  # fmt: skip
    assert got is poisoned and not got.isnan().any()
    assert _error(got, want) <= BOUND[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("trans_b", [False, True], ids=["weight-KN", "weight-NK"])
def test_a_linear_layer_runs_on_descriptors(device, dtype, trans_b, launches):
    """Batch dims folded into 2·19 rows, 40 = 2.5 K tiles, 24 columns: ragged everywhere; a bias row and a
    residual; the weight stored [K, N] or (Gemm's transB) [N, K], read K-major."""
    torch.manual_seed(1)
    b_shape = (24, 40) if trans_b else (40, 24)
    _case(device, dtype, (2, 19, 40), b_shape, (24,), (2, 19, 24), trans_b=trans_b)
    assert launches == [None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("persistent", [1, 3])
def test_a_persistent_walk_covers_every_tile(device, persistent, launches):
    """PERSISTENT programs per multiprocessor walk the 3 × 2 ragged tiles (the interpreter counts one
    multiprocessor: 1 program walks all 6, 3 programs 2 each)."""
    torch.manual_seed(5)
    _case(device, torch.float16, (2, 19, 40), (24, 40), (24,), (2, 19, 24), trans_b=True,
          config={**TINY_TMA, "PERSISTENT": persistent})  # fmt: skip
    assert launches == [None]


@pytest.mark.parametrize("device", DEVICES)
def test_without_bias_or_residual(device, launches):
    torch.manual_seed(2)
    _case(device, torch.float16, (33, 16), (16, 8), None, None)
    assert launches == [None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("a_shape", "b_shape", "c_shape", "alpha", "why"),
    [
        ((2, 5, 16), (2, 16, 8), (8,), 1.0, "batched weights do not fold"),
        ((19, 16), (16, 8), (19, 8), 1.0, "a full C"),
        ((19, 16), (16, 8), (8,), 0.5, "alpha"),
        ((19, 12), (12, 8), (8,), 1.0, "24-byte rows"),
    ],
)
def test_other_products_take_the_pointer_kernel(device, a_shape, b_shape, c_shape, alpha, why, launches):
    torch.manual_seed(3)
    _case(device, torch.float16, a_shape, b_shape, c_shape, None, alpha=alpha)
    if why == "24-byte rows":
        assert len(launches) == 1 and "16-byte" in launches[0]
    else:
        assert launches == [], why


def test_the_tma_gemm_tactic_times_its_own_configs():
    assert len(gemm_tma_configs(0)) == 3 and len(gemm_tma_configs(1)) == 6 and len(gemm_tma_configs(2)) == 6
    assert [c["PERSISTENT"] for c in gemm_tma_configs(1)] == [0, 0, 1, 0, 0, 2]
    assert not any(c.get("TMA") for c in gemm_configs(2))
    assert all(c["BLOCK_K"] == 128 for c in gemm_tma_configs(1, quantized=True))
    assert TritonGemmTmaTactic().space(1) == gemm_tma_configs(1) and TritonGemmTmaTactic().key == "triton.gemm-tma"
    x = Value("x", DType.FLOAT16, (8, 128, 768))
    linear = Node("FusedGemm", [x, Value("w", DType.FLOAT16, (768, 768), const=True)], [Value("y")], {}, domain=DOMAIN)
    assert "needs CUDA" in TritonGemmTmaTactic().supports(linear, 1, torch.device("cpu"))


# BERT-base's linear layers at batch 8, sequence 128: (rows, K, N)
LINEAR_SHAPES = {"qkv": (1024, 768, 2304), "ffn-up": (1024, 768, 3072), "ffn-down": (1024, 3072, 768)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer", sorted(LINEAR_SHAPES))
def test_bert_linear_layers_every_tma_config_on_the_gpu(dtype, layer, launches):
    torch.manual_seed(4)
    m, k, n = LINEAR_SHAPES[layer]
    for config in gemm_tma_configs(1):
        _case("cuda", dtype, (m, k), (n, k), (n,), (m, n), trans_b=True, config=config)
    assert launches == [None] * len(gemm_tma_configs(1))
