"""The engine file: a JSON header and the weights, checksummed, and never pickled.

Layout (integers little-endian)::

    b"TFENGINE"       8-byte magic
    u32               format version (ENGINE_FORMAT_VERSION)
    u64               header length H
    u64               weights length W
    H bytes           header: UTF-8 JSON object, with the build Environment under "environment"
    W bytes           weights: one safetensors blob
    32 bytes          sha256 of everything before it

The weights length is in the preamble so that a truncated file says exactly how many bytes are missing.
Loading parses only JSON and safetensors, so an engine from an untrusted source cannot run code; the
checksum catches damage, it does not authenticate the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from ..errors import TensorforgeError
from .environment import ENGINE_FORMAT_VERSION, Environment, compatibility_problems

MAGIC = b"TFENGINE"
_PREAMBLE = struct.Struct("<8sIQQ")
_DIGEST_SIZE = hashlib.sha256().digest_size
_REBUILD = "rebuild the engine with `tensorforge build` on this machine"


class EngineFileError(TensorforgeError):
    """The engine file is missing, not an engine file, of another format version, truncated, corrupt,
    built for another device or software stack, or would overwrite an existing file."""


def save_engine_file(
    path: str | os.PathLike[str],
    header: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    *,
    overwrite: bool = False,
) -> None:
    """Write an engine file atomically (a temporary file beside `path`, then a rename).

    `header` must hold the build `Environment` under "environment"; everything else in it must be JSON
    (tuples come back as lists). `tensors` are stored contiguous, from the CPU, bit for bit.
    """
    path = Path(path)
    if path.is_dir():
        raise EngineFileError(f"cannot write the engine to {str(path)!r}: it is a directory")
    if path.exists() and not overwrite:
        raise EngineFileError(f"refusing to overwrite {str(path)!r}: pass overwrite=True to replace it")
    header_bytes = _encode_header(header, path)
    weights = safetensors.torch.save(_prepare_tensors(tensors, path))
    preamble = _PREAMBLE.pack(MAGIC, ENGINE_FORMAT_VERSION, len(header_bytes), len(weights))
    digest = hashlib.sha256()
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            for part in (preamble, header_bytes, weights):
                digest.update(part)
                file.write(part)
            file.write(digest.digest())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def load_engine_file(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device,
    check_environment: bool = True,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read an engine file: its header (with "environment" as an `Environment`) and its tensors on `device`.

    With `check_environment`, an engine built for another device or software stack is refused with every
    difference listed; turn it off only to inspect a file, not to run it.
    """
    path = Path(path)
    data = _read(path)
    where = repr(str(path))
    header_length, weights_length = _check_layout(data, where)
    header_end = _PREAMBLE.size + header_length
    header = _decode_header(data[_PREAMBLE.size : header_end], where)
    if check_environment:
        check_runs_here(header["environment"], device, where)
    try:
        tensors = safetensors.torch.load(data[header_end : header_end + weights_length])
    except Exception as err:  # safetensors raises its own SafetensorError, and others for odd dtypes
        raise EngineFileError(f"the weights of {where} do not parse as safetensors ({err}); {_REBUILD}") from None
    return header, {name: tensor.to(device) for name, tensor in tensors.items()}


def check_runs_here(built: Environment, device: str | torch.device, where: str) -> None:
    """Refuse an engine built for another device or software stack, listing every difference."""
    problems = compatibility_problems(built, Environment.current(device))
    if problems:
        lines = "".join(f"\n  - {problem}" for problem in problems)
        raise EngineFileError(f"the engine {where} cannot run here:{lines}\n{_REBUILD}")


