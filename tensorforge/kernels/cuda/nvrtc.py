"""CUDA C kernels compiled at run time with NVRTC and launched through the driver API (cuda-python).

`compile_cubin(source, name, defines, arch)` compiles one translation unit to a cubin for one GPU architecture
(`cuda_kernel(source, function, defines, device)` compiles and loads one function of it, once a process);
cubins are cached on disk (`$TENSORFORGE_CACHE` or `~/.cache/tensorforge/cuda`) under a hash of the source,
the options and the NVRTC version, so an engine load does not recompile what its build already compiled, and
in memory per process. `CudaKernel` loads a cubin's function into the current device's primary context once and
launches it on torch's current stream with the given arguments (tensors pass their data pointers), so launches
are ordered with torch's work and are captured by CUDA graphs like any other.

The sources include no headers: half and bfloat16 conversions are inline PTX (see `source.py`), so NVRTC needs
no CUDA toolkit include directory, and the compile check runs on machines without a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..cache import cache_dir

_LOCK = threading.Lock()
_CUBINS: dict[str, bytes] = {}


class CudaCompileError(RuntimeError):
    """NVRTC rejected a kernel source; the message holds its log."""


@functools.cache
def unavailable() -> str | None:
    """Why CUDA C kernels cannot be compiled here (cuda-python or NVRTC missing), or None."""
    try:
        from cuda.bindings import nvrtc

        err, _, _ = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings or the NVRTC library are missing
        return f"NVRTC is not available ({type(exc).__name__}: {exc}); install tensorforge[cuda]"
    return None if _ok(err) else f"NVRTC is not usable: {err}"


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return major, minor


def device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _ok(err: Any) -> bool:
    return int(err) == 0


def compile_cubin(source: str, name: str, defines: Mapping[str, Any], arch: str) -> bytes:
    """`source` compiled for `arch` (e.g. "sm_90") with `-D` `defines`; cached in memory and on disk."""
    options = [f"--gpu-architecture={arch}", "-default-device", "-std=c++17", "--use_fast_math"]
    options += [f"-D{key}={value}" for key, value in sorted(defines.items())]
    key_text = "\n".join([source, *options, str(nvrtc_version())])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:32]
    with _LOCK:
        if key in _CUBINS:
            return _CUBINS[key]
    path = cache_dir("cuda") / f"{name}-{key}.cubin"
    if path.is_file():
        cubin = path.read_bytes()
    else:
        cubin = _compile(source, name, options)
        _write_atomically(path, cubin)
    with _LOCK:
        _CUBINS[key] = cubin
    return cubin


def _compile(source: str, name: str, options: Sequence[str]) -> bytes:
    from cuda.bindings import nvrtc

    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    if not _ok(err):
        raise CudaCompileError(f"{name}: nvrtcCreateProgram failed: {err}")
    try:
        encoded = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        if not _ok(err):
            raise CudaCompileError(f"{name} ({' '.join(options)}) did not compile:\n{_log(program)}")
        err, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(program, cubin)
        if not _ok(err):
            raise CudaCompileError(f"{name}: nvrtcGetCUBIN failed: {err}")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _log(program) -> str:
    from cuda.bindings import nvrtc

    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(program, log)
    return log.decode(errors="replace").rstrip("\x00 \n")


def _write_atomically(path: Path, data: bytes) -> None:
    """Best effort: a read-only or full cache directory only costs a recompile next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        scratch.write_bytes(data)
        os.replace(scratch, path)
    except OSError:
        pass


_LOADED: dict[tuple[Any, ...], CudaKernel] = {}


def cuda_kernel(
    source: str, function: str, defines: Mapping[str, Any], device: torch.device, shared_bytes: int = 0
) -> CudaKernel:
    """`function` of `source` compiled with `defines` for `device`'s architecture, one `CudaKernel` per process
    for each (source, function, defines, device, shared memory)."""
    key = (source, function, tuple(sorted(defines.items())), device, shared_bytes)
    kernel = _LOADED.get(key)
    if kernel is None:
        cubin = compile_cubin(source, function, defines, device_arch(device))
        kernel = _LOADED[key] = CudaKernel(cubin, function, shared_bytes)
    return kernel


class CudaKernel:
    """One `extern "C"` function of a cubin, loaded per device on first launch."""

    def __init__(self, cubin: bytes, function: str, shared_bytes: int = 0) -> None:
        self.cubin, self.function, self.shared_bytes = cubin, function, shared_bytes
        self._loaded: dict[int, Any] = {}

    def launch(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], device: torch.device) -> None:
        """Run on torch's current stream of `device`. `args`: tensors (their data pointers), ints (int32),
        floats (float32)."""
        from cuda.bindings import driver

        function = self._function(device)
        stream = torch.cuda.current_stream(device).cuda_stream
        values, types = [], []
        for arg in args:
            if isinstance(arg, torch.Tensor):
                values.append(arg.data_ptr())
                types.append(ctypes.c_void_p)
            elif isinstance(arg, bool) or isinstance(arg, int):
                values.append(int(arg))
                types.append(ctypes.c_int)
            elif isinstance(arg, float):
                values.append(arg)
                types.append(ctypes.c_float)
            elif arg is None:
                values.append(0)
                types.append(ctypes.c_void_p)
            else:
                raise TypeError(f"{self.function}: cannot pass {type(arg).__name__} to a CUDA kernel")
        grid3 = [*grid, 1, 1][:3]
        block3 = [*block, 1, 1][:3]
        (err,) = driver.cuLaunchKernel(
            function, *grid3, *block3, self.shared_bytes, driver.CUstream(stream), (tuple(values), tuple(types)), 0
        )
        _check(err, f"launching {self.function}")

    def _function(self, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        function = self._loaded.get(index)
        if function is not None:
            _make_current(index)
            return function
        from cuda.bindings import driver

        with _LOCK:
            _make_current(index)
            err, module = driver.cuModuleLoadData(self.cubin)
            _check(err, f"loading the module of {self.function}")
            err, function = driver.cuModuleGetFunction(module, self.function.encode())
            _check(err, f"finding {self.function} in its module")
            if self.shared_bytes > 48 * 1024:
                attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                (err,) = driver.cuFuncSetAttribute(function, attribute, self.shared_bytes)
                _check(err, f"allowing {self.shared_bytes} B of shared memory for {self.function}")
            self._loaded[index] = function
        return function


_CONTEXTS: dict[int, Any] = {}


def _make_current(index: int) -> None:
    """Make the device's primary context (the one torch uses) current on this thread for the driver API."""
    from cuda.bindings import driver

    err, current = driver.cuCtxGetCurrent()
    context = _CONTEXTS.get(index)
    if context is not None and _ok(err) and int(current) == int(context):
        return
    if context is None:
        torch.cuda.init()
        (err,) = driver.cuInit(0)
        _check(err, "cuInit")
        err, handle = driver.cuDeviceGet(index)
        _check(err, f"cuDeviceGet({index})")
        err, context = driver.cuDevicePrimaryCtxRetain(handle)
        _check(err, "retaining the primary context")
        _CONTEXTS[index] = context
    (err,) = driver.cuCtxSetCurrent(context)
    _check(err, "making the primary context current")


def _check(err: Any, what: str) -> None:
    if not _ok(err):
        raise RuntimeError(f"CUDA driver error while {what}: {err}")
