"""Runners for the comparator, one interface (Polygraphy's BaseRunner) for every back end:

- ONNX Runtime on an ONNX model (the original, a fused, normalised or form model);
- ONNX Runtime with trtattn's custom ops for TensorRT's own ONNX ops (plugins/), when a model has them;
- a TensorRT engine (trtattn.trt.runner, only where TensorRT is installed).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections import OrderedDict
from pathlib import Path

import onnx

from .. import timings
from ..graph.evaluate import ort_session
from ..graph.io import extra_outputs
from ..graph.slices import slice_budget, sliced_runner

# Polygraphy asks of every run's outputs whether they are torch tensors unless arrays may be swapped to disk
# (its documented POLYGRAPHY_ARRAY_SWAP_THRESHOLD_MB); asking imports torch (4-6 s here). A threshold no
# output reaches keeps arrays in memory, as the default does, without the question.
os.environ.setdefault("POLYGRAPHY_ARRAY_SWAP_THRESHOLD_MB", str(1 << 30))


def quiet_polygraphy() -> None:
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR


def onnx_runner(stack: contextlib.ExitStack, model: onnx.ModelProto, outputs=(), name: str | None = None,
                level: str = "basic", progress=None):
    """A Polygraphy ONNX Runtime runner for `model` that also outputs `outputs`, valid while `stack` is
    open. The session is made when Polygraphy activates the runner and freed when it deactivates it, so
    only one model is in ONNX Runtime at a time; weights left on disk are memory-mapped, never copied; a
    model whose weights are over half the memory available runs in slices of layers (slices.py).
    `level`: ONNX Runtime's graph optimization level ("basic" by default; see graph.evaluate). `progress`
    (report.Progress) counts the slices of a sliced run."""
    if any(n.domain == "trt" for n in model.graph.node):  # TensorRT's own ops: run by their CPU kernels
        return plugin_runner(stack, model, outputs, name, level)
    if slice_budget(model) is not None:  # weights over half the memory available: one slice of layers at a time
        return sliced_runner(model, outputs, name, level, progress=progress)
    stack.enter_context(extra_outputs(model, outputs))
    return numpy_onnxrt_runner()(lambda: ort_session(model, level=level), name=name)


@functools.cache
def numpy_onnxrt_runner():
    """Polygraphy's OnnxrtRunner for numpy feeds: its own infer asks of every feed whether it is a torch
    tensor, which imports torch (4-6 s) where torch is installed."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    class NumpyOnnxrtRunner(OnnxrtRunner):
        def infer_impl(self, feed_dict):
            start = time.perf_counter()
            values = self.sess.run(None, dict(feed_dict))
            self.inference_time = time.perf_counter() - start
            return OrderedDict(zip((o.name for o in self.sess.get_outputs()), values))

    return NumpyOnnxrtRunner


def plugin_runner(stack: contextlib.ExitStack, model: onnx.ModelProto, outputs=(), name: str | None = None,
                  level: str = "basic"):
    """onnx_runner for a model with TensorRT's own ONNX ops (trt::TRT_Attention, TRT_QuantizedAttention,
    TRT_KVCacheUpdate, as `fuse --ops trt` writes them): ONNX Runtime running them by trtattn_plugins' kernels
    of their documented semantics. A kernel that rejects its inputs fails the run (TrtOpError naming the node)."""
    import trtattn_plugins

    from ..graph import external, io
    from ..graph.evaluate import session_options

    def session():
        timings.session_made()
        large = io.is_large(model)  # trtattn_plugins.Session takes a model over 2 GB by its path, data beside it
        options = session_options(level, weights=io.weights_size(model), folder=None if large else external.data_dir(model))
        if large:
            return trtattn_plugins.Session(stack.enter_context(io.session_source(model)), options=options)
        return trtattn_plugins.Session(model, options=options)

    stack.enter_context(extra_outputs(model, outputs))
    return numpy_onnxrt_runner()(session, name=name)


def engine_runner(engine: Path, sidecar: dict | None = None):
    """(runner, engine input names, cache input names) for a serialized TensorRT engine."""
    from ..trt.runner import engine_runner as make

    return make(Path(engine), sidecar)
