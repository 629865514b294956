"""The op registry and the reference executor.

Every module in this package that defines ops registers them on import; `load_all` imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil

_LOADED = False
_INFRA = {"registry", "executor", "infer", "helpers", "math_flags", "cuda_graphs"}


def load_all() -> None:
    """Import every op module so that its registrations take effect."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _INFRA and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def __getattr__(name: str):
    if name in ("Executor", "check_supported"):
        from . import executor

        return getattr(executor, name)
    if name in ("REGISTRY", "register", "OpContext"):
        from . import registry

        return getattr(registry, name)
    raise AttributeError(name)
