import dataclasses
import hashlib
import json
import pickle
import struct

import pytest
import torch

from tensorforge.errors import TensorforgeError
from tensorforge.runtime.engine_file import MAGIC, EngineFileError, load_engine_file, save_engine_file
from tensorforge.runtime.environment import ENGINE_FORMAT_VERSION, Environment

PREAMBLE = struct.Struct("<8sIQQ")
BIT_EXACT_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
]


def random_bits(shape, dtype, seed):
    """A tensor whose bytes are random: NaN payloads, infinities and subnormals included."""
    generator = torch.Generator().manual_seed(seed)
    count = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (count,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def cpu_header(**extra):
    return {"environment": Environment.current("cpu"), **extra}


@pytest.fixture
def engine(tmp_path):
    """A saved engine: (path, header, tensors)."""
    path = tmp_path / "model.engine"
    header = cpu_header(config={"precision": ["fp16", "bf16"], "workspace": 1 << 30}, layers=[{"tactic": "gemm"}])
    tensors = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    save_engine_file(path, header, tensors)
    return path, header, tensors


def sections(path):
    """Byte offsets of (header start, weights start, checksum start) in a saved file."""
    _, _, header_length, weights_length = PREAMBLE.unpack_from(path.read_bytes())
    return PREAMBLE.size, PREAMBLE.size + header_length, PREAMBLE.size + header_length + weights_length


def rewrite(path, header_bytes=None, weights=None, version=ENGINE_FORMAT_VERSION):
    """Rewrite parts of a saved file and give it a valid checksum, as a crafted file would have."""
    data = path.read_bytes()
    header_start, weights_start, checksum_start = sections(path)
    header_bytes = data[header_start:weights_start] if header_bytes is None else header_bytes
    weights = data[weights_start:checksum_start] if weights is None else weights
    body = PREAMBLE.pack(MAGIC, version, len(header_bytes), len(weights)) + header_bytes + weights
    path.write_bytes(body + hashlib.sha256(body).digest())


def test_round_trip_every_dtype_bit_exact(tmp_path):
    tensors = {
        f"t_{dtype}".replace("torch.", ""): random_bits((4, 5), dtype, seed)
        for seed, dtype in enumerate(BIT_EXACT_DTYPES)
    }
    tensors["flags"] = torch.tensor([True, False, True])
    tensors["empty"] = torch.empty(0, 7, dtype=torch.float16)
    tensors["scalar"] = torch.tensor(2.5, dtype=torch.bfloat16)
    path = tmp_path / "all.engine"
    save_engine_file(path, cpu_header(), tensors)
    header, loaded = load_engine_file(path, device="cpu")
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert same_bits(loaded[name], tensor), name
        assert loaded[name].device.type == "cpu"
    assert loaded["scalar"].shape == ()
    assert loaded["empty"].shape == (0, 7)
    assert header["environment"] == Environment.current("cpu")


def test_header_round_trips_as_json(engine):
    path, header, tensors = engine
    loaded_header, loaded = load_engine_file(path, device="cpu")
    assert loaded_header == header
    assert isinstance(loaded_header["environment"], Environment)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())


def test_unicode_header_and_no_tensors(tmp_path):
    path = tmp_path / "empty.engine"
    save_engine_file(path, cpu_header(note="größe µs ✓", timing=float("inf")), {})
    header, tensors = load_engine_file(path, device=torch.device("cpu"))
    assert header["note"] == "größe µs ✓"
    assert header["timing"] == float("inf")
    assert tensors == {}


def test_non_contiguous_and_shared_tensors_are_stored_as_values(tmp_path):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = {"t": base.t(), "first": base[0], "second": base[1], "whole": base}
    path = tmp_path / "views.engine"
    save_engine_file(path, cpu_header(), tensors)
    _, loaded = load_engine_file(path, device="cpu")
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor), name
        assert loaded[name].is_contiguous()


def test_layout_on_disk(engine):
    path, _, _ = engine
    data = path.read_bytes()
    magic, version, header_length, weights_length = PREAMBLE.unpack_from(data)
    assert magic == b"TFENGINE"
    assert version == ENGINE_FORMAT_VERSION
    assert len(data) == PREAMBLE.size + header_length + weights_length + 32
    assert hashlib.sha256(data[:-32]).digest() == data[-32:]
    header = json.loads(data[PREAMBLE.size : PREAMBLE.size + header_length].decode())
    assert header["environment"]["device_type"] == "cpu"
    assert header["layers"] == [{"tactic": "gemm"}]


