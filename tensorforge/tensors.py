"""Conversions at the edges: numpy arrays, ONNX TensorProtos and DLPack objects to torch tensors and back.

Strings have no torch dtype: string tensors stay numpy object arrays throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from .ir.dtypes import DType

Tensor = torch.Tensor | np.ndarray


def from_numpy(array: np.ndarray, device: torch.device | str = "cpu", *, copy: bool = True) -> Tensor:
    """A torch tensor holding `array` (bit-exact for bf16/fp8/sub-byte types); strings stay numpy. Without `copy`
    a writeable C-contiguous array of a type torch has is shared, as a torch feed is."""
    array = np.asarray(array)
    dtype = DType.from_numpy(array.dtype)
    if dtype == DType.STRING:
        return array.astype(object)
    if dtype in _CARRIED:
        tensor = torch.from_numpy(array.astype(torch_to_numpy_dtype(dtype.torch)))
    elif dtype.torch.is_floating_point and array.dtype.itemsize in (1, 2) and dtype not in _NATIVE_NUMPY:
        bits = array.copy().view(np.uint8 if array.dtype.itemsize == 1 else np.int16)  # keeps 0-d shape
        tensor = torch.from_numpy(bits).view(dtype.torch)
    else:
        shared = not copy and array.flags.writeable and array.flags.c_contiguous
        tensor = torch.from_numpy(array if shared else array.copy())
    return tensor.to(device)


def to_numpy(tensor: Any, dtype: DType | None = None) -> np.ndarray:
    """A numpy array of `tensor`; `dtype` names the element type when the tensor is a carrier."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    tensor = tensor.detach().cpu()
    if dtype is None:
        dtype = DType.from_torch(tensor.dtype)
    if dtype in _CARRIED:
        return tensor.numpy().astype(dtype.numpy)
    if tensor.dtype.is_floating_point and tensor.dtype.itemsize in (1, 2) and dtype not in _NATIVE_NUMPY:
        bits = tensor.contiguous().view(torch.uint8 if tensor.dtype.itemsize == 1 else torch.int16)
        return bits.numpy().view(dtype.numpy)
    return tensor.numpy()


def from_proto(proto: onnx.TensorProto, base_dir: str | None = None) -> tuple[Tensor, DType]:
    """The tensor stored in a TensorProto (external data read from `base_dir`) and its element type."""
    array = onnx.numpy_helper.to_array(proto, base_dir or "")
    return from_numpy(array), DType(proto.data_type)


def from_any(data: Any, device: torch.device | str = "cpu", *, copy: bool = True) -> Tensor:
    """A tensor from a torch tensor, numpy array, DLPack object, or nested Python sequence (`copy`: whether a
    numpy array is copied, `from_numpy`; a torch tensor on `device` is itself)."""
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, np.ndarray | np.generic):
        return from_numpy(np.asarray(data), device, copy=copy)
    if hasattr(data, "__dlpack__"):
        return torch.from_dlpack(data).to(device)
    return from_numpy(np.asarray(data), device)


def torch_to_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


_NATIVE_NUMPY = frozenset({DType.FLOAT16})
_CARRIED = frozenset({DType.INT4, DType.UINT4, DType.INT2, DType.UINT2, DType.FLOAT4E2M1}) | (
    frozenset() if hasattr(torch, "float8_e8m0fnu") else frozenset({DType.FLOAT8E8M0})
)
