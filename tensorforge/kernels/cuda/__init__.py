"""CUDA C kernels compiled at run time with NVRTC (`nvrtc.py`), as functions on torch tensors."""
