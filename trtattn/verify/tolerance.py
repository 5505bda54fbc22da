"""Tolerances: the one table of how far a result may be from its reference, by what is checked (Check) and the
precision it computes in, and the one place that loosens a tolerance to a lower precision (loosened).

Two checks compare with Polygraphy's rule, |new - ref| <= atol + rtol * |ref| per element:

- ENGINE: a TensorRT engine (or the trt-ops model on the plugins' CPU kernels) in the precision it was built
  for, against the ORIGINAL model on ONNX Runtime. The whole model was converted (fp32 -> fp16 by AutoCast,
  or quantized) and TensorRT's kernels accumulate in their own order, so fp16 is 2e-2.
- REWRITE: a rewrite (fuse, normalize, a form) against the model it came from, both on ONNX Runtime, in the
  precision the model computes in: the same arithmetic in another order, rounded to the model's dtype at
  different points, so fp16 is 1e-2, half the engine's.
- FUZZ: the fuzzer's oracle, a fused mutant against its decomposed self: fp32 agrees to ~1e-6 (rtol 1e-3 lets
  large logits through), and a mutant whose products are in fp16 is held to the REWRITE fp16 bound.

Two more measure relative error against the fp32 original (the absolute error scales with each model's
activations): CONVERSION_BOUNDS for a whole-model fp16/bf16 conversion, QUANTIZATION_REL_L2 for a Q/DQ model.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import onnx

from ..errors import TrtattnError
from ..graph.precision import Weighing, model_precision


class Check(Enum):
    ENGINE = "an engine against the original on ONNX Runtime"
    REWRITE = "a rewrite against its original, both on ONNX Runtime"
    FUZZ = "a fused fuzzer mutant against its decomposed self"


class Tolerance(NamedTuple):
    atol: float
    rtol: float


_REWRITE = {"fp32": Tolerance(1e-4, 1e-4), "fp16": Tolerance(1e-2, 1e-2), "bf16": Tolerance(6e-2, 6e-2)}
TOLERANCES: dict[Check, dict[str, Tolerance]] = {
    Check.ENGINE: {"fp32": Tolerance(1e-4, 1e-4), "tf32": Tolerance(1e-3, 1e-3), "fp16": Tolerance(2e-2, 2e-2),
                   "bf16": Tolerance(6e-2, 6e-2), "fp8": Tolerance(2e-1, 2e-1), "int8": Tolerance(2e-1, 2e-1)},
    Check.REWRITE: _REWRITE,
    Check.FUZZ: {"fp32": Tolerance(1e-4, 1e-3), "fp16": _REWRITE["fp16"]},
}

# Per output: "rel" bounds max |new - ref| / max |ref| (a wrong row shows), "rel_l2" ||new - ref|| / ||ref||.
# Measured on the 22 TorchScript zoo exports and their fused forms (padded feeds, seq 7-12; Llama, T5,
# Gemma 3, BART fused also at seq 32 and 60): fp16 rel 0.0007-0.0052, rel_l2 <= 0.0024; bf16 rel
# 0.012-0.10, rel_l2 <= 0.049 (T5 at seq 60 both times).
CONVERSION_BOUNDS = {"fp16": {"rel": 0.02, "rel_l2": 0.01}, "bf16": {"rel": 0.2, "rel_l2": 0.1}}

# A quantized model against the fp32 original on ONNX Runtime CPU: the relative L2 error of every output.
# Measured on the 22 TorchScript zoo exports (4 max-calibrated samples at seq 32, fp16 elsewhere,
# inputs without padding): INT8 0.022-0.085, FP8 (3 mantissa bits) 0.059-0.145, T5 up to 0.26.
QUANTIZATION_REL_L2 = {"int8": 0.15, "fp8": 0.3}


def tolerance(check: Check, precision: str) -> Tolerance:
    """The (atol, rtol) of `check` for `precision`; a precision the check has no bound for is refused."""
    table = TOLERANCES[check]
    if precision not in table:
        raise TrtattnError(f"unknown precision '{precision}'; one of {', '.join(table)}")
    return table[precision]


def loosened(tol: Tolerance, precision: str, given: tuple[bool, bool] = (False, False)) -> Tolerance:
    """`tol` widened to the REWRITE bound of `precision` where it is tighter, except a bound the user gave
    (`given`: atol, rtol), which is kept as asked."""
    low = tolerance(Check.REWRITE, precision)
    return Tolerance(tol.atol if given[0] else max(tol.atol, low.atol),
                     tol.rtol if given[1] else max(tol.rtol, low.rtol))


def requantized(bounds: dict[str, float], moves: dict[str, float]) -> dict[str, float]:
    """Each output's max-abs-error bound widened by how far a dynamic quantizer after the attention moves it
    (`moves`, evaluated by verify/requant.py: the original's own move with its sites moved within their
    bounds). An output no such quantizer reaches has no move and keeps its bound."""
    return {k: v + moves.get(k, 0.0) for k, v in bounds.items()}


def tolerance_for(model: onnx.ModelProto, atol: float | None = None, rtol: float | None = None) -> Tolerance:
    """(atol, rtol) for checking a rewrite of `model` on ONNX Runtime: the given ones, else those of the
    precision it computes in (REWRITE)."""
    default = tolerance(Check.REWRITE, model_precision(model, Weighing.STORED).name)
    return Tolerance(default.atol if atol is None else atol, default.rtol if rtol is None else rtol)
