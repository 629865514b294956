"""Kernels as functions on tensors, knowing nothing of the graph: `triton/` (Triton JIT kernels)."""
