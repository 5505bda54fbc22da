"""Runners for the comparator, one interface (Polygraphy's BaseRunner) for every back end:

- ONNX Runtime on an ONNX model (the original, a fused, normalised or form model);
- ONNX Runtime with trtattn's custom ops for TensorRT's own ONNX ops (plugins/), when a model has them;
- a TensorRT engine (trtattn.trt.runner, only where TensorRT is installed).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import onnx

from ..graph.io import extra_outputs, session_source


def quiet_polygraphy() -> None:
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR


def onnx_runner(stack: contextlib.ExitStack, model: onnx.ModelProto, outputs=(), name: str | None = None):
    """A Polygraphy ONNX Runtime runner for `model` that also outputs `outputs`, valid while `stack` is
    open. Past 2 GB the model goes to a temporary file with external data; the session is made when
    Polygraphy activates the runner, so only one model is in ONNX Runtime at a time."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    stack.enter_context(extra_outputs(model, outputs))
    source = stack.enter_context(session_source(model))
    return OnnxrtRunner(SessionFromOnnx(source, providers=["cpu"]), name=name)


def engine_runner(engine: Path, sidecar: dict | None = None):
    """(runner, engine input names, cache input names) for a serialized TensorRT engine."""
    from ..trt.runner import engine_runner as make

    return make(Path(engine), sidecar)