def test_save_is_atomic_and_leaves_no_temporary(tmp_path, engine):
    path, _, _ = engine
    before = path.read_bytes()
    with pytest.raises(TypeError, match="not JSON"):
        save_engine_file(path, cpu_header(bad=object()), {}, overwrite=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.engine"]


def test_failed_write_removes_the_temporary(tmp_path, monkeypatch):
    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr("tensorforge.runtime.engine_file.os.fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        save_engine_file(tmp_path / "x.engine", cpu_header(), {"w": torch.ones(2)})
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite(engine):
    path, _, _ = engine
    before = path.read_bytes()
    with pytest.raises(EngineFileError, match="refusing to overwrite .*overwrite=True"):
        save_engine_file(path, cpu_header(), {"w": torch.zeros(1)})
    assert path.read_bytes() == before
    save_engine_file(path, cpu_header(version=2), {"w": torch.zeros(1)}, overwrite=True)
    header, tensors = load_engine_file(path, device="cpu")
    assert header["version"] == 2
    assert list(tensors) == ["w"]


def test_refuses_to_write_over_a_directory(tmp_path):
    with pytest.raises(EngineFileError, match="is a directory"):
        save_engine_file(tmp_path, cpu_header(), {}, overwrite=True)


@pytest.mark.parametrize("where", ["start", "magic", "preamble", "header", "weights", "checksum", "last byte"])
def test_truncated_file_says_how_much_is_missing(engine, where):
    path, _, _ = engine
    data = path.read_bytes()
    header_start, weights_start, checksum_start = sections(path)
    cut = {
        "start": 0,
        "magic": 5,
        "preamble": 15,
        "header": (header_start + weights_start) // 2,
        "weights": (weights_start + checksum_start) // 2,
        "checksum": checksum_start + 10,
        "last byte": len(data) - 1,
    }[where]
    path.write_bytes(data[:cut])
    with pytest.raises(EngineFileError, match="truncated") as caught:
        load_engine_file(path, device="cpu")
    if cut >= PREAMBLE.size:
        assert f"{len(data) - cut} bytes are missing" in str(caught.value)
    else:
        assert "at least" in str(caught.value)


def test_trailing_bytes_are_corruption(engine):
    path, _, _ = engine
    path.write_bytes(path.read_bytes() + b"\0\0\0")
    with pytest.raises(EngineFileError, match="corrupt: 3 unexpected bytes"):
        load_engine_file(path, device="cpu")


@pytest.mark.parametrize("where", ["header", "weights", "checksum"])
def test_flipped_byte_is_a_checksum_mismatch(engine, where):
    path, _, _ = engine
    data = bytearray(path.read_bytes())
    header_start, weights_start, checksum_start = sections(path)
    offset = {"header": header_start + 10, "weights": checksum_start - 100, "checksum": len(data) - 1}[where]
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(EngineFileError, match="corrupt: checksum mismatch"):
        load_engine_file(path, device="cpu")


@pytest.mark.parametrize("content", [b"\x08\x01\x12\x04onnx", b"TFENGINF" + bytes(40), b"TFE-", b"x"])
def test_not_an_engine_file(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(EngineFileError, match="not a tensorforge engine file"):
        load_engine_file(path, device="cpu")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(EngineFileError, match="does not exist"):
        load_engine_file(tmp_path / "nope.engine", device="cpu")
    with pytest.raises(EngineFileError, match="is a directory"):
        load_engine_file(tmp_path, device="cpu")


@pytest.mark.parametrize(
    ("version", "age"), [(ENGINE_FORMAT_VERSION + 1, "newer"), (ENGINE_FORMAT_VERSION - 1, "older")]
)
def test_other_format_version_is_refused(engine, version, age):
    path, _, _ = engine
    rewrite(path, version=version)
    with pytest.raises(EngineFileError, match=f"format version {version} \\({age}\\)") as caught:
        load_engine_file(path, device="cpu")
    assert "tensorforge build" in str(caught.value)


def test_environment_mismatch_lists_every_difference(tmp_path):
    here = Environment.current("cpu")
    built = dataclasses.replace(here, device_name="Other CPU", torch_version="1.0.0")
    path = tmp_path / "elsewhere.engine"
    save_engine_file(path, {"environment": built}, {"w": torch.ones(2)})
    with pytest.raises(EngineFileError) as caught:
        load_engine_file(path, device="cpu")
    message = str(caught.value)
    assert f"built on Other CPU (cpu), this device is {here.device_name} (cpu)" in message
    assert f"built with torch 1.0.0, this machine has torch {here.torch_version}" in message
    assert "rebuild the engine with `tensorforge build` on this machine" in message
    header, tensors = load_engine_file(path, device="cpu", check_environment=False)
    assert header["environment"] == built
    assert torch.equal(tensors["w"], torch.ones(2))


def test_engine_built_for_a_gpu_is_refused_on_the_cpu(tmp_path):
    h200 = dataclasses.replace(
        Environment.current("cpu"), device_type="cuda", device_name="NVIDIA H200", compute_capability=(9, 0)
    )
    path = tmp_path / "gpu.engine"
    save_engine_file(path, {"environment": h200}, {})
    with pytest.raises(EngineFileError, match=r"built on NVIDIA H200 \(sm_90\), this device is"):
        load_engine_file(path, device="cpu")


def test_loading_runs_no_pickle(engine, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("loading an engine must not unpickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr("builtins.eval", forbidden)
    monkeypatch.setattr("builtins.exec", forbidden)
    path, header, tensors = engine
    loaded_header, loaded = load_engine_file(path, device="cpu")
    assert loaded_header == header
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())


@pytest.mark.parametrize(
    ("header_bytes", "message"),
    [
        (b"\xff\xfe not utf-8", "not UTF-8 JSON"),
        (b"{not json", "not UTF-8 JSON"),
        (b"[" * 100000 + b"]" * 100000, "not UTF-8 JSON"),
        (b"[1, 2]", "JSON object with an 'environment'"),
        (b'{"config": {}}', "JSON object with an 'environment'"),
        (b'{"environment": {"device_type": "cpu"}}', "malformed environment: .*missing fields"),
    ],
)
def test_crafted_header_with_valid_checksum_is_refused(engine, header_bytes, message):
    path, _, _ = engine
    rewrite(path, header_bytes=header_bytes)
    with pytest.raises(EngineFileError, match=message):
        load_engine_file(path, device="cpu")


def test_crafted_weights_with_valid_checksum_are_refused(engine):
    path, _, _ = engine
    rewrite(path, weights=b'\x10\x00\x00\x00\x00\x00\x00\x00{"w": 1}        ')
    with pytest.raises(EngineFileError, match="do not parse as safetensors"):
        load_engine_file(path, device="cpu")


def test_engine_file_error_is_a_tensorforge_error():
    assert issubclass(EngineFileError, TensorforgeError)


@pytest.mark.parametrize(
    ("header", "tensors", "message"),
    [
        ({}, {}, "needs an Environment under 'environment'"),
        ({"environment": Environment.current("cpu").to_dict()}, {}, "needs an Environment"),
        ([("environment", None)], {}, "must be a dict"),
        (cpu_header(weights=torch.ones(1)), {}, "not JSON"),
        (cpu_header(), {"w": [1.0, 2.0]}, "'w' .* is a list, not a Tensor"),
        (cpu_header(), {3: torch.ones(1)}, "names must be non-empty strings"),
        (cpu_header(), {"": torch.ones(1)}, "names must be non-empty strings"),
        (cpu_header(), {"__metadata__": torch.ones(1)}, "names must be non-empty strings"),
        (cpu_header(), {"s": torch.eye(2).to_sparse()}, "only dense tensors"),
    ],
)
def test_bad_save_arguments(tmp_path, header, tensors, message):
    path = tmp_path / "bad.engine"
    with pytest.raises(TypeError, match=message):
        save_engine_file(path, header, tensors)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
def test_round_trip_on_cuda(tmp_path):
    tensors = {str(dtype): random_bits((3, 8), dtype, seed).cuda() for seed, dtype in enumerate(BIT_EXACT_DTYPES)}
    path = tmp_path / "gpu.engine"
    save_engine_file(path, {"environment": Environment.current("cuda")}, tensors)
    header, loaded = load_engine_file(path, device="cuda")
    assert header["environment"].device_name == torch.cuda.get_device_name()
    for name, tensor in tensors.items():
        assert loaded[name].is_cuda
        assert same_bits(loaded[name].cpu(), tensor.cpu()), name
    with pytest.raises(EngineFileError, match="this device is"):
        load_engine_file(path, device="cpu")
