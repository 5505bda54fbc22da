"""Verification: every rewrite and every engine against the original model, through Polygraphy's
Comparator, with one runner interface (runners.py) for ONNX Runtime, ONNX Runtime with trtattn's custom
ops, and TensorRT engines; adapters.py lines up the I/O of the forms."""

from ..verification import Verification
from .adapters import Adapter, adapter_for
from .candidate import CandidateCheck, verify_candidate
from .compare import (
                      Outcome,
                      compare_models,
                      compare_runners,
                      default_feeds,
)
from .runners import engine_runner, onnx_runner
from .tolerance import Check, Tolerance, loosened, tolerance, tolerance_for

__all__ = ["Adapter", "adapter_for", "CandidateCheck", "Verification", "verify_candidate", "Check", "Tolerance",
           "tolerance", "loosened", "Outcome",
           "compare_models", "compare_runners", "default_feeds", "tolerance_for", "engine_runner",
           "onnx_runner"]
