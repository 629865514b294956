"""The Gluon tactics: where they decline and why, their tuning space, and on the GPU every candidate passing the
autotuner's check against the reference (float layers and an int8 / E4M3 chain's 1×1 layers)."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ops.fused import QUANT_TYPES
from tensorforge.passes.pipeline import optimize
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.tactics.autotune import autotune, candidate_groups
from tensorforge.tactics.base import tactic_by_key
from tensorforge.tactics.gluon_gemm import conv_problem, gemm_ws_configs
from tests.helpers import make_model, tensor_info
from tests.kernels.gluon_support import recorded_launches
from tests.quant.chain_support import lowered, prenorm_proto, skip_proto

TACTICS = ("gluon.gemm-ws", "gluon.gemm-ws-quantized", "gluon.conv-ws", "gluon.conv-ws-quantized")


def _conv(channels: int, out_channels: int, kernel: int, stride: int, residual: bool):
    """A Conv (+ residual Add) + Relu at 15×15, batch 2, optimized into one FusedConv; its random inputs."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((out_channels, channels, kernel, kernel)) / channels**0.5).astype(np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[kernel // 2] * 4, strides=[stride] * 2)
    nodes, last, inputs = [conv], "c", [tensor_info("x", [2, channels, 15, 15])]
    out_hw = (15 + 2 * (kernel // 2) - kernel) // stride + 1
    if residual:
        inputs.append(tensor_info("r", [2, out_channels, out_hw, out_hw]))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info("y", None)], 17, inits)))
    (node,) = model.graph.nodes
    extra = [torch.randn(2, out_channels, out_hw, out_hw)] if residual else []
    return node, [torch.randn(2, channels, 15, 15), None, None, *extra]


