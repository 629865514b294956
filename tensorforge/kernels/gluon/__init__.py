"""Gluon kernels (Triton's explicit-layout language) for Hopper: warp-specialized, persistent (`gemm.py`)."""
