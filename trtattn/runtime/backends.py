"""The one place the back ends are registered, and `open_session`, which picks one.

    open_session("llama.onnx")              # ONNX Runtime (CPU): runtime/ort.py
    open_session("engines/llama.engine")    # TensorRT through cuda-python: trt/session.py

Both back ends are imported only when chosen, so `import trtattn.runtime` imports neither tensorrt
nor cuda-python. This registry is where runtime reaches down to trt (by name, on first use); the back ends
implement trtattn/session.py's interface, which sits below both, so nothing in trt imports runtime (no arrow back up,
no import cycle).
"""

from __future__ import annotations

from ..contract import is_engine_path
from ..errors import TrtattnError
from ..session import Session


def _ort():
    from .ort import OrtSession

    return OrtSession


def _tensorrt():
    from ..trt.session import TrtSession

    return TrtSession


BACKENDS = {"ort": _ort, "tensorrt": _tensorrt}  # name -> the Session class, imported on first use


def open_session(model, *, backend: str = "auto", **options) -> Session:
    """An ONNX model (path, bytes or ModelProto) on ONNX Runtime, or a serialized engine on TensorRT.
    backend: auto (engines by suffix, contract.ENGINE_SUFFIXES), ort or tensorrt; options go to the
    back end's session (ort: threads, providers; tensorrt: cuda_graph, device, profile)."""
    if backend == "auto":
        backend = "tensorrt" if is_engine_path(model) else "ort"
    if backend not in BACKENDS:
        raise TrtattnError(f"unknown back end '{backend}'; choose auto, {', '.join(BACKENDS)}")
    return BACKENDS[backend]()(model, **options)
