"""The zoo's benchmark models (EfficientNet-B0, ConvNeXt-Tiny, ViT-S/16, a YOLOv8n-style detector, BERT-base):
exported with our exporter, imported, run by the Executor (as imported and optimized) and by an engine built on
the CPU (and on CUDA in fp16, where there is one), all against ONNX Runtime. Big models run at reduced depth and
width so the file stays fast."""

import numpy as np
import pytest
import torch

from tensorforge import Executor, zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.frontend import import_model
from tensorforge.ir.clone import clone_model
from tensorforge.passes.pipeline import optimize
from tests.helpers import relative_error, run_onnxruntime

pytest.importorskip("onnxruntime")
REL_TOL = 1e-4  # float32, normwise against ONNX Runtime

# name -> (size, constructor options): small inputs, and fewer/narrower layers where the full model is big.
CASES = {
    "efficientnet_b0": (32, {}),
    "convnext_tiny": (32, {"depths": (1, 1, 2, 1), "dims": (16, 32, 48, 64)}),
    "vit_s16": (32, {"dim": 96, "layers": 2, "heads": 6, "mlp": 384}),
    "yolo": (64, {}),
    "bert_base": (16, {"layers": 2, "hidden": 128, "heads": 4, "intermediate": 512}),
}
BATCH = 2


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request):
    name = request.param
    size, options = CASES[name]
    proto = zoo.export(name, batch=BATCH, size=size, **options)
    feeds = {key: value.numpy() for key, value in zoo.example_inputs(name, BATCH, size, seed=1).items()}
    return name, proto, feeds, run_onnxruntime(proto, feeds)["output"]


def test_executor_matches_onnxruntime(exported):
    name, proto, feeds, expected = exported
    model = import_model(proto)
    got = Executor(model).run(feeds)["output"]
    assert relative_error(got.numpy(), expected) <= REL_TOL, name
    optimized, report = optimize(clone_model(model))
    assert report.nodes_after < report.nodes_before, f"{name}: the optimizer changed nothing"
    got = Executor(optimized).run(feeds)["output"]
    assert relative_error(got.numpy(), expected) <= REL_TOL, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_engine_on_the_cpu_matches_onnxruntime(name):
    size, options = CASES[name]
    proto = zoo.export(name, batch=BATCH, size=size, dynamic_batch=False, **options)
    feeds = {key: value.numpy() for key, value in zoo.example_inputs(name, BATCH, size, seed=2).items()}
    shape = zoo.input_shape(name, BATCH, size)
    profile = Profile()
    for input_name in feeds:
        profile = profile.add(input_name, shape, shape, shape)
    engine = build_engine(import_model(proto), BuildConfig(effort=0, profiles=(profile,)))
    got = engine.create_context().run(feeds)["output"]
    assert relative_error(got.numpy(), run_onnxruntime(proto, feeds)["output"]) <= REL_TOL
    # At fixed shapes every value is static and no shape arithmetic is left to run (on CUDA it would read
    # values back to the host, and the engine could not replay a CUDA graph).
    graph = engine.model.graph
    assert not [node.label for node in graph.nodes if node.op_type == "Shape"], name
    assert all(value.is_static for node in graph.nodes for value in node.outputs if value.name), name


# fp16 engines against float32 ONNX Runtime, normwise over the whole output: the full models' fp16 engines are
# within 3.3e-3 of float64 on the H200 (bench/results/suite-h200); three times that.
FP16_TOL = 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_fp16_engine_on_cuda_matches_onnxruntime(name):
    """The CUDA build of each case (ConvNeXt's layer scales folded and residuals fused into its Linears, the
    transformers' attention, the detector's concatenations) against ONNX Runtime's float32 output."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    size, options = CASES[name]
    proto = zoo.export(name, batch=BATCH, size=size, dynamic_batch=False, **options)
    feeds = {key: value.numpy() for key, value in zoo.example_inputs(name, BATCH, size, seed=2).items()}
    engine = build_engine(import_model(proto), BuildConfig(device="cuda", precisions=("fp32", "fp16"), effort=0))
    got = engine.create_context().run(feeds)["output"].float().cpu().numpy()
    assert relative_error(got, run_onnxruntime(proto, feeds)["output"]) <= FP16_TOL


def test_full_models_have_the_published_sizes():
    """Parameter counts of the published architectures (BERT without its pooler, ViT's table at 224²)."""
    expected_millions = {
        "efficientnet_b0": 5.29,
        "convnext_tiny": 28.59,
        "vit_s16": 22.05,
        "yolo": 3.16,
        "bert_base": 108.89,
    }
    for name, millions in expected_millions.items():
        module = zoo.build(name, size=224)
        assert sum(p.numel() for p in module.parameters()) / 1e6 == pytest.approx(millions, abs=0.01), name


def test_example_inputs():
    images = zoo.example_inputs("efficientnet_b0", batch=3, size=40)
    assert list(images) == ["input"] and images["input"].shape == (3, 3, 40, 40)
    assert images["input"].std() > 0.5
    tokens = zoo.example_inputs("bert_base", batch=8, size=64)
    assert list(tokens) == ["input_ids", "attention_mask"]
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    assert ids.dtype == mask.dtype == torch.int64 and ids.shape == mask.shape == (8, 64)
    assert 0 <= int(ids.min()) and int(ids.max()) < zoo.BertEncoder.vocab and len(ids.unique()) > 400
    assert set(mask.unique().tolist()) <= {0, 1} and mask.float().mean() >= 0.75 and (mask == 0).any()
    # padding only at the end of each sequence
    assert torch.equal(mask, mask.sort(dim=1, descending=True).values)
    same = zoo.example_inputs("bert_base", batch=8, size=64)
    assert torch.equal(same["input_ids"], ids)


def test_bert_padding_is_masked():
    """Changing the ids under the mask's zeros leaves the unpadded positions' outputs unchanged."""
    module = zoo.build("bert_base", **CASES["bert_base"][1])
    inputs = zoo.example_inputs("bert_base", batch=4, size=16, seed=3)
    inputs["attention_mask"][:, 12:] = 0
    other = inputs["input_ids"].clone()
    other[:, 12:] = torch.randint(0, zoo.BertEncoder.vocab, (4, 4))
    with torch.no_grad():
        a = module(inputs["input_ids"], inputs["attention_mask"])
        b = module(other, inputs["attention_mask"])
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-5) and not torch.allclose(a[:, 12:], b[:, 12:])


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="multiple of the patch size 16"):
        zoo.build("vit_s16", size=40)
    with pytest.raises(ValueError, match="unknown zoo model 'resnet51'"):
        zoo.example_inputs("resnet51")
    with pytest.raises(ValueError, match="one width per stage"):
        zoo.build("convnext_tiny", depths=(1, 1), dims=(8, 16, 32))


def test_yolo_heads_cover_three_strides():
    size = 64
    with torch.no_grad():
        out = zoo.build("yolo")(zoo.example_inputs("yolo", 1, size)["input"])
    anchors = sum((size // stride) ** 2 for stride in (8, 16, 32))
    assert out.shape == (1, 64 + 80, anchors) and np.isfinite(out.numpy()).all()
