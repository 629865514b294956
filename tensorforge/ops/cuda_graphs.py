"""CUDA-graph capture that leaves torch's state usable when the capture fails.

A capture that fails (a kernel that synchronizes with the host, say) ends without torch's capture epilogue, so
the default CUDA generator stays marked as capturing, and every later random op outside a capture raises
"Offset increment outside graph capture encountered unexpectedly". `capture` then captures a one-kernel graph,
whose epilogue resets the generator, before it re-raises.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch


def capture(fn: Callable[[], Any], pool: Any = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`fn()` captured in a new CUDA graph (in `pool` when given, thread-local error mode): the graph and what
    `fn` returned. Raises what the capture raised, after resetting the generator. A function that launches
    nothing (a view: Reshape, Flatten) makes an empty graph, whose replay does nothing, which is right; torch's
    warning about it is not shown."""
    graph = torch.cuda.CUDAGraph()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                result = fn()
    except Exception:
        torch.cuda.synchronize()
        _reset_generator()
        raise
    return graph, result


def _reset_generator() -> None:
    scratch = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        scratch.add_(1)
