"""The calibration cache: a JSON file a person can read, keep and share.

```
{"format": "tensorforge-calibration", "version": 1, "method": "entropy", "params": {},
 "fingerprint": "sha256:…", "batches": 16,
 "tensors": {"x": {"amax": 2.64, "scale": 0.0208}, …},
 "channels": {"x": [0.33, 13.1, …], …}}
```

`channels` holds the per-channel maxima of depthwise convolutions' inputs (version 2; a version 1 cache, without
them, still reads: its depthwise inputs quantize per tensor).

`fingerprint` identifies the model (see `fingerprint.py`); reading a cache against another model fails.
Writing goes to the path the caller names and nowhere else (through a fresh temporary file beside it,
renamed over it, so a crash never leaves half a cache).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..ir import Model
from .calibration import CalibrationTable, TensorRange
from .fingerprint import model_fingerprint

FORMAT = "tensorforge-calibration"
VERSION = 2
READABLE = (1, 2)


def table_to_dict(table: CalibrationTable) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "method": table.method,
        "params": table.params,
        "fingerprint": table.fingerprint,
        "batches": table.batches,
        "tensors": {name: {"amax": r.amax, "scale": r.scale} for name, r in table.ranges.items()},
        "channels": {name: list(amax) for name, amax in table.channels.items()},
    }


def table_from_dict(data: dict[str, Any], source: str = "calibration cache") -> CalibrationTable:
    if data.get("format") != FORMAT:
        raise InputError(f"{source} is not a tensorforge calibration cache (format {data.get('format')!r})")
    if data.get("version") not in READABLE:
        version = data.get("version")
        raise InputError(f"{source} has cache version {version!r}; this tensorforge reads {READABLE}: recalibrate")
    try:
        ranges = {name: TensorRange(float(r["amax"]), float(r["scale"])) for name, r in data["tensors"].items()}
        channels = {name: tuple(float(a) for a in amax) for name, amax in data.get("channels", {}).items()}
        return CalibrationTable(
            data["method"], dict(data["params"]), data["fingerprint"], ranges, data["batches"], channels
        )
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"{source} is malformed ({type(err).__name__}: {err}): recalibrate") from None


def write_cache(table: CalibrationTable, path: str | os.PathLike[str]) -> Path:
    """Write `table` to `path` (replacing that file if it exists) and return the path."""
    target = Path(path)
    text = json.dumps(table_to_dict(table), indent=1) + "\n"
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def read_cache(
    path: str | os.PathLike[str], model: Model | None = None, fingerprint: str | None = None
) -> CalibrationTable:
    """The table in the cache at `path`; with `model` (or a `fingerprint`), checked to belong to it."""
    source = f"calibration cache {path}"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{source} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{source} is not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise InputError(f"{source} is not a tensorforge calibration cache")
    table = table_from_dict(data, source)
    expected = fingerprint or (model_fingerprint(model) if model is not None else None)
    if expected is not None and table.fingerprint != expected:
        raise InputError(
            f"{source} was computed for another model (fingerprint {table.fingerprint}, this model has "
            f"{expected}): recalibrate this model or pass the cache made for it"
        )
    return table
