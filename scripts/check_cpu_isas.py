"""Compile every C++ CPU kernel's source for an instruction set other than this machine's, without running it.

The kernels build for the host (`-march=native`), so a machine with AVX2 alone never compiles the AVX-512 forms
(the bf16 and int8 paths, the AVX-512 register tiles) and an AVX-512 machine never compiles the AVX2 ones
(`kernels/cpu/avx2.py`). This checks both: each module's source as a host of that instruction set would generate it
(its tiles chosen for it), syntax and templates, with the host's C++ compiler and torch's headers. About 40 s a
module; run it after changing a kernel.

    python scripts/check_cpu_isas.py                  (both instruction sets, every module)
    python scripts/check_cpu_isas.py --isa avx2 --module pointwise
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.cpu import MODULES, avx512

ARCHES = {"avx512": "sapphirerapids", "avx2": "x86-64-v3"}  # AVX-512 with BF16 and VNNI; AVX2 with FMA
AVX512_ONLY = {"quantized_pointwise", "quantized_conv"}  # the int8 kernels (vpdpbusd)


def sources(isa: str, modules: list[str]) -> dict[str, str]:
    """Each module's C++ as a host of `isa` would build it (its register tiles are chosen at import)."""
    avx512.isa = lambda: isa  # before the kernel modules are imported, which read it for their tiles
    return {name: importlib.import_module(f"tensorforge.kernels.cpu.{name}").SOURCE for name in modules}


def compile_check(source: str, arch: str, directory: Path, name: str) -> str | None:
    """The compiler's errors for `source` built for `arch`, or None."""
    from torch.utils import cpp_extension

    path = directory / f"{name}.cpp"
    path.write_text(source)
    includes = [flag for p in cpp_extension.include_paths() for flag in ("-I", p)]
    includes += ["-I", sysconfig.get_paths()["include"]]
    command = ["c++", "-std=c++17", "-fsyntax-only", f"-march={arch}", "-fopenmp", "-w", *includes, str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    return None if result.returncode == 0 else result.stderr[-4000:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", choices=sorted(ARCHES), action="append", help="default: both")
    parser.add_argument("--module", choices=MODULES, action="append", help="default: every one")
    parser.add_argument("--jobs", type=int, default=2, help="compilers at once")
    args = parser.parse_args()
    isas, modules = args.isa or sorted(ARCHES), args.module or list(MODULES)
    if len(isas) > 1:  # each instruction set in a process of its own: the kernel modules are imported once a process
        failed = [subprocess.call([sys.executable, __file__, "--isa", isa, "--jobs", str(args.jobs),
                                   *[f"--module={m}" for m in modules]]) for isa in isas]  # fmt: skip
        sys.exit(max(failed))
    isa = isas[0]
    names = [m for m in modules if isa == "avx512" or m not in AVX512_ONLY]
    texts = sources(isa, names)
    with tempfile.TemporaryDirectory() as directory, ThreadPoolExecutor(args.jobs) as pool:
        checks = pool.map(lambda n: compile_check(texts[n], ARCHES[isa], Path(directory), n), names)
        errors = dict(zip(names, checks, strict=True))
    for name, error in errors.items():
        print(f"{isa:7} {name:20} {'ok' if error is None else 'FAILED'}")
        if error:
            print(error)
    sys.exit(1 if any(errors.values()) else 0)


if __name__ == "__main__":
    main()
