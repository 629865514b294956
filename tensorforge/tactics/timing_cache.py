"""The timing cache: measured tactic times, keyed by a stable signature of what was timed, kept in a JSON file.

A key is `signature(...)`: the sha256 of a canonical JSON text of the device, the software versions, the op
type, the input shapes and dtypes, the layout and the attributes (never generated names), so the same layer on
the same stack gets the same key in any process, on any day. Each key holds, per tactic, one `Measurement` per
config, and a human-readable description of the key for inspection.

The file is JSON, versioned (`FORMAT_VERSION`), written atomically and read and written under a
`filelock.FileLock` (the file's path + ".lock"), so builds may share one cache: `save` merges with what the
file holds at that moment, and no writer loses another's entries. A corrupt file, or one from another format
version, raises `TimingCacheError` and is left as it is.

One rule decides between two measurements of the same key, tactic and config, in `record`, `merge` and `save`:
the one with more samples wins (it is the better estimate); on equal samples, the lower median wins; on a
full tie the one already held stays. A failed candidate is kept too (0 samples, `inf`, its error), so a
rebuild need not retry it, and loses to any successful measurement.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import enum
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import numpy as np
import torch

from ..errors import TensorforgeError
from ..ir.dtypes import DType
from ..kernels.cpu.avx512 import features as cpu_features
from .timing import METHOD, Timing

FORMAT = "tensorforge-timing-cache"
FORMAT_VERSION = 1

Layout = str | Sequence[str] | None


class TimingCacheError(TensorforgeError):
    """A timing cache file cannot be used: unreadable, corrupt, from another format version, or locked."""


def device_key(device: torch.device | str) -> str:
    """What identifies a device for timing: the GPU model, compute capability and SM count; the CPU model, the
    vector instructions our kernels use on it (one model name can hide two generations: "AMD EPYC" in a VM) and the
    number of threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"cuda:{props.name}:sm{props.major}{props.minor}:{props.multi_processor_count}sms"
    if device.type == "cpu":
        return f"cpu:{_cpu_model()}:{platform.machine()}:{cpu_features()}:{torch.get_num_threads()}threads"
    raise ValueError(f"device_key(): tensorforge times on 'cpu' or 'cuda' devices, not {str(device)!r}")


def software_versions() -> dict[str, str]:
    """The versions a timing depends on: tensorforge, torch, CUDA, cuDNN and Triton ("none" when absent), the
    timing method, and a digest of our kernels' and tactics' code (`code_digest`)."""
    from .. import __version__

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "tensorforge": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "cudnn": str(cudnn) if cudnn else "none",
        "triton": _package_version("triton"),
        "timing": METHOD,
        "code": code_digest(),
    }


@functools.cache
def code_digest() -> str:
    """The sha256 (16 hex digits) of the source of tensorforge's `kernels` and `tactics` packages: a timing measured
    with other kernel code (a change between releases, or a source tree being edited) is not reused."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted([*(root / "kernels").rglob("*.py"), *(root / "tactics").rglob("*.py")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def signature(
    device_key: str,
    versions: Mapping[str, str],
    op_type: str,
    input_shapes: Sequence[Sequence[int] | None],
    dtypes: Sequence[DType | torch.dtype | None],
    layout: Layout,
    attributes: Mapping[str, Any],
) -> str:
    """The cache key of one timed layer: the sha256 hex digest of a canonical JSON text of the arguments.

    Shapes are concrete (timing happens at concrete shapes); an absent optional input is `None` in both
    `input_shapes` and `dtypes`. `layout` is one string, one per input, or None. Attribute values may be
    ints, floats (kept exactly, by repr), strings, bools, None, lists, dicts, enums, numpy scalars and
    tensors (torch or numpy: keyed by dtype, shape and the sha256 of their bytes). Attribute order does not
    matter; the type does (1 and 1.0 differ).
    """
    if not isinstance(device_key, str) or not device_key:
        raise TypeError(f"signature(): device_key must be a non-empty str (see device_key()), not {device_key!r}")
    if not isinstance(versions, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in versions.items()
    ):
        raise TypeError(f"signature(): versions must map names to version strings, not {versions!r}")
    _check_op_type(op_type)
    if not isinstance(attributes, Mapping):
        raise TypeError(f"signature(): attributes of {op_type} must be a mapping, not {type(attributes).__name__}")
    payload = {
        "device": device_key,
        "versions": dict(versions),
        "op": op_type,
        "inputs": [
            None if item is None else {"shape": list(item[0]), "dtype": item[1].name}
            for item in _inputs(op_type, input_shapes, dtypes)
        ],
        "layout": _layout(op_type, layout),
        "attributes": {
            name: _canonical(value, f"attribute {name!r} of {op_type}") for name, value in _named(op_type, attributes)
        },
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def describe(
    op_type: str,
    input_shapes: Sequence[Sequence[int] | None],
    dtypes: Sequence[DType | torch.dtype | None],
    layout: Layout = None,
) -> str:
    """A short human-readable name of a key, e.g. "Conv(f16[1,64,56,56], f16[64,64,3,3], -) NHWC"."""
    _check_op_type(op_type)
    inputs = ", ".join(
        "-" if item is None else f"{item[1]}[{','.join(map(str, item[0]))}]"
        for item in _inputs(op_type, input_shapes, dtypes)
    )
    layout = _layout(op_type, layout)
    suffix = "" if layout is None else " " + (layout if isinstance(layout, str) else "/".join(layout))
    return f"{op_type}({inputs}){suffix}"


@dataclass(frozen=True)
class Measurement:
    """One tactic config's time for one key. A failed candidate: `inf`, 0 samples and the error."""

    config: dict[str, Any]
    median_ms: float
    samples: int
    measured_at: str
    error: str | None = None

    def beats(self, other: Measurement) -> bool:
        """The cache's rule: more samples wins; on equal samples, the lower median."""
        return (self.samples, -self.median_ms) > (other.samples, -other.median_ms)


