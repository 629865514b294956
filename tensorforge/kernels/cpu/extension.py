"""C++ sources built into Python extension modules with `torch.utils.cpp_extension` (the host's C++ compiler and
ninja), once per source, machine and torch: cached under `$TENSORFORGE_CACHE` (or `~/.cache/tensorforge`)/`cpu`,
so that a later process loads the module without compiling. Compiled for the host's own instruction set
(`-march=native`), so the cache key includes the CPU's feature flags. Parallel loops are `at::parallel_for`, which
is inline OpenMP in torch's CPU builds: without `-fopenmp` its pragma is ignored and the loop runs on one thread
(with it, the loop runs on torch's own OpenMP runtime and thread count)."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..cache import cache_dir

FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17")


@functools.cache
def host_flags() -> str:
    """The CPU's identity for the cache key: its feature flags where Linux lists them, else the machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


@functools.cache
def compiler_problem() -> str | None:
    """Why C++ extensions cannot be built here (no compiler, no ninja), or None."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} not found): install one (e.g. g++) for the CPU kernels"
    if not cpp_extension.is_ninja_available():
        return "ninja is not available: `pip install ninja` for the CPU kernels"
    return None


_FAILED: dict[str, str] = {}  # module name → why it did not build (not tried again in this process)


class Extension:
    """A built module's `functions` as attributes, which is what kernels call; `intercepted` reroutes them."""

    def __init__(self, module: ModuleType, functions: tuple[str, ...]) -> None:
        self.module = module
        self.functions = functions
        for function in functions:
            setattr(self, function, getattr(module, function))


_LOADED: list[Extension] = []
_INTERCEPTION = threading.Lock()
_REROUTE: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = []  # the interception in force, if any


@functools.cache
def load(name: str, source: str, functions: tuple[str, ...]) -> Extension:
    """The extension built from `source` exposing `functions` (compiled on first use, then cached). A build that
    failed raises again at once, with its first error, for the rest of the process."""
    problem = compiler_problem() or _FAILED.get(name)
    if problem:
        raise RuntimeError(problem)
    try:
        extension = Extension(_build(name, source, functions), functions)
    except Exception as err:
        _FAILED[name] = f"the CPU kernel {name!r} did not build: {type(err).__name__}: {str(err)[-500:]}"
        raise RuntimeError(_FAILED[name]) from err
    _LOADED.append(extension)
    for reroute in _REROUTE:
        _set(extension, reroute)
    return extension


@contextmanager
def intercepted(call: Callable[[Callable[..., Any], tuple[Any, ...]], Any]) -> Iterator[None]:
    """Within: every function of an extension that this thread calls runs as `call(function, args)` (other
    threads' calls run as before). One interception at a time in a process."""
    thread = threading.get_ident()

    def reroute(function):
        def call_on(*args):
            if threading.get_ident() == thread:
                return call(function, args)
            return function(*args)

        return call_on

    with _INTERCEPTION:
        _REROUTE.append(reroute)
        for extension in _LOADED:
            _set(extension, reroute)
        try:
            yield
        finally:
            _REROUTE.clear()
            for extension in _LOADED:
                _set(extension, None)


def _set(extension: Extension, reroute) -> None:
    """Point `extension`'s functions at `reroute(function)`, or (None) back at the module's own."""
    for name in extension.functions:
        function = getattr(extension.module, name)
        setattr(extension, name, function if reroute is None else reroute(function))


def _build(name: str, source: str, functions: tuple[str, ...]) -> ModuleType:
    from torch.utils import cpp_extension

    key = hashlib.sha256("\n".join([source, *FLAGS, torch.__version__, sys.version, host_flags()]).encode()).hexdigest()
    module_name = f"tensorforge_{name}_{key[:16]}"
    directory = cache_dir("cpu") / module_name
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.glob("*.so")):
        print(f"tensorforge: compiling the CPU kernel {name!r} once (cached in {directory})", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on the compiler's ABI version
        return cpp_extension.load_inline(
            module_name,
            cpp_sources=source,
            functions=list(functions),
            extra_cflags=list(FLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
