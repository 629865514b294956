"""Process-wide float32 math flags: full float32 (no TF32 in cuDNN or cuBLAS) while any run is in flight.

torch keeps `allow_tf32` per process, not per thread or stream, so every runner in the process (the reference
executor, engine schedules, the autotuner) goes through one counted switch here instead of saving and
restoring the flags per run, which would let one run ending switch TF32 back on under another.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch

_FLAGS_LOCK = threading.Lock()
_FULL_FLOAT32_USERS = 0
_SAVED_FLAGS: tuple[bool, bool] | None = None


def _set_tf32(allow: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """No TF32 in cuDNN or cuBLAS while any schedule runs (float32 layers are full float32).

    The flags are process-wide, so concurrent runs share one count: the first to enter turns TF32 off, the
    last to leave restores the caller's setting. (Saving and restoring per run would let one thread switch
    TF32 back on while another is running or capturing float32 layers.)
    """
    global _FULL_FLOAT32_USERS, _SAVED_FLAGS
    with _FLAGS_LOCK:
        if _FULL_FLOAT32_USERS == 0:
            _SAVED_FLAGS = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
            _set_tf32(False)
        _FULL_FLOAT32_USERS += 1
    try:
        yield
    finally:
        with _FLAGS_LOCK:
            _FULL_FLOAT32_USERS -= 1
            if _FULL_FLOAT32_USERS == 0 and _SAVED_FLAGS is not None:
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = _SAVED_FLAGS


@contextlib.contextmanager
def tf32_math() -> Iterator[None]:
    """TF32 on for one tf32 layer, then off again (inside `full_float32`). A float32 layer of another thread
    launched meanwhile would also get TF32: engines with tf32 layers should not run eagerly from several
    threads at once (CUDA-graph replays are not affected: the math is fixed at capture)."""
    with _FLAGS_LOCK:
        _set_tf32(True)
    try:
        yield
    finally:
        with _FLAGS_LOCK:
            _set_tf32(False)


@functools.cache
def cpu_native_precisions() -> tuple[str, ...]:
    """The half precisions this CPU multiplies in hardware: bf16 where it has AVX512-BF16 or AMX dot products
    (oneDNN's bf16 convolutions and products then run up to twice as fast as float32 ones); none elsewhere,
    where oneDNN widens bf16 to float32 and it only costs time."""
    cpu = getattr(torch, "cpu", None)
    native = any(
        getattr(cpu, probe, lambda: False)() for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )
    return ("bf16",) if native else ()
