"""CUDA-graph capture that owns what it replays and leaves torch's state usable when the capture fails.

cuBLAS keeps one workspace per handle and stream, allocated at its first call, outside any graph's pool. A graph
captured over it would replay into memory it does not own, and torch.compile's CUDA-graph trees free those
workspaces each time they warm up or record (`torch._C._cuda_clearCublasWorkspaces`): a context captured before a
reduce-overhead model compiled in the same process then replayed its products over freed memory ("unspecified
launch failure"). `capture` clears the workspaces before and after, as torch's graph trees do, so a captured
product allocates its workspace in the graph's own pool, kept as long as the graph.

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
    _clear_cublas_workspaces()  # the capture's products allocate theirs in its pool
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                result = fn()
    except Exception:
        torch.cuda.synchronize()
        _reset_generator()
        raise
    finally:
        _clear_cublas_workspaces()  # calls after the capture do not share the graph's workspace
    return graph, result


def _clear_cublas_workspaces() -> None:
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # (CUDA builds of torch)
    if clear is not None:
        clear()


def _reset_generator() -> None:
    scratch = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        scratch.add_(1)
