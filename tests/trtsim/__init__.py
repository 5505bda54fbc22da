"""trtsim: check the TensorRT builder against the real TensorRT Python bindings and execute what it
emits with a numpy reference, on machines without TensorRT or a GPU.

- trtsim.bindings.load_bindings(workdir): the real `tensorrt_bindings` module, importable via stub libraries.
- trtsim.checked.checked(real_trt): a recording, checking stand-in for the `tensorrt` module.
- trtsim.execute.run(network, feeds): evaluate a recorded network (numpy + ONNX Runtime for ONNX parts).
- trtsim.fixtures: the session fixture `real_trt` (skips with the reason when unavailable).
"""

from .checked import NotAnEngine, aliased_inputs
from .errors import (
    ArgumentError,
    BuildValidationError,
    MissingMemberError,
    NetworkError,
    NotEmulatedError,
    ShapeError,
)

__all__ = [
    "ArgumentError",
    "BuildValidationError",
    "MissingMemberError",
    "NetworkError",
    "NotAnEngine",
    "NotEmulatedError",
    "ShapeError",
    "aliased_inputs",
]
