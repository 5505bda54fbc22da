"""Inference harness: one Session interface over ONNX Runtime (CPU) and TensorRT engines
(cuda-python, trtattn.trt.session), KV-cache managers, greedy generation, packed ragged batches and
benchmarks.

    from trtattn.runtime import open_session, generate
    step = open_session("llama-lm.onnx")                  # or engines/llama-lm.engine (TensorRT)
    print(generate(step, [[5, 6, 7], [9, 4]], 8).tokens)

tensorrt and cuda-python are imported only when a TensorRT session is opened (runtime/backends.py).
"""

from ..session import Session, TensorInfo
from .backends import open_session
from .bench import BenchResult, bench, bench_callable, markdown_table, synthesize_feeds
from .cache import ConcatCache, KVCache, StaticCache, make_cache
from .generate import Generation, generate, generate_encoder_decoder, pack_requests, run_packed, unpack
from .ort import OrtSession

__all__ = [
    "BenchResult", "ConcatCache", "Generation", "KVCache", "OrtSession", "Session", "StaticCache", "TensorInfo",
    "bench", "bench_callable", "generate", "generate_encoder_decoder", "make_cache", "markdown_table",
    "open_session", "pack_requests", "run_packed", "synthesize_feeds", "unpack",
]
