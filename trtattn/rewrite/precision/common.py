"""What the precision modules share: dtype names, limits, tolerances, errors and the model's declared types."""

from __future__ import annotations

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
