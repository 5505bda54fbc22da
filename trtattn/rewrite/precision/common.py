"""What the precision modules share: dtype names, limits, tolerances, errors and the model's declared types."""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto

from ...errors import TrtattnError

PRECISIONS = ("fp16", "bf16")
INSTALL = "pip install 'trtattn[quant]' (NVIDIA ModelOpt without its onnxruntime-gpu)"

# Per output: "rel" bounds max |new - ref| / max |ref| (a wrong row shows), "rel_l2" ||new - ref|| / ||ref||.
# Measured on the 22 TorchScript zoo exports and their fused forms (padded feeds, seq 7-12; Llama, T5,
# Gemma 3, BART fused also at seq 32 and 60): fp16 rel 0.0007-0.0052, rel_l2 <= 0.0024; bf16 rel
# 0.012-0.10, rel_l2 <= 0.049 (T5 at seq 60 both times).
TOLERANCE = {"fp16": {"rel": 0.02, "rel_l2": 0.01}, "bf16": {"rel": 0.2, "rel_l2": 0.1}}

MATMUL_OPS = ("MatMul", "Gemm", "Conv", "Attention", "Einsum")
DEFAULT_DIM = 16  # a symbolic dim nobody bound
UNCOUNTED = {"ConvTranspose", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"}
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
DTYPE_NAMES = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16",
           TensorProto.DOUBLE: "fp64", TensorProto.FLOAT8E4M3FN: "fp8", TensorProto.INT8: "int8",
           TensorProto.UINT8: "uint8", TensorProto.INT4: "int4", TensorProto.FLOAT4E2M1: "fp4"}
FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
NO_MATH = {"Constant", "ConstantOfShape", "Cast", "Shape", "Size", "Identity"}
LARGE = 2**31 - 1 - 2**24  # protobuf's limit, with room


class PrecisionError(TrtattnError):
    """AutoCast could not convert the model, or its matmul work cannot be counted."""

    log: str = ""  # AutoCast's own log, when it has one to say why


class NotRunnableOnCpu(TrtattnError):
    """Neither ONNX Runtime's CPU provider nor onnx's reference evaluator runs the model."""

def declared_types(model: onnx.ModelProto) -> dict[str, int]:
    """Elem types the model states: initializers, value_info, inputs and outputs."""
    types = {i.name: i.data_type for i in model.graph.initializer}
    for vi in [*model.graph.value_info, *model.graph.input, *model.graph.output]:
        types[vi.name] = vi.type.tensor_type.elem_type
    return types


def model_precision(model: onnx.ModelProto) -> tuple[str, str] | None:
    """('bf16' or 'fp16', what says so) for a model that computes in that precision: the float type holding the
    most of its weights (initializers and Constants, counted by element; read from their dims, so weights left on
    disk stay there), else of its inputs and outputs; None for a model in fp32."""
    graph = model.graph
    weights = [*graph.initializer, *(a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                                      if a.name == "value")]
    elements: dict[TensorProto.DataType, int] = {}
    for t in weights:
        if t.data_type in FLOATS:
            elements[t.data_type] = elements.get(t.data_type, 0) + math.prod(t.dims)
    where = "weights"
    if not elements:
        where = "inputs and outputs"
        for v in [*graph.input, *graph.output]:
            if v.type.tensor_type.elem_type in FLOATS:
                elements[v.type.tensor_type.elem_type] = elements.get(v.type.tensor_type.elem_type, 0) + 1
    if not elements:
        return None
    most = max(elements, key=lambda t: elements[t])
    return None if most == TensorProto.FLOAT else (DTYPE_NAMES[most], where)


def chosen_precision(model: onnx.ModelProto, asked: str | None, default: str = "fp16") -> tuple[str, str | None]:
    """The precision a route works in, and why when the user did not say: the one asked (--precision) always; else
    the model's own bf16 or fp16 (model_precision); else `default`, the route's for an fp32 model."""
    if asked is not None:
        return asked, None
    found = model_precision(model)
    if found is not None:
        return found[0], f"precision {found[0]}, from the model's {found[1]} (no --precision given)"
    return default, f"precision {default}, the default for a model in fp32 (no --precision given)"
