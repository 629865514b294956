"""Element types: one enum that maps ONNX element types to torch and numpy dtypes."""

from __future__ import annotations

import enum

import numpy as np
import onnx
import torch

_TP = onnx.TensorProto


class DType(enum.IntEnum):
    """An ONNX element type; the value is the `TensorProto.DataType` number."""

    UNDEFINED = _TP.UNDEFINED
    FLOAT = _TP.FLOAT
    UINT8 = _TP.UINT8
    INT8 = _TP.INT8
    UINT16 = _TP.UINT16
    INT16 = _TP.INT16
    INT32 = _TP.INT32
    INT64 = _TP.INT64
    STRING = _TP.STRING
    BOOL = _TP.BOOL
    FLOAT16 = _TP.FLOAT16
    DOUBLE = _TP.DOUBLE
    UINT32 = _TP.UINT32
    UINT64 = _TP.UINT64
    COMPLEX64 = _TP.COMPLEX64
    COMPLEX128 = _TP.COMPLEX128
    BFLOAT16 = _TP.BFLOAT16
    FLOAT8E4M3FN = _TP.FLOAT8E4M3FN
    FLOAT8E4M3FNUZ = _TP.FLOAT8E4M3FNUZ
    FLOAT8E5M2 = _TP.FLOAT8E5M2
    FLOAT8E5M2FNUZ = _TP.FLOAT8E5M2FNUZ
    UINT4 = _TP.UINT4
    INT4 = _TP.INT4
    FLOAT4E2M1 = _TP.FLOAT4E2M1
    FLOAT8E8M0 = getattr(_TP, "FLOAT8E8M0", 24)
    UINT2 = getattr(_TP, "UINT2", 25)
    INT2 = getattr(_TP, "INT2", 26)

    @property
    def torch(self) -> torch.dtype:
        """The torch dtype that holds this element type, or raise when torch has none.

        Sub-byte types live in a wider carrier: int4/int2 in int8, uint4/uint2 in uint8 and float4 in
        float32, each holding only values the narrow type can represent.
        """
        try:
            return _TO_TORCH.get(self) or _CARRIERS[self]
        except KeyError:
            raise TypeError(f"element type {self.name} has no torch equivalent") from None

    @property
    def has_torch(self) -> bool:
        return self in _TO_TORCH or self in _CARRIERS

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_integer(self) -> bool:
        return self in _INTEGERS

    @property
    def is_signed(self) -> bool:
        return self in _SIGNED

    @property
    def bits(self) -> int:
        """Width in bits of one element (sub-byte types count their real width)."""
        return _BITS.get(self) or self.torch.itemsize * 8

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> DType:
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise TypeError(f"torch dtype {dtype} has no ONNX element type") from None

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> DType:
        dtype = np.dtype(dtype)
        if dtype.kind in "OUS":
            return cls.STRING
        return cls(onnx.helper.np_dtype_to_tensor_dtype(dtype))

    @property
    def numpy(self) -> np.dtype:
        return onnx.helper.tensor_dtype_to_np_dtype(int(self))

    def __str__(self) -> str:
        return _SHORT.get(self, self.name.lower())


_TO_TORCH: dict[DType, torch.dtype] = {
    DType.FLOAT: torch.float32,
    DType.UINT8: torch.uint8,
    DType.INT8: torch.int8,
    DType.UINT16: torch.uint16,
    DType.INT16: torch.int16,
    DType.INT32: torch.int32,
    DType.INT64: torch.int64,
    DType.BOOL: torch.bool,
    DType.FLOAT16: torch.float16,
    DType.DOUBLE: torch.float64,
    DType.UINT32: torch.uint32,
    DType.UINT64: torch.uint64,
    DType.COMPLEX64: torch.complex64,
    DType.COMPLEX128: torch.complex128,
    DType.BFLOAT16: torch.bfloat16,
    DType.FLOAT8E4M3FN: torch.float8_e4m3fn,
    DType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    DType.FLOAT8E5M2: torch.float8_e5m2,
    DType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
}
if hasattr(torch, "float8_e8m0fnu"):
    _TO_TORCH[DType.FLOAT8E8M0] = torch.float8_e8m0fnu

_CARRIERS: dict[DType, torch.dtype] = {
    DType.INT4: torch.int8,
    DType.UINT4: torch.uint8,
    DType.INT2: torch.int8,
    DType.UINT2: torch.uint8,
    DType.FLOAT4E2M1: torch.float32,
}
if DType.FLOAT8E8M0 not in _TO_TORCH:
    _CARRIERS[DType.FLOAT8E8M0] = torch.float32
_BITS = {DType.INT4: 4, DType.UINT4: 4, DType.INT2: 2, DType.UINT2: 2, DType.FLOAT4E2M1: 4}

_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}

_FLOATS = frozenset(
    {
        DType.FLOAT,
        DType.FLOAT16,
        DType.DOUBLE,
        DType.BFLOAT16,
        DType.FLOAT8E4M3FN,
        DType.FLOAT8E4M3FNUZ,
        DType.FLOAT8E5M2,
        DType.FLOAT8E5M2FNUZ,
        DType.FLOAT4E2M1,
        DType.FLOAT8E8M0,
    }
)
_INTEGERS = frozenset(
    {
        DType.UINT8,
        DType.INT8,
        DType.UINT16,
        DType.INT16,
        DType.INT32,
        DType.INT64,
        DType.UINT32,
        DType.UINT64,
        DType.UINT4,
        DType.INT4,
        DType.UINT2,
        DType.INT2,
    }
)

_SIGNED = frozenset({DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.INT4, DType.INT2})

_SHORT = {
    DType.FLOAT: "f32",
    DType.FLOAT16: "f16",
    DType.DOUBLE: "f64",
    DType.BFLOAT16: "bf16",
    DType.INT8: "i8",
    DType.INT16: "i16",
    DType.INT32: "i32",
    DType.INT64: "i64",
    DType.UINT8: "u8",
    DType.UINT16: "u16",
    DType.UINT32: "u32",
    DType.UINT64: "u64",
    DType.BOOL: "bool",
    DType.STRING: "str",
}
