"""trtsim: check the TensorRT builder against the real TensorRT Python bindings and execute what it
emits with a numpy reference, on machines without TensorRT or a GPU.

- bindings.load_bindings(workdir): the real `tensorrt_bindings` module, importable via stub libraries.
- checked.checked(real_trt): a recording, checking stand-in for the `tensorrt` module; the checker is
  simulation.py, the recorded objects are values.py (dims, the call record), objects.py (weights, tensors,
  layers, IAttention), network.py, builder.py (builder, config, profiles) and parser.py (ONNX parts);
  shapes.py and validate.py are TensorRT's shape rules and the checks a build would fail on.
- execute.run(network, feeds): evaluate a recorded network (numpy, qdq.py for Q/DQ layers, trtattn_plugins'
  reference for IAttention and KV-cache updates, ONNX Runtime for ONNX parts).
- fixtures: the session fixtures `real_trt` and `checked_trt` (skip with the reason when unavailable).
"""

from .checked import aliased_inputs
from .errors import (
    ArgumentError,
    BuildValidationError,
    ExecutionError,
    MissingMemberError,
    NetworkError,
    NotEmulatedError,
    ShapeError,
)
from .values import NotAnEngine

__all__ = [
    "ArgumentError",
    "BuildValidationError",
    "ExecutionError",
    "MissingMemberError",
    "NetworkError",
    "NotAnEngine",
    "NotEmulatedError",
    "ShapeError",
    "aliased_inputs",
]
