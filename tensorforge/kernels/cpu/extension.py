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
import warnings
from pathlib import Path
from types import ModuleType

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


@functools.cache
def load(name: str, source: str, functions: tuple[str, ...]) -> ModuleType:
    """The extension module built from `source` exposing `functions` (compiled on first use, then cached). A build
    that failed raises again at once, with its first error, for the rest of the process."""
    problem = compiler_problem() or _FAILED.get(name)
    if problem:
        raise RuntimeError(problem)
    try:
        return _build(name, source, functions)
    except Exception as err:
        _FAILED[name] = f"the CPU kernel {name!r} did not build: {type(err).__name__}: {str(err)[-500:]}"
        raise RuntimeError(_FAILED[name]) from err


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
