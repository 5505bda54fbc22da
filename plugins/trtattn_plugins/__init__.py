"""ONNX Runtime (CPU) implementations of TensorRT's own ONNX attention ops (domain `trt`):
TRT_Attention, TRT_QuantizedAttention and TRT_KVCacheUpdate, following their documented semantics
(onnx-tensorrt docs/TRT_custom_ops.md), so that a model written with them can be verified on CPU.

    import trtattn_plugins as tp
    tp.check_model(model)                 # [] when every trt node matches the doc
    sess = tp.Session(model)              # an onnxruntime.InferenceSession over a CPU copy
    outputs = sess.run(None, feeds)

onnxruntime-extensions is imported when the first session is made, not here, and without the
transformers and torch its tokenizer converters would import (ort_ops._import_ortx).
"""

from . import reference, schema
from .cpu_model import cpu_model
from .ort_ops import session_options
from .reference import TrtOpError, trt_attention, trt_kv_cache_update, trt_quantized_attention
from .schema import DOMAIN, OPS, check_model, check_node
from .session import Session, TrtOpWarning

__all__ = [
    "DOMAIN", "OPS", "Session", "TrtOpError", "TrtOpWarning", "check_model", "check_node", "cpu_model",
    "reference", "schema", "session_options", "trt_attention", "trt_kv_cache_update", "trt_quantized_attention",
]
