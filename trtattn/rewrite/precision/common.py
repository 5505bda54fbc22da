"""What the precision modules share: limits, errors and the model's declared types (the precision
names and dtype maps are graph/precision.py's)."""

from __future__ import annotations

import onnx

from ...errors import TrtattnError
from ...graph.precision import Weighing, model_precision

INSTALL = "pip install 'trtattn[quant]' (NVIDIA ModelOpt without its onnxruntime-gpu)"

MATMUL_OPS = ("MatMul", "Gemm", "Conv", "Attention", "Einsum")
DEFAULT_DIM = 16  # a symbolic dim nobody bound
UNCOUNTED = {"ConvTranspose", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"}
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
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


def chosen_precision(model: onnx.ModelProto, asked: str | None, default: str = "fp16") -> tuple[str, str | None]:
    """The precision a route works in, and why when the user did not say: the one asked (--precision) always; else
    the model's own bf16 or fp16 (graph.precision.model_precision); else `default`, the route's for an fp32 model."""
    if asked is not None:
        return asked, None
    found = model_precision(model, Weighing.COMPUTED)
    if found.name != "fp32":
        return found.name, f"precision {found.name}, from the model's {found.where} (no --precision given)"
    return default, f"precision {default}, the default for a model in fp32 (no --precision given)"
