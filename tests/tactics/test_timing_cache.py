import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import filelock
import numpy as np
import pytest
import torch

from tensorforge.ir.dtypes import DType
from tensorforge.tactics.timing import Timing
from tensorforge.tactics.timing_cache import (
    FORMAT_VERSION,
    TimingCache,
    TimingCacheError,
    code_digest,
    describe,
    device_key,
    signature,
    software_versions,
)

REPO = Path(__file__).resolve().parents[2]
VERSIONS = {"tensorforge": "0.1.0", "torch": "2.11.0", "cuda": "13.0"}
SHAPES = [(1, 64, 56, 56), (64, 64, 3, 3), None]
DTYPES = [DType.FLOAT16, DType.FLOAT16, None]


def conv_attributes():
    return {
        "kernel_shape": [3, 3],
        "pads": (1, 1, 1, 1),
        "alpha": 0.1,
        "activation": "Relu",
        "fused": True,
        "weight": torch.arange(12, dtype=torch.float16).reshape(3, 4),
        "extra": {"b": 2, "a": [1.5, None]},
    }


def conv_key(**changes):
    args = {
        "device_key": "cuda:NVIDIA H200:sm90:132sms",
        "versions": VERSIONS,
        "op_type": "Conv",
        "input_shapes": SHAPES,
        "dtypes": DTYPES,
        "layout": "NHWC",
        "attributes": conv_attributes(),
    }
    args.update(changes)
    return signature(**args)


def timing(median, samples):
    return Timing.from_samples([median] * samples)


# --- signature ---------------------------------------------------------------------------------------------


def test_signature_is_a_sha256_hex_digest_and_stable():
    key = conv_key()
    assert len(key) == 64 and int(key, 16) >= 0
    assert conv_key() == key


