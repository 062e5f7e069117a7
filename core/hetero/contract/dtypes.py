"""Element types: the plain numeric ones (mapped to numpy and ONNX) and the block-quantized weight formats.

A block-quantized type stores ``block_size`` logical elements in ``block_bytes`` bytes (scales included), so a
tensor of it is a byte buffer whose shape is still the logical one.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # the low-precision numpy dtypes onnx uses too (bfloat16, float8, int4, ...)
import numpy as np

from .errors import HeteroError


@dataclass(frozen=True)
class DType:
    name: str
    np_dtype: np.dtype | None  # None for block-quantized types and strings
    onnx_type: int | None  # onnx.TensorProto.DataType value
    itemsize: int  # bytes per element (0 for block types: see block_bytes)
    block_size: int = 1
    block_bytes: int = 0

    @property
    def is_block_quantized(self) -> bool:
        return self.block_size > 1

    @property
    def is_float(self) -> bool:
        return self.name in _FLOAT_NAMES

    def nbytes(self, numel: int) -> int:
        if self.is_block_quantized:
            if numel % self.block_size:
                raise HeteroError(f"{numel} elements are not a whole number of {self.name} blocks of {self.block_size}")
            return numel // self.block_size * self.block_bytes
        return numel * self.itemsize

    def __repr__(self) -> str:
        return f"hetero.{self.name}"

    def __str__(self) -> str:
        return self.name


def _plain(name: str, np_name: str | None, onnx_type: int | None, itemsize: int) -> DType:
    return DType(name, np.dtype(np_name) if np_name else None, onnx_type, itemsize)


# onnx.TensorProto.DataType values, spelled out so that importing dtypes needs no onnx.
float32 = _plain("float32", "float32", 1, 4)
uint8 = _plain("uint8", "uint8", 2, 1)
int8 = _plain("int8", "int8", 3, 1)
uint16 = _plain("uint16", "uint16", 4, 2)
int16 = _plain("int16", "int16", 5, 2)
int32 = _plain("int32", "int32", 6, 4)
int64 = _plain("int64", "int64", 7, 8)
string = DType("string", np.dtype(object), 8, 8)
bool_ = _plain("bool", "bool", 9, 1)
float16 = _plain("float16", "float16", 10, 2)
float64 = _plain("float64", "float64", 11, 8)
uint32 = _plain("uint32", "uint32", 12, 4)
uint64 = _plain("uint64", "uint64", 13, 8)
complex64 = _plain("complex64", "complex64", 14, 8)
complex128 = _plain("complex128", "complex128", 15, 16)
# Low-precision types come from ml_dtypes; sub-byte ones (int4, int2, float4) take one byte per element in memory.
bfloat16 = DType("bfloat16", np.dtype(ml_dtypes.bfloat16), 16, 2)
float8e4m3fn = DType("float8e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), 17, 1)
float8e4m3fnuz = DType("float8e4m3fnuz", np.dtype(ml_dtypes.float8_e4m3fnuz), 18, 1)
float8e5m2 = DType("float8e5m2", np.dtype(ml_dtypes.float8_e5m2), 19, 1)
float8e5m2fnuz = DType("float8e5m2fnuz", np.dtype(ml_dtypes.float8_e5m2fnuz), 20, 1)
uint4 = DType("uint4", np.dtype(ml_dtypes.uint4), 21, 1)
int4 = DType("int4", np.dtype(ml_dtypes.int4), 22, 1)
float4e2m1 = DType("float4e2m1", np.dtype(ml_dtypes.float4_e2m1fn), 23, 1)
float8e8m0 = DType("float8e8m0", np.dtype(ml_dtypes.float8_e8m0fnu), 24, 1)
uint2 = DType("uint2", np.dtype(ml_dtypes.uint2), 25, 1)
int2 = DType("int2", np.dtype(ml_dtypes.int2), 26, 1)
_FLOAT_NAMES = frozenset({"float16", "float32", "float64", "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
                          "float8e5m2fnuz", "float4e2m1", "float8e8m0"})

# Block-quantized weights (hetero's own and GGUF's): 32 elements per block.
q8_0 = DType("q8_0", None, None, 0, block_size=32, block_bytes=34)
q4_0 = DType("q4_0", None, None, 0, block_size=32, block_bytes=18)

ALL: tuple[DType, ...] = (
    float32, uint8, int8, uint16, int16, int32, int64, string, bool_, float16, float64, uint32, uint64, complex64,
    complex128, bfloat16, float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, uint4, int4, float4e2m1,
    float8e8m0, uint2, int2, q8_0, q4_0,
)
_BY_NAME = {d.name: d for d in ALL}
_BY_ONNX = {d.onnx_type: d for d in ALL if d.onnx_type is not None}
_BY_NUMPY = {d.np_dtype: d for d in ALL if d.np_dtype is not None and d is not string}


def from_name(name: str) -> DType:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise HeteroError(f"unknown dtype {name!r}; expected one of {sorted(_BY_NAME)}") from None


def from_onnx(onnx_type: int) -> DType:
    try:
        return _BY_ONNX[onnx_type]
    except KeyError:
        raise HeteroError(f"ONNX element type {onnx_type} is not supported by hetero") from None


def from_numpy(dt: np.dtype | type | str) -> DType:
    dt = np.dtype(dt)
    if dt.kind in ("U", "S", "O"):
        return string
    try:
        return _BY_NUMPY[dt]
    except KeyError:
        raise HeteroError(f"numpy dtype {dt} has no hetero equivalent") from None


def as_dtype(x: DType | str | np.dtype | type) -> DType:
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    return from_numpy(x)