def _encode_header(header: Mapping[str, Any], path: Path) -> bytes:
    if not isinstance(header, Mapping):
        raise TypeError(f"the engine header for {str(path)!r} must be a dict, got {type(header).__name__}")
    environment = header.get("environment")
    if not isinstance(environment, Environment):
        raise TypeError(
            f"the engine header for {str(path)!r} needs an Environment under 'environment' "
            "(Environment.current(device) of the device the engine is built for)"
        )
    try:
        text = json.dumps({**header, "environment": environment.to_dict()}, ensure_ascii=False)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"the engine header for {str(path)!r} is not JSON ({err}); "
            "keep it to dicts, lists, strings, numbers, booleans and None"
        ) from None
    return text.encode("utf-8")


def _prepare_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors; a tensor sharing storage with an earlier one is copied (safetensors refuses)."""
    prepared = {}
    storages = set()
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise TypeError(f"engine tensor names must be non-empty strings other than '__metadata__', got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"engine tensor {name!r} for {str(path)!r} is a {type(tensor).__name__}, not a Tensor")
        if tensor.layout != torch.strided:
            raise TypeError(f"engine tensor {name!r} is {tensor.layout}; only dense tensors can be stored")
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in storages:
            tensor = tensor.clone()
            storage = tensor.untyped_storage().data_ptr()
        storages.add(storage)
        prepared[name] = tensor
    return prepared


def is_engine_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file that starts with the engine magic bytes (else, e.g., an ONNX model)."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as file:
        return file.read(len(MAGIC)) == MAGIC


def _read(path: Path) -> bytes:
    if not path.exists():
        raise EngineFileError(f"engine file {str(path)!r} does not exist")
    if path.is_dir():
        raise EngineFileError(f"{str(path)!r} is a directory, not an engine file")
    return path.read_bytes()


def _check_layout(data: bytes, where: str) -> tuple[int, int]:
    """Magic, format version, length and checksum; returns (header length, weights length)."""
    if data[: len(MAGIC)] != MAGIC[: len(data)]:
        raise EngineFileError(f"{where} is not a tensorforge engine file (it does not start with {MAGIC!r})")
    if len(data) < _PREAMBLE.size:
        missing = _PREAMBLE.size + _DIGEST_SIZE - len(data)
        raise EngineFileError(
            f"{where} is truncated: it ends inside its {_PREAMBLE.size}-byte preamble, "
            f"at least {missing} bytes are missing; {_REBUILD}"
        )
    _, version, header_length, weights_length = _PREAMBLE.unpack_from(data)
    if version != ENGINE_FORMAT_VERSION:
        age = "newer" if version > ENGINE_FORMAT_VERSION else "older"
        raise EngineFileError(
            f"{where} has engine format version {version} ({age}), this tensorforge reads format version "
            f"{ENGINE_FORMAT_VERSION}; {_REBUILD}"
        )
    expected = _PREAMBLE.size + header_length + weights_length + _DIGEST_SIZE
    if len(data) < expected:
        raise EngineFileError(
            f"{where} is truncated: {expected - len(data)} bytes are missing (it has {len(data)} of the "
            f"{expected} bytes its preamble announces); copy it again or {_REBUILD}"
        )
    if len(data) > expected:
        raise EngineFileError(
            f"{where} is corrupt: {len(data) - expected} unexpected bytes follow its checksum; "
            f"copy it again or {_REBUILD}"
        )
    body = memoryview(data)[:-_DIGEST_SIZE]
    if hashlib.sha256(body).digest() != data[-_DIGEST_SIZE:]:
        raise EngineFileError(
            f"{where} is corrupt: checksum mismatch (damaged on disk or in transfer); copy it again or {_REBUILD}"
        )
    return header_length, weights_length


def _decode_header(raw: bytes, where: str) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise EngineFileError(f"the header of {where} is not UTF-8 JSON ({err}); {_REBUILD}") from None
    if not isinstance(header, dict) or "environment" not in header:
        raise EngineFileError(f"the header of {where} is not a JSON object with an 'environment'; {_REBUILD}")
    try:
        header["environment"] = Environment.from_dict(header["environment"])
    except ValueError as err:
        raise EngineFileError(f"the header of {where} has a malformed environment: {err}; {_REBUILD}") from None
    return header
