"""Where kernels compiled at run time are kept between processes: `$TENSORFORGE_CACHE` or `~/.cache/tensorforge`,
one folder per kind."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    """The cache folder of `kind` (e.g. "cuda" cubins, "cpu" C++ extensions); not created here."""
    root = os.environ.get("TENSORFORGE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "tensorforge") / kind
