"""Calibration over the reference executor, calibration data files, and every bad-input error."""

import numpy as np
import pytest
import torch

from tensorforge import Executor
from tensorforge.errors import InputError
from tensorforge.quant.calibration import (
    _observing,
    calibrate,
    collect_histograms,
    load_calibration_data,
    observed_tensors,
    table_from_histograms,
)
from tensorforge.quant.fingerprint import model_fingerprint
from tests.helpers import DEVICES
from tests.quant.support import random_batches, small_conv_model


def test_observes_layer_inputs_then_outputs():
    model = small_conv_model()
    assert [v.name for v in observed_tensors(model)] == ["x", "r1", "f", "g", "c1", "c2", "y"]


@pytest.mark.parametrize("device", DEVICES)
def test_minmax_table_holds_each_tensors_largest_magnitude(device):
    model = small_conv_model()
    batches = random_batches(3)
    table = calibrate(model, batches, "minmax", device=device)
    observing = Executor(_observing(model, list(table.ranges)), "cpu")  # the intermediate tensors as outputs
    expected: dict[str, float] = {}
    for feed in batches:
        for name, tensor in observing.run(feed).items():
            expected[name] = max(expected.get(name, 0.0), float(tensor.abs().max()))
    for name, entry in table.ranges.items():
        assert entry.amax == pytest.approx(expected[name], rel=1e-6), name
        assert entry.scale == pytest.approx(expected[name] / 127, rel=1e-6), name
    assert table.method == "minmax" and table.batches == 3
    assert table.fingerprint == model_fingerprint(model)


def test_one_pass_serves_every_method():
    model = small_conv_model()
    stats = collect_histograms(model, random_batches(4))
    assert stats.batches == 4 and stats.samples == 8
    minmax = table_from_histograms(stats, "minmax")
    for method, params in (("entropy", None), ("percentile", {"percentile": 99.0}), ("mse", None)):
        table = table_from_histograms(stats, method, params)
        assert table.params == (params or {})
        for name, entry in table.ranges.items():
            assert 0 < entry.amax <= minmax.ranges[name].amax, (method, name)


def test_calibration_accepts_torch_tensors_and_a_generator():
    model = small_conv_model()
    batches = random_batches(2)
    table = calibrate(model, ({"x": torch.from_numpy(b["x"])} for b in batches), "minmax")
    assert table.ranges["x"].amax == pytest.approx(max(float(np.abs(b["x"]).max()) for b in batches))


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ({"x": np.ones((2, 3, 9, 8), np.float32)}, r"calibration batch 1: bad inputs:\n  input .x. has size 9 on"),
        ({"x": np.ones((2, 3, 8, 8), np.float64)}, "input 'x' has dtype f64, the model expects f32"),
        ({"image": np.ones((2, 3, 8, 8), np.float32)}, "unknown input 'image'"),
        ({"x": np.full((2, 3, 8, 8), np.nan, np.float32)}, "calibration batch 1: input 'x' holds 384 NaN or Inf"),
        ({"x": np.full((1, 3, 8, 8), np.inf, np.float32)}, "holds 192 NaN or Inf"),
    ],
)
def test_bad_batches_are_named(feed, message):
    with pytest.raises(InputError, match=message):
        calibrate(small_conv_model(), [random_batches(1)[0], feed], "minmax")


def test_empty_calibration_set_and_unknown_method():
    with pytest.raises(InputError, match="the calibration set is empty"):
        calibrate(small_conv_model(), [], "minmax")
    with pytest.raises(InputError, match="unknown calibration method 'max'"):
        calibrate(small_conv_model(), random_batches(1), "max")


def test_overflowing_activation_is_named():
    model = small_conv_model()
    huge = {"x": np.full((1, 3, 8, 8), 3e38, np.float32)}
    with pytest.raises(InputError, match=r"calibration batch 0: tensor '(c1|r1|c2)': the tensor holds NaN or Inf"):
        calibrate(model, [huge], "minmax")


def test_load_from_a_directory_of_npy_and_npz_files(tmp_path):
    batches = random_batches(3)
    np.save(tmp_path / "b0.npy", batches[0]["x"])
    np.savez(tmp_path / "b1.npz", x=batches[1]["x"])
    np.save(tmp_path / "b2.npy", batches[2]["x"])
    (tmp_path / "notes.txt").write_text("ignored")
    loaded = load_calibration_data(tmp_path, small_conv_model())
    assert len(loaded) == 3
    for got, want in zip(loaded, batches, strict=True):
        np.testing.assert_array_equal(got["x"], want["x"])
    single = load_calibration_data(tmp_path / "b1.npz", small_conv_model())
    np.testing.assert_array_equal(single[0]["x"], batches[1]["x"])


def test_load_errors_name_the_file(tmp_path):
    model = small_conv_model()
    with pytest.raises(InputError, match="holds no .npy or .npz files: the calibration set is empty"):
        load_calibration_data(tmp_path, model)
    with pytest.raises(InputError, match="does not exist"):
        load_calibration_data(tmp_path / "missing.npz", model)
    (tmp_path / "data.csv").write_text("1,2")
    with pytest.raises(InputError, match=r"data.csv is not .npy or .npz"):
        load_calibration_data(tmp_path / "data.csv", model)
    np.save(tmp_path / "small.npy", np.ones((2, 3, 4, 4), np.float32))
    with pytest.raises(InputError, match=r"calibration file .*small.npy: bad inputs:\n  input 'x' has size 4 on"):
        load_calibration_data(tmp_path / "small.npy", model)
    np.savez(tmp_path / "named.npz", image=np.ones((2, 3, 8, 8), np.float32))
    with pytest.raises(InputError, match=r"(?s)named.npz: bad inputs:.*unknown input 'image'.*missing input 'x'"):
        load_calibration_data(tmp_path / "named.npz", model)
    nan = np.ones((1, 3, 8, 8), np.float32)
    nan[0, 0, 0, 0] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    with pytest.raises(InputError, match=r"nan.npy: input 'x' holds 1 NaN or Inf"):
        load_calibration_data(tmp_path / "nan.npy", model)
    (tmp_path / "broken.npy").write_bytes(b"not numpy")
    with pytest.raises(InputError, match="broken.npy cannot be read as .npy"):
        load_calibration_data(tmp_path / "broken.npy", model)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match="objects.npy cannot be read"):
        load_calibration_data(tmp_path / "objects.npy", model)
