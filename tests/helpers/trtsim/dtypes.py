"""TensorRT DataType <-> numpy <-> ONNX element types, keyed by the real enum members' names."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

NUMPY = {
    "FLOAT": np.dtype(np.float32),
    "HALF": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "INT8": np.dtype(np.int8),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "FP8": np.dtype(ml_dtypes.float8_e4m3fn),  # TensorRT's FP8 is E4M3
    "INT4": np.dtype(ml_dtypes.int4),
    "FP4": np.dtype(ml_dtypes.float4_e2m1fn),
    "E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}

ONNX = {
    TensorProto.FLOAT: "FLOAT",
    TensorProto.FLOAT16: "HALF",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.INT8: "INT8",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.BOOL: "BOOL",
    TensorProto.UINT8: "UINT8",
    TensorProto.FLOAT8E4M3FN: "FP8",
    TensorProto.INT4: "INT4",
}

FLOATING = {"FLOAT", "HALF", "BF16"}

# The numpy dtypes the bindings turn into Weights (python/src/utils.cpp, `type(py::dtype)`: f4, f2, i8, i4,
# i1, b1, u1): anything else, bfloat16 and float8 from ml_dtypes included, is a ValueError there.
WEIGHTS = {np.dtype(t) for t in (np.float32, np.float16, np.int64, np.int32, np.int8, np.bool_, np.uint8)}


def to_numpy(dtype) -> np.dtype:
    return NUMPY[dtype.name]


def from_numpy(trt, dtype: np.dtype):
    """The real DataType member for a numpy dtype (None when TensorRT has no such type)."""
    dtype = np.dtype(dtype)
    for name, np_dtype in NUMPY.items():
        if np_dtype == dtype:
            return trt.DataType.__members__[name]
    return None


def from_onnx(trt, elem_type: int):
    name = ONNX.get(elem_type)
    return trt.DataType.__members__[name] if name else None
