"""Per-layer sensitivity and the greedy mixed-precision search."""

import numpy as np
import pytest

from tensorforge.errors import InputError
from tensorforge.quant.calibration import TensorRange, calibrate
from tensorforge.quant.sensitivity import Target, agreement, layer_sensitivity, mixed_precision
from tests.quant.support import random_batches, small_conv_model


@pytest.fixture(scope="module")
def setup():
    """A table whose range for `r1` (conv2's input) is far too small: conv2 becomes the sensitive layer."""
    model = small_conv_model()
    batches = random_batches(3, batch=4)
    table = calibrate(model, batches, "minmax")
    table.ranges["r1"] = TensorRange(0.05, 0.05 / 127)
    return model, table, batches


def test_agreement_measures():
    a = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 1.0]])
    perfect = agreement([a], [a * 3])
    assert perfect.cosine == pytest.approx(1.0) and perfect.top1 == 1.0
    flipped = agreement([a], [np.array([[0.0, 1.0, 0.0], [0.0, 2.0, 1.0]])])
    assert flipped.cosine == pytest.approx(0.5) and flipped.top1 == 0.5
    assert agreement([np.zeros((1, 3))], [np.zeros((1, 3))]).cosine == 1.0


def test_each_layer_is_measured_alone(setup):
    model, table, batches = setup
    found = layer_sensitivity(model, table, batches)
    assert [s.layer for s in found] == ["conv1", "conv2", "fc", "head"]
    assert [s.op_type for s in found] == ["Conv", "Conv", "Gemm", "MatMul"]
    worst = min(found, key=lambda s: s.agreement.cosine)
    assert worst.layer == "conv2" and worst.agreement.cosine < 0.9
    for item in found:
        if item.layer != "conv2":  # any other layer alone costs a little, not nothing
            assert 0.99 < item.agreement.cosine < 1.0 - 1e-9, item.layer


def test_search_returns_the_most_sensitive_layer_first(setup):
    model, table, batches = setup
    result = mixed_precision(model, table, batches, Target("cosine", 0.99))
    assert result.met and result.keep_float[0] == "conv2"
    assert result.all_quantized.cosine < 0.99 <= result.achieved.cosine
    assert set(result.reasons) == set(result.keep_float) and "rank 1 of 4" in result.reasons["conv2"]
    assert result.layers == 4


def test_easy_target_keeps_everything_quantized_and_strict_top1_is_reachable(setup):
    model, table, batches = setup
    sensitivities = layer_sensitivity(model, table, batches)
    easy = mixed_precision(model, table, batches, Target("cosine", 0.1), sensitivities=sensitivities)
    assert easy.met and easy.keep_float == [] and easy.achieved == easy.all_quantized
    strict = mixed_precision(model, table, batches, Target("top1", 1.0), sensitivities=sensitivities)
    assert strict.met and strict.achieved.top1 == 1.0


def test_bad_targets_and_outputs(setup):
    model, table, batches = setup
    with pytest.raises(InputError, match="unknown target metric 'accuracy'"):
        Target("accuracy", 0.9)
    with pytest.raises(InputError, match=r"target cosine must be in \[0, 1\]"):
        Target("cosine", 1.5)
    with pytest.raises(InputError, match="unknown output 'z'"):
        layer_sensitivity(model, table, batches, output="z")
    with pytest.raises(InputError, match="the evaluation set is empty"):
        layer_sensitivity(model, table, [])
    with pytest.raises(InputError, match="another model"):
        layer_sensitivity(small_conv_model(seed=9), table, batches)
