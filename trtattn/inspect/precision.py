"""The precision an attention ran in, read from the tensor types its engine layers record, against the precision
it was built for (the sidecar's site ``dtype`` / ``normalization_quantize_to_type``).

Layer info spells a tensor's type in its ``Format/Datatype``: Myelin's short names (``Half``, ``FP8``,
``BFloat16``), the long format descriptions (``Row major linear FP16 format``, ``Channel major INT8 format where
channel % 4 == 0``) and the builder log's ``Half[1,40]``; TREx (trt-engine-explorer) reads the same vocabulary.
A quantized attention that TensorRT ran in FP16 is the failure users report as "FP8 MHA shows as FP16"
(NVIDIA/TensorRT#4516): nothing else says so.
"""

from __future__ import annotations

import re

from ..graph.precision import QUANTIZED

# the word of a Format/Datatype that names its type (the first one that does)
_TYPE_WORDS = {"fp32": "fp32", "float": "fp32", "float32": "fp32", "fp16": "fp16", "half": "fp16",
               "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "e4m3": "fp8", "int8": "int8",
               "fp4": "fp4", "int4": "int4", "double": "fp64", "int16": "int16", "int32": "int32", "int64": "int64",
               "uint8": "uint8", "bool": "bool"}
# the types an attention computes in, narrowest first (integer indices, lengths and booleans are not)
_COMPUTE_RANK = {"fp4": 0, "int4": 0, "fp8": 1, "int8": 1, "fp16": 2, "bf16": 2, "fp32": 3, "fp64": 4}


def dtype_of(fmt: str | None) -> str | None:
    """`Row major linear FP16 format` -> `fp16`, `FP8` -> `fp8`, `Int32` -> `int32`; None when it names no type."""
    for word in re.split(r"[^a-z0-9]+", (fmt or "").lower()):
        if word in _TYPE_WORDS:
            return _TYPE_WORDS[word]
    return None


def ran_in(layers) -> str | None:
    """The precision an attention computed in: the narrowest compute type among the inputs of its attention layers
    (else its MatMul-like layers, else all of them): an FP8 kernel takes FP8 Q/K/V even when it writes FP16, and
    a mask in a wider type does not widen it. Their outputs when the inputs carry no type; None without types."""
    compute = ([layer for layer in layers if layer.kernel or layer.attention_type]
               or [layer for layer in layers if layer.matmul_like] or layers)
    for side in ("input_dtypes", "output_dtypes"):
        types = [t for layer in compute for t in getattr(layer, side) if t in _COMPUTE_RANK]
        if types:
            return min(types, key=_COMPUTE_RANK.__getitem__)
    return None


def built_for(record: dict | None) -> str | None:
    """The precision the sidecar says the site's IAttention was built for: its normalization quantize type when
    set (fp8 / int8), else its dtype; None without a sidecar record (or one written before these keys)."""
    if not record:
        return None
    quantize = record.get("normalization_quantize_to_type")
    if quantize in QUANTIZED:
        return quantize
    dtype = record.get("dtype")
    return dtype if isinstance(dtype, str) and dtype else None


def precision_problem(ran: str | None, built: str | None) -> str | None:
    """Why a site built for FP8 / INT8 did not show that it ran in it, or None. Only quantized sites are checked:
    TensorRT networks are strongly typed, so only there can a build quietly give the user another precision."""
    if built not in QUANTIZED:
        return None
    if ran is None:
        return (f"built for {built}, but the layer info records no tensor types to show what it ran in "
                "(rebuild with --profilingVerbosity=detailed)")
    if ran != built:
        return (f"built for {built}, ran in {ran}: TensorRT did not use an {built} attention kernel "
                "(check the normalization quantize type and the Q/DQ around Q, K, V)")
    return None
