"""precision: whole-model FP16 / BF16 by NVIDIA ModelOpt's AutoCast, measured and checked on CPU.

    converted = convert(model, "fp16", calibration_feeds=[feeds])
    converted.model, converted.kept_fp32    # the mixed model; {node: why it computes in fp32}
    converted.table                         # share of matmul work per dtype: {"fp16": 0.99, "fp32": 0.01}
    verify(model, converted.model, [feeds]) # VerificationError past verify.tolerance.CONVERSION_BOUNDS or on a NaN

TensorRT >= 11 networks are strongly typed: the ONNX dtypes are the engine's. AutoCast converts the
model and its classifier keeps in fp32 what is numerically sensitive (I/O beyond 512 in magnitude on
the calibration data: masks from finfo(float32).min, their Where/Add, the Softmax reading them;
initializers beyond fp16's range); this module never re-decides that. It adds three things AutoCast
cannot see:
- every ONNX `Attention` is forced into the low precision (`nodes_to_include`): its finfo.min mask
  would keep it fp32, while IAttention computes in its query's dtype and wants the mask in that dtype;
- fp16: that mask is clamped to fp16's replacing fill (finfo(float16).min / 2) in fp32 before AutoCast's
  Cast, which would turn -3.4e38 into -inf (a fully masked row is then NaN in a softmax); not to fp16's
  lowest value, which ONNX Runtime reads as -inf (DeBERTa's padded query rows: 0.69 of the output's
  range); -inf stays -inf. A query row the fp32 mask masks everywhere (<= -1e9: its logits round away
  and the row is uniform) gets a zero query, since no fp16 fill swamps the logits in a kernel that
  accumulates in fp32 (TensorRT's, the plugins': DeBERTa-v2's padded queries were 0.34 off). bf16 has
  fp32's range;
- position arithmetic stays fp32: rotary angles (float nodes from the positions to Sin/Cos; fp16 spaces
  values 0.03 apart at 32..64 and 0.25 at 256..512, under AutoCast's 512 limit: Llama at seq 400, 3.3x
  the error), and indices computed in float (from positions to a Cast to an integer: DeBERTa's buckets).

AutoCast 0.47 reads the model from a path (external data too), then holds all weights and deep copies
of the model while ONNX Runtime runs it over every tensor. fp16 keeps the opset (>= 13), bf16 raises
it to 22; metadata_props are dropped (restored here). Ops outside the ONNX domains are TensorRT
plugins to it (it needs TensorRT) and it moves com.microsoft ops named like ONNX ops (Attention,
RotaryEmbedding) into the ONNX domain, whose inputs differ: such models are refused, nodes named.

ONNX Runtime's CPU provider (1.32) runs the fp16 models; it has no bfloat16 kernel for MatMul, Gemm,
Conv, Add, Mul, Pow, Softmax, Attention..., so a bf16 model is checked emulated on it (emulate.py: every bf16
tensor rounded to bf16, each op computed in fp32; no bf16 kernel runs), else on onnx's reference evaluator
(numpy over ml_dtypes' bfloat16), and compare() names the runner. A model holding fp16 converted to bf16 (or
the reverse) is widened to fp32 first (widen.py): AutoCast goes between fp32 and one low precision.
"""

from .autocast import Converted, convert, load_autocast
from .check import OutputError, compare, cpu_runner, ort_support, verify
from .common import NotRunnableOnCpu, PrecisionError
from .form import FormPrecision, caches_in_low_precision, convert_form
from .work import Work, matmul_work, precision_table

__all__ = ["Converted", "FormPrecision", "NotRunnableOnCpu", "OutputError", "PrecisionError",
           "Work", "caches_in_low_precision", "compare", "convert", "convert_form", "cpu_runner", "load_autocast",
           "matmul_work", "ort_support", "precision_table", "verify"]
