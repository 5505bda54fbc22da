"""Everything about which TensorRT is installed, in one place: the import, the version check, and the
calls whose spelling differs between releases.

- TensorRT >= 11: add_attention_v2(q, k, v, norm_op, causal_kind); lengths are properties
  (attn.query_lengths = t); published snippets call set_query_lengths(t): taken if present.
"""

from __future__ import annotations

import numpy as np

from ..errors import MissingDependencyError, TrtattnError

MIN_VERSION = (11, 0)
INSTALL = ("TensorRT >= 11 is needed to build engines: install it from NVIDIA's package index "
           "(pip install --extra-index-url https://pypi.nvidia.com tensorrt-cu13) on a machine with an NVIDIA GPU, "
           "or use the container in docker/ (see docker/README.md)")


def import_tensorrt():
    """The tensorrt module, or one sentence saying how to get it."""
    try:
        import tensorrt as trt  # noqa: F401
    except ImportError:
        raise MissingDependencyError(INSTALL) from None
    check_version(trt)
    return trt


def version(trt) -> tuple[int, ...]:
    return tuple(int(x) for x in str(trt.__version__).split(".")[:3] if x.isdigit())


def check_version(trt) -> None:
    if version(trt)[:2] < MIN_VERSION:
        raise TrtattnError(f"TensorRT {trt.__version__} is older than {'.'.join(map(str, MIN_VERSION))}; {INSTALL}")


def add_attention(trt, network, q, k, v, causal: str):
    """IAttention with softmax normalisation and the given causal alignment."""
    kinds = {"none": "NONE", "upper_left": "UPPER_LEFT", "lower_right": "LOWER_RIGHT"}
    return network.add_attention_v2(q, k, v, trt.AttentionNormalizationOp.SOFTMAX,
                                    getattr(trt.CausalMaskKind, kinds[causal]))


def _set(obj, prop: str, method: str, value) -> None:
    if hasattr(type(obj), prop) or hasattr(obj, prop) and not callable(getattr(obj, prop)):
        setattr(obj, prop, value)
    elif hasattr(obj, method):
        getattr(obj, method)(value)
    else:
        raise TrtattnError(f"this TensorRT has neither {type(obj).__name__}.{prop} nor .{method}()")


def set_query_lengths(attn, t) -> None:
    _set(attn, "query_lengths", "set_query_lengths", t)


def set_key_value_lengths(attn, t) -> None:
    _set(attn, "key_value_lengths", "set_key_value_lengths", t)


def set_update_lengths(layer, t) -> None:
    _set(layer, "update_lengths", "set_update_lengths", t)


# numpy dtype name -> trt.DataType member: the one map between the two (the tensorrt module is a
# parameter here, so Polygraphy's own map, which imports tensorrt itself, cannot serve)
DATATYPES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int32": "INT32", "int64": "INT64",
             "bool": "BOOL", "int8": "INT8", "uint8": "UINT8", "float8_e4m3fn": "FP8"}


def datatype(trt, dtype) -> object:
    """numpy dtype (or name, or 'fp8') -> trt.DataType."""
    name = "float8_e4m3fn" if dtype == "fp8" else np.dtype(dtype).name
    if name not in DATATYPES:
        raise TrtattnError(f"no TensorRT data type for {name}")
    return getattr(trt.DataType, DATATYPES[name])


def numpy_dtype(trt, datatype) -> np.dtype:
    """trt.DataType -> numpy dtype (bfloat16 and float8 from ml_dtypes)."""
    for name, member in DATATYPES.items():
        if getattr(trt.DataType, member) == datatype:
            if name in ("bfloat16", "float8_e4m3fn"):
                import ml_dtypes

                return np.dtype(getattr(ml_dtypes, name))
            return np.dtype(name)
    raise TrtattnError(f"no numpy dtype for TensorRT's {datatype}")

