"""Triton kernels. Under `TRITON_INTERPRET=1` (set before this package is imported) they run on CPU tensors."""
