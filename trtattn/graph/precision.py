"""Precision names: the one home of what trtattn calls a precision ("fp32", "fp16", "bf16", "fp8", "int8"),
how ONNX element types and numpy dtype names map to those names, the quantized ones, and which precision a
model computes in (model_precision).

The names are the CLI's (--precision, --io-dtype), the build plan's (AttentionPlan.dtype) and the reports';
every module that turns an ONNX type or a numpy dtype into one, or back, reads these tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import onnx
from onnx import TensorProto

from .external import all_tensors, nbytes

QUANTIZED = ("fp8", "int8")  # the precisions a model is quantized to (Q/DQ), not converted to
LOW_FLOATS = ("fp16", "bf16")  # the half precisions a model is converted to (AutoCast), or computes in
FUSED_PRECISIONS = (*LOW_FLOATS, *QUANTIZED)  # the precisions a fused attention kernel computes in
COMPUTE_PRECISIONS = (*LOW_FLOATS, "fp32", *QUANTIZED)  # what a route builds an attention to compute in

# ONNX element type -> precision name (also of the types a model holds but no attention computes in)
ELEM_PRECISIONS: dict[int, str] = {
    TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16", TensorProto.DOUBLE: "fp64",
    TensorProto.FLOAT8E4M3FN: "fp8", TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.INT4: "int4",
    TensorProto.FLOAT4E2M1: "fp4"}
PRECISION_ELEMS: dict[str, int] = {name: elem for elem, name in ELEM_PRECISIONS.items()}
FLOAT_ELEMS: frozenset[int] = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})

# precision name -> numpy dtype name (ml_dtypes' for bf16 and fp8)
NUMPY_NAMES: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64",
                               "fp8": "float8_e4m3fn", "int8": "int8", "uint8": "uint8"}
# numpy dtype name -> precision name; onnx.helper spells fp8 without the underscore (its own float8e4m3fn type)
NUMPY_PRECISIONS: dict[str, str] = {**{v: k for k, v in NUMPY_NAMES.items()}, "float8e4m3fn": "fp8"}
# ONNX Runtime's type of a float input -> the numpy dtype it is fed in (a bf16 input takes fp32 values, exactly)
FEED_DTYPES: dict[str, str] = {"tensor(float16)": "float16", "tensor(float)": "float32"}


def elem_precision(elem_type: int, among: Iterable[str] = COMPUTE_PRECISIONS, default: str = "fp32") -> str:
    """The precision name of an ONNX element type when it is one of `among`, else `default`."""
    name = ELEM_PRECISIONS.get(elem_type)
    return name if name in tuple(among) else default


def numpy_precision(dtype_name: str | None) -> str | None:
    """`float16` -> `fp16`, `float8e4m3fn` -> `fp8`; None for a dtype that names no precision (or None)."""
    return NUMPY_PRECISIONS.get(dtype_name or "")


def low_float(dtype_name: str | None) -> str | None:
    """`float16` -> `fp16`, `bfloat16` -> `bf16`; None for every other dtype (fp32 included)."""
    name = numpy_precision(dtype_name)
    return name if name in LOW_FLOATS else None


class Weighing(Enum):
    """How model_precision weighs a model's float tensors. Two rules, because two callers were measured with
    them and they can disagree on a model whose weights are split between fp32 and a half type (60% of the
    elements fp16 is 43% of the bytes): each keeps its measured behaviour until a measurement says one is right.

    STORED (a rewrite's tolerance, verify.tolerance_for): the bytes of every tensor, subgraphs included (read
    from its record, so weights on disk stay there), fp64 counted as fp32; else the graph outputs.
    COMPUTED (the precision a route works in, rewrite.precision.chosen_precision): the elements of the main
    graph's initializers and Constants; else the graph inputs and outputs."""

    STORED = "stored"
    COMPUTED = "computed"


@dataclass(frozen=True)
class ModelPrecision:
    name: str  # "fp32", "fp16" or "bf16"
    where: str  # what says so: "weights", "outputs", "inputs and outputs", or "no float tensors"


def model_precision(model: onnx.ModelProto, weighing: Weighing) -> ModelPrecision:
    """The float type most of a model's weights are in (weighed as `weighing` says), else its graph edges';
    fp32 for a model with no float tensor."""
    counts, where = _weights(model, weighing), "weights"
    if not counts:
        counts, where = _edges(model, weighing)
    if not counts:
        return ModelPrecision("fp32", "no float tensors")
    return ModelPrecision(max(counts, key=lambda p: counts[p]), where)


def _counted(weighing: Weighing) -> dict[int, str]:
    """The element types a rule counts, by the name it counts them as (STORED checks fp64 at fp32's tolerance)."""
    floats: dict[int, str] = {elem: ELEM_PRECISIONS[elem] for elem in FLOAT_ELEMS}
    return {**floats, TensorProto.DOUBLE: "fp32"} if weighing is Weighing.STORED else floats


def _weights(model: onnx.ModelProto, weighing: Weighing) -> dict[str, int]:
    counted, counts = _counted(weighing), dict[str, int]()
    if weighing is Weighing.STORED:
        sized = [(t.data_type, nbytes(t)) for t in all_tensors(model)]
    else:
        graph = model.graph
        weights = [*graph.initializer, *(a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                                          if a.name == "value")]
        sized = [(t.data_type, math.prod(t.dims)) for t in weights]
    for elem, size in sized:
        if elem in counted:
            counts[counted[elem]] = counts.get(counted[elem], 0) + size
    return counts


def _edges(model: onnx.ModelProto, weighing: Weighing) -> tuple[dict[str, int], str]:
    graph, counted = model.graph, _counted(weighing)
    edges, where = ((graph.output, "outputs") if weighing is Weighing.STORED
                    else ([*graph.input, *graph.output], "inputs and outputs"))
    counts: dict[str, int] = {}
    for v in edges:
        elem = v.type.tensor_type.elem_type
        if elem in counted:
            counts[counted[elem]] = counts.get(counted[elem], 0) + 1
    return counts, where
