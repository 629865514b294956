"""CUDA engines of the squeeze-and-excitation nets: their blocks are SqueezeExcite layers, run by a Triton or
vendor kernel chosen by measured time, and the engine computes what the model does."""

import math

import pytest

from tensorforge import Executor, zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tests.helpers import relative_error

FP16_BOUND = 2e-2  # a whole network with fp16 layers against the float32 executor (as the ResNet-50 fp16 test)
BLOCKS = {"efficientnet_b0": 16, "mobilenetv3": 8}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BLOCKS))
def test_cuda_fp16_engines_run_their_blocks_as_squeeze_excite_layers(name):
    model = import_model(zoo.export(name, batch=1, size=224, dynamic_batch=False))
    engine = build_engine(model, BuildConfig(device="cuda", effort=0, precisions=("fp32", "fp16")))
    nodes = engine.model.graph.nodes
    layers = [layer for layer in engine.plans[0].layers if nodes[layer.node].op_type == "SqueezeExcite"]
    assert len(layers) == BLOCKS[name]
    for layer in layers:
        label = nodes[layer.node].name
        print(f"{label}: {layer.tactic} {layer.config} {layer.median_ms:.4f} ms")
        assert layer.tactic in ("triton.squeeze-excite", "vendor.torch-squeeze-excite"), label
        timed = [c for c in layer.candidates if c.tactic == "triton.squeeze-excite"]
        assert any(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    x = zoo.example_inputs(name, 1, 224, seed=4)["input"]
    got = engine.create_context().run({"input": x})["output"]
    want = Executor(model).run({"input": x})["output"]
    assert relative_error(got.cpu().numpy(), want.numpy()) <= FP16_BOUND
