"""Serving engines over HTTP: the KServe v2 / Open Inference Protocol with dynamic batching."""