def test_signature_is_the_same_in_another_process():
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        from tests.tactics.test_timing_cache import conv_key
        print(conv_key())
        """
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, check=True, env=env, timeout=120
    )
    assert out.stdout.strip() == conv_key()


def test_attribute_order_does_not_matter():
    attributes = conv_attributes()
    reordered = {name: attributes[name] for name in reversed(list(attributes))}
    reordered["extra"] = {"a": [1.5, None], "b": 2}
    assert conv_key(attributes=reordered) == conv_key()


@pytest.mark.parametrize(
    "changes",
    [
        {"device_key": "cuda:NVIDIA H100:sm90:132sms"},
        {"versions": {**VERSIONS, "torch": "2.12.0"}},
        {"op_type": "ConvTranspose"},
        {"input_shapes": [(2, 64, 56, 56), (64, 64, 3, 3), None]},
        {"input_shapes": [(1, 64, 56, 56), (64, 64, 3, 3)], "dtypes": DTYPES[:2]},
        {"input_shapes": [None, (1, 64, 56, 56), (64, 64, 3, 3)], "dtypes": [None, *DTYPES[:2]]},
        {"dtypes": [DType.BFLOAT16, DType.FLOAT16, None]},
        {"layout": "NCHW"},
        {"layout": ["NHWC", "NCHW", "NHWC"]},
        {"layout": None},
        {"attributes": {**conv_attributes(), "alpha": 0.2}},
        {"attributes": {**conv_attributes(), "alpha": math.nextafter(0.1, 1.0)}},  # one ulp away
        {"attributes": {**conv_attributes(), "kernel_shape": [3, 1]}},
        {"attributes": {**conv_attributes(), "fused": 1}},  # bool and int differ
        {"attributes": {**conv_attributes(), "activation": "relu"}},
        {"attributes": {**conv_attributes(), "extra": {"b": 2.0, "a": [1.5, None]}}},  # int and float differ
        {"attributes": {**conv_attributes(), "weight": torch.arange(12, dtype=torch.float32).reshape(3, 4)}},
        {"attributes": {**conv_attributes(), "weight": torch.arange(12, dtype=torch.float16).reshape(4, 3)}},
        {"attributes": {**conv_attributes(), "weight": torch.arange(1, 13, dtype=torch.float16).reshape(3, 4)}},
        {"attributes": {k: v for k, v in conv_attributes().items() if k != "extra"}},
    ],
)
def test_anything_that_differs_changes_the_key(changes):
    assert conv_key(**changes) != conv_key()


def test_floats_are_keyed_exactly():
    def key(value):
        return conv_key(attributes={"epsilon": value})

    assert key(0.0) != key(-0.0)
    assert key(1e-5) != key(math.nextafter(1e-5, 0.0))
    assert key(1.0) != key(1) != key("1.0")
    assert key(np.float64(0.25)) == key(0.25)
    assert key(np.float32(0.1)) == key(float(np.float32(0.1)))
    assert key(float("nan")) == key(float("nan"))


def test_tags_cannot_collide_with_user_dicts():
    assert conv_key(attributes={"x": 0.5}) != conv_key(attributes={"x": {"float": "0.5"}})


def test_torch_dtype_and_dtype_enum_give_the_same_key():
    assert conv_key(dtypes=[torch.float16, torch.float16, None]) == conv_key()


def test_torch_and_numpy_tensors_with_equal_contents_give_the_same_key():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert conv_key(attributes={"w": data}) == conv_key(attributes={"w": torch.from_numpy(data.copy())})
    assert conv_key(attributes={"w": data}) == conv_key(attributes={"w": data.T.copy().T})  # non-contiguous
    big_endian = data.astype(">f4")
    assert conv_key(attributes={"w": big_endian}) == conv_key(attributes={"w": data})
    scalar = np.array(3, dtype=np.int64)
    assert conv_key(attributes={"w": scalar}) != conv_key(attributes={"w": scalar.reshape(1)})


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"input_shapes": [(1, "N", 56, 56), (64, 64, 3, 3), None]}, ValueError, "concrete dims"),
        ({"input_shapes": [(1, None, 56, 56), (64, 64, 3, 3), None]}, ValueError, "concrete dims"),
        ({"input_shapes": [(1, -1, 56, 56), (64, 64, 3, 3), None]}, ValueError, "concrete dims"),
        ({"dtypes": DTYPES[:2]}, ValueError, "3 input shapes but 2 dtypes"),
        ({"dtypes": [DType.FLOAT16, DType.FLOAT16, DType.FLOAT16]}, ValueError, "input 2: an absent input"),
        ({"dtypes": ["float16", DType.FLOAT16, None]}, TypeError, "input 0: dtype must be"),
        ({"attributes": {"graph": object()}}, TypeError, "attribute 'graph' of Conv is a object"),
        ({"attributes": {"pads": {1, 2}}}, TypeError, "attribute 'pads' of Conv is a set"),
        ({"attributes": {"n": {"x": [1, object()]}}}, TypeError, r"attribute 'n' of Conv\['x'\]\[1\]"),
        ({"attributes": {"n": {1: 2}}}, TypeError, "keys are not all strings"),
        ({"attributes": [("pads", 1)]}, TypeError, "must be a mapping"),
        ({"versions": {"torch": 2.11}}, TypeError, "version strings"),
        ({"device_key": ""}, TypeError, "device_key"),
        ({"op_type": ""}, TypeError, "op_type"),
        ({"layout": 4}, TypeError, "layout must be"),
    ],
)
def test_bad_signature_inputs(changes, error, match):
    with pytest.raises(error, match=match):
        conv_key(**changes)


def test_describe():
    assert describe("Conv", SHAPES, DTYPES, "NHWC") == "Conv(f16[1,64,56,56], f16[64,64,3,3], -) NHWC"
    assert describe("Add", [(2,), ()], [torch.float32, DType.INT64]) == "Add(f32[2], i64[])"
    assert describe("Add", [(2,), (2,)], [DType.FLOAT] * 2, ["NCHW", "NHWC"]) == "Add(f32[2], f32[2]) NCHW/NHWC"
    with pytest.raises(ValueError, match="concrete dims"):
        describe("Add", [("N",)], [DType.FLOAT])


def test_device_key_and_versions_describe_this_machine():
    key = device_key("cpu")
    assert key.startswith("cpu:") and key.endswith(f"{torch.get_num_threads()}threads")
    versions = software_versions()
    assert versions["torch"] == torch.__version__
    assert set(versions) == {"tensorforge", "torch", "cuda", "cudnn", "triton", "timing", "code"}
    assert all(isinstance(v, str) and v for v in versions.values())
    assert len(versions["code"]) == 16 and versions["code"] == code_digest()
    with pytest.raises(ValueError, match="'meta'"):
        device_key("meta")


@pytest.mark.gpu
def test_device_key_names_the_gpu():
    props = torch.cuda.get_device_properties(0)
    assert device_key("cuda:0") == f"cuda:{props.name}:sm{props.major}{props.minor}:{props.multi_processor_count}sms"


# --- the cache ---------------------------------------------------------------------------------------------


def filled_cache():
    cache = TimingCache()
    key = conv_key()
    cache.record(key, "cudnn", {"algo": 1}, timing(0.30, 20), description="Conv(f16...)")
    cache.record(key, "cudnn", {"algo": 2}, timing(0.20, 20))
    cache.record(key, "triton", {"block_m": 64, "block_n": 128, "stages": 3}, timing(0.25, 20))
    cache.record(key, "cuda_c", {"tile": 16}, Timing.failed("CompileError: too many registers"))
    other = conv_key(op_type="ConvTranspose")
    cache.record(other, "cudnn", {"algo": 0}, timing(1.5, 10), description="ConvTranspose(...)")
    return cache, key, other


def test_best_is_the_fastest_success():
    cache, key, other = filled_cache()
    assert cache.best(key) == ("cudnn", {"algo": 2}, 0.20)
    assert cache.best(other) == ("cudnn", {"algo": 0}, 1.5)
    assert cache.best("0" * 64) is None
    ranked = cache.measurements(key)
    assert [tactic for tactic, _ in ranked] == ["cudnn", "triton", "cudnn", "cuda_c"]
    assert ranked[-1][1].error == "CompileError: too many registers"


def test_best_returns_a_copy_of_the_config():
    cache, key, _ = filled_cache()
    cache.best(key)[1]["algo"] = 99
    assert cache.best(key)[1] == {"algo": 2}


def test_best_is_none_when_every_candidate_failed():
    cache = TimingCache()
    cache.record("k", "a", {}, Timing.failed("boom"))
    assert cache.best("k") is None
    assert "k" in cache


def test_config_key_is_canonical():
    cache, key, _ = filled_cache()
    found = cache.get(key, "triton", {"stages": 3, "block_n": 128, "block_m": 64})
    assert found is not None and found.median_ms == 0.25 and found.samples == 20
    cache.record("k", "t", {"shape": (1, 2)}, timing(1.0, 1))
    assert cache.get("k", "t", {"shape": [1, 2]}).config == {"shape": [1, 2]}
    assert cache.get(key, "triton", {"stages": 4}) is None
    assert cache.get("absent", "triton", {}) is None


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({1: 2}, "string keys"),
        ([("a", 1)], "string keys"),
        ({"a": object()}, "JSON values"),
        ({"a": float("nan")}, "JSON values"),
    ],
)
def test_bad_config(config, match):
    with pytest.raises(TypeError, match=match):
        TimingCache().record("k", "t", config, timing(1.0, 1))


def test_bad_record_arguments():
    cache = TimingCache()
    with pytest.raises(TypeError, match="key"):
        cache.record("", "t", {}, timing(1.0, 1))
    with pytest.raises(TypeError, match="tactic"):
        cache.record("k", "", {}, timing(1.0, 1))
    with pytest.raises(ValueError, match="non-finite median"):
        cache.record("k", "t", {}, Timing.from_samples([float("inf")]))
    with pytest.raises(KeyError, match="no key 'missing'"):
        cache.description("missing")


def test_round_trip(tmp_path):
    cache, key, other = filled_cache()
    path = tmp_path / "timing.json"
    cache.save(path)
    loaded = TimingCache.load(path)
    assert sorted(loaded.keys()) == sorted([key, other])
    assert loaded.best(key) == cache.best(key)
    assert loaded.description(key) == "Conv(f16...)"
    assert loaded.measurements(key) == cache.measurements(key)
    failed = loaded.get(key, "cuda_c", {"tile": 16})
    assert failed.error == "CompileError: too many registers" and failed.samples == 0
    # human-readable, versioned, standard JSON (no Infinity)
    text = path.read_text()
    data = json.loads(text)
    assert data["format"] == "tensorforge-timing-cache" and data["version"] == FORMAT_VERSION
    assert "Infinity" not in text and "\n  " in text
    assert data["entries"][key]["description"] == "Conv(f16...)"
    assert data["entries"][key]["tactics"]["cudnn"][0]["config"] == {"algo": 1}
    # saving what was loaded writes the same text
    loaded.save(path)
    assert path.read_text() == text


def test_missing_file_is_an_empty_cache(tmp_path):
    assert len(TimingCache.load(tmp_path / "none.json")) == 0


def test_save_creates_folders_and_leaves_no_temporary_files(tmp_path):
    cache, _, _ = filled_cache()
    path = tmp_path / "a" / "b" / "timing.json"
    cache.save(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["timing.json", "timing.json.lock"]


def test_record_keeps_more_samples_then_the_lower_median():
    cache = TimingCache()
    first = cache.record("k", "t", {}, timing(2.0, 10))
    assert cache.record("k", "t", {}, timing(1.0, 5)) == first  # fewer samples: kept the old one
    better = cache.record("k", "t", {}, timing(3.0, 20))  # more samples win even when slower
    assert cache.get("k", "t", {}) == better
    lower = cache.record("k", "t", {}, timing(2.5, 20))  # a tie on samples: the lower median
    assert cache.get("k", "t", {}) == lower
    assert cache.record("k", "t", {}, Timing.failed("flaky")) == lower  # a failure never replaces a success


def test_merge_is_a_union_with_the_rule():
    ours, theirs = TimingCache(), TimingCache()
    ours.record("shared", "cudnn", {"algo": 1}, timing(1.0, 10), description="ours")
    ours.record("shared", "cudnn", {"algo": 2}, timing(2.0, 50))
    ours.record("shared", "cudnn", {"algo": 3}, timing(3.0, 10))
    ours.record("only_ours", "cudnn", {}, timing(1.0, 1))
    theirs.record("shared", "cudnn", {"algo": 1}, timing(4.0, 30), description="theirs")  # more samples
    theirs.record("shared", "cudnn", {"algo": 2}, timing(0.5, 20))  # fewer samples
    theirs.record("shared", "cudnn", {"algo": 3}, timing(2.5, 10))  # same samples, lower median
    theirs.record("shared", "triton", {"bm": 64}, timing(1.2, 10))
    theirs.record("only_theirs", "cudnn", {}, Timing.failed("boom"))
    ours.merge(theirs)
    assert sorted(ours.keys()) == ["only_ours", "only_theirs", "shared"]
    assert ours.get("shared", "cudnn", {"algo": 1}).median_ms == 4.0
    assert ours.get("shared", "cudnn", {"algo": 2}).median_ms == 2.0
    assert ours.get("shared", "cudnn", {"algo": 3}).median_ms == 2.5
    assert ours.get("shared", "triton", {"bm": 64}).median_ms == 1.2
    assert ours.get("only_theirs", "cudnn", {}).error == "boom"
    assert ours.description("shared") == "ours"
    assert ours.best("shared") == ("triton", {"bm": 64}, 1.2)


def test_save_merges_with_the_file(tmp_path):
    path = tmp_path / "timing.json"
    first, second = TimingCache(), TimingCache()
    first.record("a", "t", {}, timing(1.0, 5))
    second.record("b", "t", {}, timing(2.0, 5))
    first.save(path)
    second.save(path)
    assert sorted(TimingCache.load(path).keys()) == ["a", "b"]
    assert sorted(second.keys()) == ["a", "b"]


WRITER = textwrap.dedent(
    """
    import pathlib, sys, time
    sys.path.insert(0, sys.argv[1])
    from tensorforge.tactics.timing import Timing
    from tensorforge.tactics.timing_cache import TimingCache
    path, name, count = pathlib.Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    (path.parent / f"ready-{name}").touch()
    while not (path.parent / "go").exists():
        time.sleep(0.001)
    for i in range(count):
        cache = TimingCache()
        cache.record(f"{name}-{i}", "t", {"i": i}, Timing.from_samples([float(i + 1)]))
        cache.save(path)
    """
)


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.json"
    names, count = ("left", "right"), 40
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(REPO), str(path), name, str(count)]) for name in names
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{name}").exists() for name in names):  # both imported: start together
        assert time.monotonic() < deadline and all(writer.poll() is None for writer in writers)
        time.sleep(0.01)
    (tmp_path / "go").touch()
    for writer in writers:
        assert writer.wait(timeout=300) == 0
    keys = TimingCache.load(path).keys()
    assert sorted(keys) == sorted(f"{name}-{i}" for name in names for i in range(count))


def test_a_held_lock_times_out_with_a_clear_error(tmp_path):
    path = tmp_path / "timing.json"
    TimingCache().save(path)
    holder = filelock.FileLock(f"{path}.lock")
    with holder, pytest.raises(TimingCacheError, match="another build is using the timing cache"):
        TimingCache.load(path, lock_timeout_s=0.1)


CORRUPT = {
    "truncated JSON": ('{"format": "tensorforge-timing-cache", "vers', "not valid JSON"),
    "binary": (b"\xff\xfe\x00garbage", "not UTF-8"),
    "a list": ("[1, 2]", "not a tensorforge timing cache"),
    "another format": ('{"format": "trt-cache", "version": 1, "entries": {}}', "not a tensorforge timing cache"),
    "no entries": ('{"format": "tensorforge-timing-cache", "version": 1}', '"entries" is not an object'),
    "bad entry": (
        '{"format": "tensorforge-timing-cache", "version": 1, "entries": {"k": []}}',
        "entry 'k' is not an object",
    ),
    "bad samples": (
        '{"format": "tensorforge-timing-cache", "version": 1, "entries": {"k": {"description": "", "tactics": '
        '{"t": [{"config": {}, "median_ms": 1.0, "samples": "many", "measured_at": "x"}]}}}}',
        "entry 'k', tactic 't' has a measurement whose \"samples\" is not a count",
    ),
    "negative median": (
        '{"format": "tensorforge-timing-cache", "version": 1, "entries": {"k": {"description": "", "tactics": '
        '{"t": [{"config": {}, "median_ms": -1, "samples": 1, "measured_at": "x"}]}}}}',
        '"median_ms" is not a time',
    ),
    "failure without null median": (
        '{"format": "tensorforge-timing-cache", "version": 1, "entries": {"k": {"description": "", "tactics": '
        '{"t": [{"config": {}, "median_ms": 1.0, "samples": 0, "measured_at": "x", "error": "e"}]}}}}',
        "failed measurement",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_is_reported_and_left_untouched(tmp_path, case):
    content, match = CORRUPT[case]
    path = tmp_path / "timing.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    before = path.read_bytes()
    with pytest.raises(TimingCacheError, match=match) as caught:
        TimingCache.load(path)
    assert str(path) in str(caught.value) and "delete it" in str(caught.value)
    cache, _, _ = filled_cache()
    with pytest.raises(TimingCacheError, match=match):
        cache.save(path)  # never overwrites a file it cannot read
    assert path.read_bytes() == before


def test_other_format_version_says_to_rebuild(tmp_path):
    path = tmp_path / "timing.json"
    path.write_text('{"format": "tensorforge-timing-cache", "version": 99, "entries": {}}')
    with pytest.raises(TimingCacheError, match="format version 99, but this tensorforge reads version 1") as caught:
        TimingCache.load(path)
    assert "delete it" in str(caught.value) and "rebuilds it" in str(caught.value)
    assert path.read_text().startswith('{"format"')


def test_unreadable_path_is_reported(tmp_path):
    (tmp_path / "timing.json").mkdir()
    with pytest.raises(TimingCacheError, match="cannot read the timing cache"):
        TimingCache.load(tmp_path / "timing.json")


def test_signature_of_a_broadcast_view_equals_its_dense_copy():
    view = torch.tensor(1.5).expand(1)
    assert view.stride() == (0,)
    args = ("cpu", {}, "Add", [[1]], [torch.float32], "NCHW")
    assert signature(*args, {"t": view}) == signature(*args, {"t": torch.tensor([1.5])})