def _linear(activation: str):
    """x[4, 50, 256] @ W[256, 512] + b, then `activation`: one FusedGemm; its random inputs."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array((rng.standard_normal((256, 512)) / 16).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "b"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"])]
    nodes.append(helper.make_node(activation, ["s"], ["y"]))
    model, _ = optimize(
        import_model(make_model(nodes, [tensor_info("x", [4, 50, 256])], [tensor_info("y", None)], 17, inits))
    )
    (node,) = model.graph.nodes
    return node, [torch.randn(4, 50, 256), None, None]


def test_the_gluon_tactics_decline_on_the_cpu():
    node, _ = _conv(64, 128, 1, 1, True)
    for key in TACTICS:
        reason = tactic_by_key(key).supports(node, 17, torch.device("cpu"))
        assert reason == "needs CUDA" or "no Gluon" in reason


def test_the_family_is_among_every_builds_candidates():
    node, _ = _conv(64, 128, 1, 1, True)
    cpu = torch.device("cpu")
    default = {t.key: reason for t, reason, _ in candidate_groups(node, 17, cpu, 0, ("fp32",), None)}
    assert default["gluon.conv-ws"] == "needs CUDA" or "no Gluon" in default["gluon.conv-ws"]


def test_the_convolutions_are_those_of_stride_1_or_2_and_one_group():
    assert conv_problem(_conv(64, 128, 1, 1, True)[0]) is None
    assert conv_problem(_conv(64, 128, 3, 1, False)[0]) is None
    assert conv_problem(_conv(64, 128, 1, 2, False)[0]) is None  # an unpadded strided 1×1: a view of every 2nd pixel
    assert conv_problem(_conv(64, 128, 1, 3, False)[0]) is None
    assert conv_problem(_conv(64, 128, 3, 2, False)[0]) is None  # the input's four phases
    assert "stride 1 or 2" in conv_problem(_conv(64, 128, 3, 3, False)[0])


def test_the_tuning_space_grows_with_effort_and_doubles_8_bit_k_steps():
    assert len(gemm_ws_configs(1)) > len(gemm_ws_configs(0)) > 0
    assert gemm_ws_configs(0)[0] == gemm_ws_configs(1)[0]
    float_steps = [c["block_k"] for c in gemm_ws_configs(1)]
    assert [c["block_k"] for c in gemm_ws_configs(1, quantized=True)] == [2 * k for k in float_steps]


def test_a_layer_of_at_most_64_output_channels_gets_tiles_64_columns_wide():
    """A 128- or 256-column tile over 64 output columns would multiply zeros: each config narrowed, duplicates
    dropped; a wider layer keeps its wide tiles."""
    for name, quantized in (("gluon.conv-ws", False), ("gluon.conv-ws-quantized", True)):
        tactic = tactic_by_key(name)
        narrow = tactic.space_for(_conv(64, 64, 3, 1, residual=False)[0], 0)
        assert narrow and all(c["block_n"] == 64 for c in narrow), narrow
        assert len(narrow) == len({tuple(sorted(c.items())) for c in narrow})
        wide = tactic.space_for(_conv(64, 128, 3, 1, residual=False)[0], 0)
        assert all(c["block_n"] >= 128 for c in wide) and wide[0] == gemm_ws_configs(0, quantized)[0]


def _every_candidate_passes(node, opset: int, inputs, precisions: tuple[str, ...], tactic: str) -> None:
    """Every config of `tactic` for `node` (inputs moved to CUDA) timed and checked by the autotuner, all finite."""
    inputs = [t.cuda() if t is not None else None for t in inputs]
    choice = autotune(node, opset, inputs, "cuda", effort=1, precisions=precisions, families=["gluon"],
                      exhaustive=True)  # fmt: skip
    ours = [c for c in choice.candidates if c.tactic == tactic]
    assert ours, [c.tactic for c in choice.candidates]
    assert all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("kernel", "stride"), [(1, 1), (3, 1), (1, 2), (3, 2)])
def test_every_convolution_candidate_passes_the_autotuners_check(residual, kernel, stride):
    """1×1 (a product of pixel rows), 3×3 (boxes of pixels), a strided 1×1 (boxes over every 2nd pixel), a
    stride-2 3×3 (boxes of the input's phases; 15×15, odd phases a row and a column short)."""
    node, inputs = _conv(64, 128, kernel, stride, residual)
    _every_candidate_passes(node, 17, inputs, ("fp16", "bf16"), "gluon.conv-ws")


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["Relu", "Gelu"])
def test_every_linear_layer_candidate_passes_the_autotuners_check(activation):
    node, inputs = _linear(activation)
    _every_candidate_passes(node, 17, inputs, ("fp16", "bf16"), "gluon.gemm-ws")


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("layer", ["conv3", "conv4"])
def test_a_chains_pointwise_layers_pass_the_autotuners_check(quant, layer):
    """conv3 reads int8 (E4M3), adds a quantized residual and writes quantized; conv4 reads quantized and writes
    float (a chain 64 channels wide, so that the rows suit TMA)."""
    model, _ = chain_quantized(lowered(quant, width=64))
    _check_quantized(next(n for n in model.graph.nodes if n.name == layer), quant, "gluon.conv-ws-quantized")


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("layer", ["conv1", "conv2", "conv4"])
def test_a_chains_3x3_layers_pass_the_autotuners_check(quant, layer):
    """Quantized in and out (conv1), with a quantized residual (conv2), quantized in and float out (conv4)."""
    model, _ = chain_quantized(lowered(quant, proto=skip_proto(width=64)))
    _check_quantized(next(n for n in model.graph.nodes if n.name == layer), quant, "gluon.conv-ws-quantized")


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("layer", ["fc1", "fc2", "fc3", "post-norm fc2", "residual-mlp fc2"])
def test_a_transformers_quantized_linear_layers_pass_the_autotuners_check(quant, layer):
    """fc1 reads its norm's quantized output and writes quantized (its ReLU inside), fc2 reads quantized and adds a
    float residual (its norm's float copy in a post-norm block, a quantized one in a residual MLP), fc3 reads
    quantized and writes float (a block 64 features wide, rows that suit TMA)."""
    residual_mlp = layer.startswith("residual-mlp")
    proto = prenorm_proto(width=64, post_norm=layer.startswith("post-norm"), first_norm=not residual_mlp)
    model, _ = chain_quantized(lowered(quant, proto=proto))
    node = next(n for n in model.graph.nodes if n.name == layer.split()[-1])
    assert node.op_type == "QuantizedGemm" and node.inputs[0].dtype == QUANT_TYPES[quant]
    assert bool(node.attributes.get("z_scale")) is residual_mlp
    _check_quantized(node, quant, "gluon.gemm-ws-quantized")


