"""The process's one thread for CPU inferences that code runs from threads of its own.

On the CPU our kernels and torch's run their loops on OpenMP (libgomp), which keeps a team of threads for every
thread that starts parallel loops. Once more threads are docked in those teams than there are cores, libgomp cuts
the spinning of idle team threads to about a hundred iterations, and every loop then wakes its threads from sleep
(docs/design.md, "Execution context"): two dynamic batchers, each running MobileNetV3 from its own worker, served
a request in 8.2 ms against 4.0-4.7 for one. So threaded CPU inference (the batchers' workers) runs here, on one
thread, and its loops on that thread's one team.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

NAME = "tensorforge-cpu"
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def on_cpu_thread(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` run on the CPU inference thread (directly when called from it): its result, or its exception."""
    global _pool
    if threading.current_thread().name.startswith(NAME):
        return fn(*args)
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix=NAME)
    return _pool.submit(fn, *args).result()
