"""Where an engine was built: the device and the software stack that an engine file is tied to.

An engine holds tactics chosen and timed on one device with one set of libraries, so it loads only where
all of these match exactly; `compatibility_problems` says what differs, one readable line per difference.
"""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UnsupportedError
from ..kernels.cpu.avx512 import features as cpu_features

ENGINE_FORMAT_VERSION = 1
"""Version of the engine file layout and header schema; bump it on any incompatible change."""


@dataclass(frozen=True)
class Environment:
    """The engine file format, the software versions and the device an engine was built for."""

    format_version: int
    tensorforge_version: str
    torch_version: str
    cuda_version: str | None
    triton_version: str | None
    device_type: str
    device_name: str
    compute_capability: tuple[int, int] | None

    @classmethod
    def current(cls, device: str | torch.device) -> Environment:
        """The environment of this process on `device` ("cpu", "cuda", "cuda:1", ...)."""
        from .. import __version__  # late: the package root may import the runtime one day

        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise UnsupportedError(f"{device!r} is not a device: {err}; use 'cpu', 'cuda' or 'cuda:N'") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise UnsupportedError(f"device {str(device)!r} was asked for, but this machine has no usable CUDA GPU")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise UnsupportedError(
                    f"no device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA GPUs"
                )
            index = device.index if device.index is not None else torch.cuda.current_device()
            name = torch.cuda.get_device_name(index)
            capability: tuple[int, int] | None = tuple(torch.cuda.get_device_capability(index))
        elif device.type == "cpu":
            name = f"{platform.machine() or 'unknown'} CPU with {cpu_features()}"
            capability = None
        else:
            raise UnsupportedError(f"device {str(device)!r} is not supported; tensorforge runs on 'cpu' and 'cuda'")
        return cls(
            format_version=ENGINE_FORMAT_VERSION,
            tensorforge_version=__version__,
            torch_version=torch.__version__,
            cuda_version=torch.version.cuda,
            triton_version=_triton_version(),
            device_type=device.type,
            device_name=name,
            compute_capability=capability,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the compute capability becomes a list)."""
        data = dataclasses.asdict(self)
        if self.compute_capability is not None:
            data["compute_capability"] = list(self.compute_capability)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Environment:
        """The inverse of `to_dict`; raises ValueError naming the first missing or mistyped field."""
        if not isinstance(data, dict):
            raise ValueError(f"the environment must be a JSON object, got {type(data).__name__}")
        fields = {field.name for field in dataclasses.fields(cls)}
        missing = sorted(fields - data.keys())
        unknown = sorted(data.keys() - fields)
        if missing or unknown:
            raise ValueError(f"the environment has missing fields {missing} and unknown fields {unknown}")
        for name in ("tensorforge_version", "torch_version", "device_type", "device_name"):
            _expect(data, name, str)
        for name in ("cuda_version", "triton_version"):
            _expect(data, name, (str, type(None)))
        _expect(data, "format_version", int)
        capability = data["compute_capability"]
        if capability is not None:
            if not (
                isinstance(capability, list)
                and len(capability) == 2
                and all(isinstance(part, int) and not isinstance(part, bool) for part in capability)
            ):
                raise ValueError(f"environment field 'compute_capability' is not [major, minor]: {capability}")
            capability = (capability[0], capability[1])
        return cls(**{**data, "compute_capability": capability})

    def describe_device(self) -> str:
        """E.g. "NVIDIA H200 (sm_90)" or "x86_64 CPU (cpu)"."""
        if self.compute_capability is None:
            return f"{self.device_name} ({self.device_type})"
        major, minor = self.compute_capability
        return f"{self.device_name} (sm_{major}{minor})"


def compatibility_problems(built: Environment, here: Environment) -> list[str]:
    """Every difference between the environment an engine was built in and this one; empty when it can load."""
    problems = []
    if built.format_version != here.format_version:
        problems.append(
            f"the engine has format version {built.format_version}, "
            f"this tensorforge reads format version {here.format_version}"
        )
    device = ("device_type", "device_name", "compute_capability")
    if any(getattr(built, name) != getattr(here, name) for name in device):
        problems.append(f"built on {built.describe_device()}, this device is {here.describe_device()}")
    for name, label in (
        ("tensorforge_version", "tensorforge"),
        ("torch_version", "torch"),
        ("cuda_version", "CUDA"),
        ("triton_version", "triton"),
    ):
        then, now = getattr(built, name), getattr(here, name)
        if then != now:
            problems.append(f"built with {_version(label, then)}, this machine has {_version(label, now)}")
    return problems


def _version(label: str, version: str | None) -> str:
    return f"no {label}" if version is None else f"{label} {version}"


def _expect(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> None:
    value = data[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"environment field {name!r} has the wrong type: {value!r}")


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", None)