class _Entry:
    __slots__ = ("description", "tactics")

    def __init__(self, description: str) -> None:
        self.description = description
        self.tactics: dict[str, dict[str, Measurement]] = {}


class TimingCache:
    """Measured times: key → tactic → config → `Measurement`, with a description per key."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        return list(self._entries)

    def description(self, key: str) -> str:
        return self._entry(key).description

    def record(
        self, key: str, tactic: str, config: Mapping[str, Any], timing: Timing, *, description: str = ""
    ) -> Measurement:
        """Store a timing of `tactic` with `config` under `key`, unless the cache holds a better one (see the
        module docstring); return the measurement kept."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"TimingCache.record(): key must be a signature() string, not {key!r}")
        if not isinstance(tactic, str) or not tactic:
            raise TypeError(f"TimingCache.record(): tactic must be a non-empty name, not {tactic!r}")
        if timing.ok and not math.isfinite(timing.median):
            raise ValueError(f"TimingCache.record(): tactic {tactic!r} has a non-finite median but no error")
        config_key = _config_key(tactic, config)
        measurement = Measurement(
            config=json.loads(config_key),
            median_ms=timing.median,
            samples=len(timing.samples),
            measured_at=_now(),
            error=timing.error,
        )
        return self._keep(key, description, tactic, config_key, measurement)

    def get(self, key: str, tactic: str, config: Mapping[str, Any]) -> Measurement | None:
        """The measurement held for this key, tactic and config, or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        return entry.tactics.get(tactic, {}).get(_config_key(tactic, config))

    def measurements(self, key: str) -> list[tuple[str, Measurement]]:
        """Every (tactic, measurement) held for a key, fastest first, failures last."""
        found = [(tactic, m) for tactic, configs in self._entry(key).tactics.items() for m in configs.values()]
        return sorted(found, key=lambda item: (item[1].median_ms, item[0], _config_key(item[0], item[1].config)))

    def best(self, key: str) -> tuple[str, dict[str, Any], float] | None:
        """The fastest (tactic, config, median ms) for a key; None when the key is absent or every candidate
        failed."""
        if key not in self._entries:
            return None
        ranked = self.measurements(key)
        if not ranked or ranked[0][1].error is not None:
            return None
        tactic, measurement = ranked[0]
        return tactic, copy.deepcopy(measurement.config), measurement.median_ms

    def merge(self, other: TimingCache) -> None:
        """Add every measurement of `other` to this cache: a union, deciding clashes by the module's rule."""
        for key, entry in other._entries.items():
            for tactic, configs in entry.tactics.items():
                for config_key, measurement in configs.items():
                    self._keep(key, entry.description, tactic, config_key, measurement)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, lock_timeout_s: float = 60.0) -> TimingCache:
        """Read a cache file under its lock. A missing file is an empty cache (the first build creates it)."""
        path = Path(path)
        if not path.exists():
            return cls()
        with _locked(path, lock_timeout_s):
            return _read(path)

    def save(self, path: str | os.PathLike[str], *, lock_timeout_s: float = 60.0) -> None:
        """Write the cache to `path` atomically, under its lock, merged with what the file holds now; this
        cache then holds the union too."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path, lock_timeout_s):
            if path.exists():
                self.merge(_read(path))
            _write_atomic(path, json.dumps(self._to_json(), indent=2, allow_nan=False) + "\n")

    def _entry(self, key: str) -> _Entry:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"the timing cache holds no key {key!r}") from None

    def _keep(self, key: str, description: str, tactic: str, config_key: str, measurement: Measurement) -> Measurement:
        entry = self._entries.setdefault(key, _Entry(description))
        if not entry.description:
            entry.description = description
        configs = entry.tactics.setdefault(tactic, {})
        held = configs.get(config_key)
        if held is None or measurement.beats(held):
            configs[config_key] = measurement
            return measurement
        return held

    def _to_json(self) -> dict[str, Any]:
        entries = {}
        for key in sorted(self._entries):
            entry = self._entries[key]
            tactics = {
                tactic: [_measurement_json(configs[config_key]) for config_key in sorted(configs)]
                for tactic, configs in sorted(entry.tactics.items())
            }
            entries[key] = {"description": entry.description, "tactics": tactics}
        return {"format": FORMAT, "version": FORMAT_VERSION, "entries": entries}


def _measurement_json(measurement: Measurement) -> dict[str, Any]:
    data: dict[str, Any] = {
        "config": measurement.config,
        "median_ms": measurement.median_ms if measurement.error is None else None,
        "samples": measurement.samples,
        "measured_at": measurement.measured_at,
    }
    if measurement.error is not None:
        data["error"] = measurement.error
    return data


def _read(path: Path) -> TimingCache:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _corrupt(path, "it is not UTF-8 text") from None
    except OSError as exc:
        raise TimingCacheError(f"cannot read the timing cache {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"it is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _corrupt(path, f'it is not a tensorforge timing cache (no "format": "{FORMAT}")')
    if data.get("version") != FORMAT_VERSION:
        raise TimingCacheError(
            f"the timing cache {path} has format version {data.get('version')!r}, but this tensorforge reads "
            f"version {FORMAT_VERSION}; it was left untouched: delete it (or pass another path) and the next "
            "build rebuilds it by timing again"
        )
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise _corrupt(path, '"entries" is not an object')
    cache = TimingCache()
    for key, entry in entries.items():
        for tactic, config_key, measurement in _parse_entry(path, key, entry):
            cache._keep(key, entry["description"], tactic, config_key, measurement)
    return cache


def _parse_entry(path: Path, key: str, entry: Any) -> Iterator[tuple[str, str, Measurement]]:
    where = f"entry {key!r}"
    if not isinstance(entry, dict) or not isinstance(entry.get("description"), str):
        raise _corrupt(path, f'{where} is not an object with a string "description"')
    tactics = entry.get("tactics")
    if not isinstance(tactics, dict):
        raise _corrupt(path, f'{where} has no "tactics" object')
    for tactic, records in tactics.items():
        if not isinstance(records, list):
            raise _corrupt(path, f"{where}, tactic {tactic!r} is not a list of measurements")
        for record in records:
            measurement = _parse_measurement(path, f"{where}, tactic {tactic!r}", record)
            yield tactic, _config_key(tactic, measurement.config), measurement


def _parse_measurement(path: Path, where: str, record: Any) -> Measurement:
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise _corrupt(path, f'{where} has a measurement without a "config" object')
    samples, median, stamp, error = (record.get(name) for name in ("samples", "median_ms", "measured_at", "error"))
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise _corrupt(path, f'{where} has a measurement whose "samples" is not a count')
    if not isinstance(stamp, str):
        raise _corrupt(path, f'{where} has a measurement without a "measured_at" time')
    if error is None:
        if not isinstance(median, (int, float)) or isinstance(median, bool) or not 0 <= median < math.inf:
            raise _corrupt(path, f'{where} has a measurement whose "median_ms" is not a time in ms')
        return Measurement(record["config"], float(median), samples, stamp)
    if not isinstance(error, str) or median is not None:
        raise _corrupt(path, f'{where} has a failed measurement without an "error" string and a null median')
    return Measurement(record["config"], math.inf, samples, stamp, error)


def _corrupt(path: Path, what: str) -> TimingCacheError:
    return TimingCacheError(
        f"the timing cache {path} is corrupt: {what}. It was left untouched: delete it (or pass another path) and "
        "the next build rebuilds it by timing again"
    )


@contextlib.contextmanager
def _locked(path: Path, timeout_s: float) -> Iterator[None]:
    lock = filelock.FileLock(f"{path}.lock", timeout=timeout_s)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise TimingCacheError(
            f"could not lock {lock.lock_file} within {timeout_s} s: another build is using the timing cache "
            f"{path}; wait for it, or pass another cache path"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file next to `path`, then rename it over `path`: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            shutil.copymode(path, tmp)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _config_key(tactic: str, config: Mapping[str, Any]) -> str:
    if not isinstance(config, Mapping) or not all(isinstance(name, str) for name in config):
        raise TypeError(f"the config of tactic {tactic!r} must be a dict with string keys, not {config!r}")
    try:
        return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the config of tactic {tactic!r} must hold only JSON values (numbers, strings, bools, None, lists, "
            f"dicts): {exc}"
        ) from None


def _check_op_type(op_type: object) -> None:
    if not isinstance(op_type, str) or not op_type:
        raise TypeError(f"op_type must be a non-empty str, not {op_type!r}")


def _inputs(
    op_type: str, input_shapes: Sequence[Sequence[int] | None], dtypes: Sequence[DType | torch.dtype | None]
) -> list[tuple[tuple[int, ...], DType] | None]:
    if len(input_shapes) != len(dtypes):
        raise ValueError(f"{op_type}: {len(input_shapes)} input shapes but {len(dtypes)} dtypes; give one per input")
    inputs: list[tuple[tuple[int, ...], DType] | None] = []
    for index, (shape, dtype) in enumerate(zip(input_shapes, dtypes, strict=True)):
        if shape is None and dtype is None:
            inputs.append(None)
            continue
        if shape is None or dtype is None:
            raise ValueError(f"{op_type} input {index}: an absent input has both shape and dtype None")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError(
                f"{op_type} input {index} has shape {tuple(shape)}: timing keys need concrete dims (ints >= 0); "
                "resolve symbolic dims to the profile's shape first"
            )
        inputs.append((tuple(shape), _dtype(op_type, index, dtype)))
    return inputs


def _dtype(op_type: str, index: int, dtype: DType | torch.dtype) -> DType:
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, torch.dtype):
        return DType.from_torch(dtype)
    raise TypeError(f"{op_type} input {index}: dtype must be a DType or a torch.dtype, not {dtype!r}")


def _layout(op_type: str, layout: Layout) -> str | list[str] | None:
    if layout is None or isinstance(layout, str):
        return layout
    if isinstance(layout, Sequence) and all(isinstance(item, str) for item in layout):
        return list(layout)
    raise TypeError(f"{op_type}: layout must be a str, a list of str (one per input) or None, not {layout!r}")


def _named(op_type: str, attributes: Mapping[str, Any]) -> list[tuple[str, Any]]:
    names = list(attributes)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"signature(): attribute names of {op_type} must be strings, not {names!r}")
    return [(name, attributes[name]) for name in names]


def _canonical(value: Any, where: str) -> Any:
    """A JSON value standing for `value`. Tagged forms are one-key dicts; user dicts are tagged too, so a user
    value can never collide with a tag."""
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__name__}.{value.name}"}
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return {"float": repr(float(value))}
    if isinstance(value, np.generic):
        return _canonical(value.item(), where)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return {"tensor": _tensor_digest(value, where)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, Mapping):
        if not all(isinstance(name, str) for name in value):
            raise TypeError(f"signature(): {where} is a dict whose keys are not all strings")
        return {"dict": {name: _canonical(item, f"{where}[{name!r}]") for name, item in value.items()}}
    if isinstance(value, (list, tuple)):
        return [_canonical(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise TypeError(
        f"signature(): {where} is a {type(value).__name__}, which has no stable signature; keys take numbers, "
        "strings, bools, None, lists, dicts, enums and tensors"
    )


def _tensor_digest(value: torch.Tensor | np.ndarray, where: str) -> dict[str, Any]:
    """dtype, shape and sha256 of the little-endian bytes; a torch tensor and a numpy array with equal contents
    get the same digest."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OUSV":
            raise TypeError(f"signature(): {where} is a numpy array of {value.dtype}; only numeric tensors are keyed")
        array = value.astype(value.dtype.newbyteorder("<"), order="C", copy=False)
        data = array.tobytes()
        return {"dtype": str(array.dtype), "shape": list(array.shape), "sha256": hashlib.sha256(data).hexdigest()}
    tensor = value.detach().to("cpu")
    # A fresh dense copy: broadcast tensors (stride 0) and size-1 views cannot be viewed as bytes directly.
    dense = torch.empty(tensor.numel(), dtype=tensor.dtype).copy_(tensor.reshape(-1))
    data = dense.view(torch.uint8).numpy()
    return {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as file:
        for line in file:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