def _check_quantized(node, quant: str, tactic: str) -> None:
    generator = torch.Generator().manual_seed(0)
    storage = QUANT_TYPES[quant].torch
    inputs = []
    for value in node.inputs:
        if value is None or value.is_const:
            inputs.append(None)
        elif value.dtype == QUANT_TYPES[quant]:
            inputs.append(torch.randn(value.shape, generator=generator).mul(30).clamp(-127, 127).round().to(storage))
        else:
            inputs.append(torch.randn(value.shape, generator=generator).relu())
    _every_candidate_passes(node, 1, inputs, ("fp32", "fp16"), tactic)


def test_the_quantized_tactic_hands_the_kernel_the_layers_scales(monkeypatch):
    """On the CPU, with the launch recorded instead of run: conv3 of a 64-wide int8 chain (int8 in, an int8
    residual, int8 out) reaches the kernel as a product of pixel rows with its per-column scales x_scale · w_scale,
    the residual's z_scale, its ReLU, and the output requantized by 1 / y_scale."""
    launches = recorded_launches(monkeypatch)
    model, _ = chain_quantized(lowered("int8", width=64))
    node = next(n for n in model.graph.nodes if n.name == "conv3")
    tactic = tactic_by_key("gluon.conv-ws-quantized")
    config = {**gemm_ws_configs(0, quantized=True)[0], "precision": "fp16", "layout": "NHWC"}
    kernel = tactic.build(node, 17, torch.device("cpu"), config)
    x = torch.zeros(2, 64, 8, 8, dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    w, w_scale = node.inputs[1].const, node.inputs[4].const
    (y,) = kernel([x, w, None, x.clone(), w_scale])
    ((_, args, options),) = launches.calls
    a = node.attributes
    assert y.dtype == torch.int8 and y.shape == (2, 64, 8, 8)
    assert options["QUANT_Y"] == 1 and options["HAS_RES"] and options["HAS_SCALE"] and options["POST"] == 1
    assert args[4].shape == (64,) and torch.allclose(args[4].double(), w_scale.double() * a["x_scale"])
    assert args[21] == pytest.approx(a["z_scale"]) and args[22] == pytest.approx(1 / a["y_scale"])
    assert options["STRIDE"] == 1


def test_a_layer_with_a_residual_drops_the_configs_whose_rings_do_not_fit_in_shared_memory():
    """A 16-bit residual's tile pair beside a 128 × 256 ring of three stages is 344 KB, more than a block's 227 KB;
    without a residual that ring fits. The kernel would refuse the call; the tactic does not offer it."""
    pytest.importorskip("tensorforge.kernels.gluon.gemm", reason="this Triton has no Gluon for Hopper")
    tactic = tactic_by_key("gluon.conv-ws")
    wide = {"block_m": 128, "block_n": 256}

    def wide_configs(node):
        return [c for c in tactic.space_for(node, 0) if wide.items() <= c.items()]

    assert wide_configs(_conv(64, 256, 1, 1, False)[0])
    assert not wide_configs(_conv(64, 256, 1, 1, True)[0])
    assert len(tactic.space_for(_conv(64, 256, 1, 1, True)[0], 0)) == len(tactic.space(0)) - 1


def test_a_quantized_linear_layer_with_a_float_residual_keeps_the_configs_that_fit():
    """fc2 of a pre-norm block (int8 in, a 16-bit residual and output: the tactic runs 16-bit variants only): the
    128 × 128 rings fit beside the residual's tile pair, the 128 × 256 one does not (a ViT's attention and
    feed-forward outputs, whose every config was once dropped for a float32 estimate)."""
    pytest.importorskip("tensorforge.kernels.gluon.gemm", reason="this Triton has no Gluon for Hopper")
    model, _ = chain_quantized(lowered("int8", proto=prenorm_proto(width=64)))
    fc2 = next(n for n in model.graph.nodes if n.name == "fc2")
    fitting = tactic_by_key("gluon.gemm-ws-quantized").space_for(fc2, 0)
    assert fitting and all(c["block_n"] == 128 for c in fitting)


def test_the_float_fallback_hands_the_gluon_product_its_int8_residual(monkeypatch):
    """On the CPU, the launch recorded: a residual MLP's fc2 run by the float fallback through `gluon.gemm-ws`
    (which adds a quantized residual itself) reaches the kernel with the residual int8 and its z_scale, not
    dequantized by a torch pass first."""
    pytest.importorskip("tensorforge.kernels.gluon.gemm", reason="this Triton has no Gluon for Hopper")
    from tensorforge.tactics import gluon_gemm

    launches = recorded_launches(monkeypatch)
    monkeypatch.setattr(gluon_gemm, "device_problem", lambda device: None)
    model, _ = chain_quantized(lowered("int8", proto=prenorm_proto(width=64, first_norm=False)))
    fc2 = next(n for n in model.graph.nodes if n.name == "fc2")
    assert fc2.attributes["z_scale"] > 0
    kernel = tactic_by_key("fallback.float-gemm").build(
        fc2, 17, torch.device("cpu"), {"inner": "gluon.gemm-ws", "precision": "fp16"}
    )
    x = torch.randn(2, 3, 8, 128, dtype=torch.float16)
    z = torch.ones(2, 3, 8, 64, dtype=torch.int8)
    (y,) = kernel([x, fc2.inputs[1].const, fc2.inputs[2].const.half(), z, fc2.inputs[4].const])
    ((_, args, options),) = launches.calls
    assert options["HAS_RES"] and y.dtype == torch.float16
    assert args[2].base.dtype == torch.int8 and args[21] == pytest.approx(fc2.attributes["z_scale"])


@pytest.mark.parametrize(("layer", "written"), [("fc2", torch.float16), ("fc3", torch.float32)])
def test_a_quantized_linear_layer_writes_its_float_output_in_the_variants_type(monkeypatch, layer, written):
    """Built as the autotuner builds it (the config's variant fp16): fc2 (int8 in, 64 float columns out) has the
    kernel write fp16, as its shared-memory estimate assumed; fc3's 4 columns make 8-byte fp16 rows, which TMA
    cannot store, so the kernel writes float32 and the variant casts."""
    from tensorforge.tactics import gluon_gemm
    from tensorforge.tactics.autotune import build_layer_kernel

    outs = []
    monkeypatch.setattr(gluon_gemm, "gemm_ws", lambda a, b, out, *args, **options: outs.append(out))
    model, _ = chain_quantized(lowered("int8", proto=prenorm_proto(width=64)))
    node = next(n for n in model.graph.nodes if n.name == layer)
    config = {**gemm_ws_configs(0, quantized=True)[0], "precision": "fp16", "layout": "any"}
    kernel = build_layer_kernel(tactic_by_key("gluon.gemm-ws-quantized"), node, 17, torch.device("cpu"), config, {})
    activations = [v for v in node.inputs if v is not None and not v.is_const]
    inputs = [torch.zeros(v.shape, dtype=v.dtype.torch) for v in activations]
    (y,) = kernel(inputs)
    assert outs[0].dtype == written and y.dtype == torch.float16


@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
def test_e4m3_layers_also_time_their_configs_without_the_promotion_of_their_sums(quant):
    """An E4M3 layer's space holds every config twice, promoted and not (the tensor cores' own accumulation, held
    to the same check by the autotuner); an int8 layer's has nothing to promote."""
    pytest.importorskip("tensorforge.kernels.gluon.gemm", reason="this Triton has no Gluon for Hopper")
    from tensorforge.tactics.gluon_gemm import gemm_config

    model, _ = chain_quantized(lowered(quant, proto=prenorm_proto(width=64)))
    fc2 = next(n for n in model.graph.nodes if n.name == "fc2")
    space = tactic_by_key("gluon.gemm-ws-quantized").space_for(fc2, 0)
    promoted = [gemm_config(c).promote for c in space]
    if quant == "int8":
        assert all(promoted) and not any("promote" in c for c in space)
    else:
        assert promoted.count(False) == promoted.count(True) > 0
