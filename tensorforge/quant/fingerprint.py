"""Model fingerprints: a calibration cache is valid only for the model it was computed on.

`model_fingerprint` hashes (SHA-256) the graph's structure (inputs, outputs, every node's op, domain,
input and output names and attributes, subgraphs included) and its weights (every initializer's name,
dtype, shape and bytes); `file_fingerprint` hashes an ONNX file's bytes.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch

from ..ir import Graph, Model, format_type


def model_fingerprint(model: Model) -> str:
    digest = hashlib.sha256()
    digest.update(repr(sorted(model.opset_imports.items())).encode())
    _hash_graph(model.graph, digest)
    return "sha256:" + digest.hexdigest()


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _hash_graph(graph: Graph, digest: Any) -> None:
    digest.update(repr([(v.name, format_type(v.dtype, v.shape)) for v in graph.inputs]).encode())
    digest.update(repr([v.name for v in graph.outputs]).encode())
    for name in sorted(graph.initializers):
        value = graph.initializers[name]
        digest.update(f"{name}:{format_type(value.dtype, value.shape)}".encode())
        _hash_attribute(value.const, digest)
    for node in graph.nodes:
        inputs = ["" if v is None else v.name for v in node.inputs]
        digest.update(repr((node.domain, node.op_type, inputs, [v.name for v in node.outputs])).encode())
        for key in sorted(node.attributes):
            digest.update(key.encode())
            _hash_attribute(node.attributes[key], digest)


def _hash_attribute(attr: Any, digest: Any) -> None:
    if isinstance(attr, torch.Tensor):
        tensor = attr.detach().cpu().reshape(-1).clone(memory_format=torch.contiguous_format)
        digest.update(f"{tensor.dtype}{list(attr.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    elif isinstance(attr, Graph):
        _hash_graph(attr, digest)
    elif isinstance(attr, list | tuple):
        digest.update(b"[")
        for item in attr:
            _hash_attribute(item, digest)
        digest.update(b"]")
    else:
        digest.update(repr(attr).encode())
