"""Everything that differs between TensorRT versions, in one place.

- TensorRT >= 11: add_attention_v2(q, k, v, norm_op, causal_kind); lengths are properties
  (attn.query_lengths = t); published snippets call set_query_lengths(t): taken if present.
- TensorRT 10.14-10.16: add_attention(q, k, v, norm_op, causal: bool), upper-left causal only.
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
    if version(trt)[:2] < MIN_VERSION and not hasattr(trt.INetworkDefinition, "add_attention"):
        raise TrtattnError(f"TensorRT {trt.__version__} has no IAttention; {INSTALL}")


def add_attention(trt, network, q, k, v, causal: str):
    """IAttention with softmax normalisation and the given causal alignment."""
    kinds = {"none": "NONE", "upper_left": "UPPER_LEFT", "lower_right": "LOWER_RIGHT"}
    if hasattr(network, "add_attention_v2"):
        return network.add_attention_v2(q, k, v, trt.AttentionNormalizationOp.SOFTMAX,
                                        getattr(trt.CausalMaskKind, kinds[causal]))
    if causal == "lower_right":
        raise TrtattnError("lower-right causal attention (decoding with a cache) needs TensorRT >= 11")
    return network.add_attention(q, k, v, trt.AttentionNormalizationOp.SOFTMAX, causal == "upper_left")


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


def datatype(trt, dtype) -> object:
    """numpy dtype (or name) -> trt.DataType."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) or dtype in np.sctypeDict else dtype
    table = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int32": "INT32", "int64": "INT64",
             "bool": "BOOL", "int8": "INT8", "uint8": "UINT8", "fp8": "FP8", "float8_e4m3fn": "FP8"}
    if name not in table:
        raise TrtattnError(f"no TensorRT data type for {name}")
    return getattr(trt.DataType, table[name])


PRECISION_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
