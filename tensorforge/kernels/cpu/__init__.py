"""CPU kernels of our own in C++, compiled once per machine with the host's compiler (`extension.load`) and cached:
layers where the vendor path through torch pays a fixed cost per op that outweighs the work, or runs below the
cores' peak (1×1, depthwise, stem, direct and Winograd convolutions with their epilogues, a depthwise convolution
and the 1×1 after it in one pass, an expansion, depthwise and projection in one pass, squeeze-and-excitation as one
call instead of seven, attention in one pass, layer norm, max pool; int8 1×1, linear and direct convolutions on
VNNI's byte dot products)."""

from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor, wait

# every kernel module: each has its C++ as SOURCE and `module()`, which builds or loads it
MODULES = (
    "attention", "conv", "depthwise", "depthwise_pointwise", "expand_depthwise", "layer_norm", "max_pool",
    "pointwise", "quantized_conv", "quantized_pointwise", "squeeze_excite", "stem_conv", "winograd",
)  # fmt: skip


def compile_all() -> None:
    """Build every CPU kernel not yet in the cache, at once: the compiler runs as processes of its own, so on a
    fresh two-core machine the first four took about 54 s together against 110 one after another. A kernel that
    cannot be built here is left to its tactic, which declines or reports it (`extension.load` remembers the
    error)."""
    loaders = [importlib.import_module(f"{__name__}.{name}").module for name in MODULES]
    with ThreadPoolExecutor(len(loaders)) as pool:
        wait([pool.submit(loader) for loader in loaders])
