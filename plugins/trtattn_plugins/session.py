"""An ONNX Runtime session for a model written with TensorRT's trt:: ops."""

from __future__ import annotations

import os
import uuid
import warnings
from pathlib import Path

import onnx
import onnxruntime as ort

from .cpu_model import cpu_model
from .ort_ops import session_options, take_events
from .reference import TrtOpError

_EXTERNAL_DATA_DIR = "session.model_external_initializers_file_folder_path"  # ONNX Runtime config key


class TrtOpWarning(UserWarning):
    """Something TensorRT does silently happened in a trt op (dropped cache writes, rows that
    attend to no key)."""


class Session(ort.InferenceSession):
    """ONNX Runtime (CPU) running a model with trt:: ops through the reference kernels.

    `model`: a ModelProto or a path (its external data is read from the model's folder; the model
    is never modified). `run()` raises TrtOpError naming the node when a trt op rejected its inputs,
    and warns TrtOpWarning for what TensorRT does silently. (run_with_ort_values and IOBinding skip
    that check: their outputs are NaN where an op failed.) Works as Polygraphy's
    `OnnxrtRunner(Session(model))`."""

    def __init__(self, model, *, fully_masked: str = "nan", options: ort.SessionOptions | None = None,
                 providers=("CPUExecutionProvider",)):
        self.trt_tag = uuid.uuid4().hex
        options = session_options(options)
        if isinstance(model, (str, os.PathLike)):
            path = Path(model)
            model = onnx.load(path, load_external_data=False)
            options.add_session_config_entry(_EXTERNAL_DATA_DIR, str(path.resolve().parent))
        cpu = cpu_model(model, fully_masked=fully_masked, tag=self.trt_tag)
        if cpu.ByteSize() >= 2**31:
            raise TrtOpError("the model holds over 2 GB of weights in memory: pass its path instead")
        super().__init__(cpu.SerializeToString(), options, providers=list(providers))

    def run(self, output_names, input_feed, run_options=None):
        take_events(self.trt_tag)
        try:
            outputs = super().run(output_names, input_feed, run_options)
        except Exception as error:
            self._report(error)
            raise
        self._report(None)
        return outputs

    def _report(self, cause) -> None:
        events = take_events(self.trt_tag)
        errors = [f"{node}: {message}" for kind, node, message in events if kind == "error"]
        if errors:
            raise TrtOpError("\n".join(errors)) from cause
        for _, node, message in events:
            warnings.warn(f"{node}: {message}", TrtOpWarning, stacklevel=3)
