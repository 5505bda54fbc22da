"""How many intra-op threads an ONNX Runtime session of trtattn's own checks gets (probe, measure, verification,
the default-session reload), decided by the model's weights.

ONNX Runtime gives a session one intra-op thread per core by default, its extra threads spinning while they wait
for work. On a model of a few MB every op is microseconds of work: waking the pool and joining it when the session
is freed cost more than splitting the op saves. Measured on the zoo's TorchScript BART (2.5 MB of weights; open, run
the verification's 2 feed sets, free; median of 10 on this 2-core machine under load): 0.181 s wall and 0.058 s CPU
with the default pool, 0.089 s and 0.027 s on one thread (dynamo Llama: 0.036 -> 0.013 s wall). A model whose
weights are more than SINGLE_THREAD_BYTES keeps ONNX Runtime's default, where splitting a MatMul over the cores
pays.

The thread count changes neither which graph optimizations run nor the kernels chosen: a session that only checks
whether ONNX Runtime builds the model (validate.onnx_runtime_refusal) is the same session on one thread.

A leaf: it imports nothing of trtattn's.
"""

from __future__ import annotations

# Up to this many bytes of weights a session runs on one intra-op thread (the zoo's small exports are 1-30 MB;
# the 2 GB and 8B Llamas keep the default pool).
SINGLE_THREAD_BYTES = 64 << 20


def set_threads(options, weights: int) -> None:
    """One intra-op thread in `options` (onnxruntime.SessionOptions) for a model of `weights` bytes up to
    SINGLE_THREAD_BYTES; ONNX Runtime's default (one per core) above."""
    if weights <= SINGLE_THREAD_BYTES:
        options.intra_op_num_threads = 1
