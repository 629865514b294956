"""Kernels as functions on tensors, knowing nothing of the graph: `triton/` (Triton JIT kernels), `quantize`
(the symmetric int8 / float8 E4M3 quantization their quantized variants read)."""
