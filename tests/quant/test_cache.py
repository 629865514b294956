"""The JSON calibration cache: round trip, the model check, malformed files, writing only where told."""

import json

import pytest

from tensorforge.errors import InputError
from tensorforge.quant.cache import read_cache, write_cache
from tensorforge.quant.calibration import calibrate
from tensorforge.quant.fingerprint import file_fingerprint, model_fingerprint
from tests.helpers import make_model
from tests.quant.support import random_batches, separable_model, small_conv_model


@pytest.fixture(scope="module")
def table():
    return calibrate(small_conv_model(), random_batches(2), "percentile", params={"percentile": 99.9})


def test_round_trip_is_exact_and_readable(table, tmp_path):
    path = write_cache(table, tmp_path / "model.calib.json")
    data = json.loads(path.read_text())
    assert data["format"] == "tensorforge-calibration" and data["version"] == 2
    assert data["method"] == "percentile" and data["params"] == {"percentile": 99.9}
    assert set(data["tensors"]) == set(table.ranges) and set(data["tensors"]["x"]) == {"amax", "scale"}
    loaded = read_cache(path, small_conv_model())
    assert loaded == table
    assert [p.name for p in tmp_path.iterdir()] == ["model.calib.json"]  # no temporary file left behind


def test_channel_ranges_round_trip_and_version_1_caches_still_read(tmp_path):
    model, feeds = separable_model()
    table = calibrate(model, feeds, "minmax")
    assert len(table.channels) == 1
    path = write_cache(table, tmp_path / "separable.json")
    assert read_cache(path, model) == table
    data = json.loads(path.read_text())
    del data["channels"]
    data["version"] = 1
    path.write_text(json.dumps(data))
    assert read_cache(path, model) == table.per_tensor()


def test_a_cache_from_another_model_is_refused(table, tmp_path):
    path = write_cache(table, tmp_path / "a.json")
    other = small_conv_model(seed=7)  # same structure, other weights
    with pytest.raises(InputError, match="was computed for another model .*recalibrate this model"):
        read_cache(path, other)
    with pytest.raises(InputError, match="another model"):
        read_cache(path, fingerprint="sha256:0")
    assert read_cache(path, fingerprint=model_fingerprint(small_conv_model())) == table


def test_fingerprints_see_structure_and_weights(tmp_path):
    base = model_fingerprint(small_conv_model())
    assert base == model_fingerprint(small_conv_model())
    assert base != model_fingerprint(small_conv_model(seed=3))
    assert base != model_fingerprint(small_conv_model(opset=11))
    model = small_conv_model()
    model.graph.nodes[0].attributes["strides"] = [2, 2]
    assert base != model_fingerprint(model)
    path = tmp_path / "m.onnx"
    path.write_bytes(make_model([], [], []).SerializeToString())
    assert file_fingerprint(path).startswith("sha256:") and file_fingerprint(path) == file_fingerprint(path)


def test_writing_replaces_only_the_named_file(table, tmp_path):
    neighbour = tmp_path / "keep.json"
    neighbour.write_text("{}")
    target = tmp_path / "cache.json"
    target.write_text("old")
    write_cache(table, target)
    assert neighbour.read_text() == "{}"
    assert json.loads(target.read_text())["method"] == "percentile"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "keep.json"]


def test_malformed_caches_are_named(table, tmp_path):
    path = tmp_path / "bad.json"
    with pytest.raises(InputError, match="bad.json does not exist"):
        read_cache(path)
    path.write_text("{not json")
    with pytest.raises(InputError, match="bad.json is not readable JSON"):
        read_cache(path)
    path.write_text(json.dumps({"format": "tensorrt"}))
    with pytest.raises(InputError, match="is not a tensorforge calibration cache"):
        read_cache(path)
    good = json.loads(write_cache(table, tmp_path / "good.json").read_text())
    path.write_text(json.dumps({**good, "version": 99}))
    with pytest.raises(InputError, match=r"cache version 99; this tensorforge reads \(1, 2\): recalibrate"):
        read_cache(path)
    del good["tensors"]
    path.write_text(json.dumps(good))
    with pytest.raises(InputError, match="bad.json is malformed .*'tensors'"):
        read_cache(path)
