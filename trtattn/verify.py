"""Numerical verification through Polygraphy's Comparator.

On CPU: the rewritten ONNX model against the original, both on ONNX Runtime. The attention
outputs of every site are compared too (they keep their tensor names through the rewrite), so
an error is pinned to the site that caused it. Fully masked rows: where the original gives NaN
the rewrite must give NaN too (both NaN counts as equal), anything else is a mismatch.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import inputs as inputs_mod

# Tolerances by precision (absolute, relative) for engine-vs-ONNX-Runtime checks.
TOLERANCES = {"fp32": (1e-4, 1e-4), "tf32": (1e-3, 1e-3), "fp16": (2e-2, 2e-2), "bf16": (6e-2, 6e-2),
              "fp8": (2e-1, 2e-1), "int8": (2e-1, 2e-1)}


@dataclass
class Outcome:
    passed: bool
    output_errors: dict[str, float] = field(default_factory=dict)
    site_errors: dict[str, float] = field(default_factory=dict)
    iterations: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    nan_mismatch: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"passed": self.passed, "iterations": self.iterations, "atol": self.atol, "rtol": self.rtol,
                "max_abs_err": max(self.output_errors.values(), default=0.0),
                "outputs": self.output_errors, "nan_mismatch": self.nan_mismatch}


def _quiet_polygraphy():
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` that also outputs the tensors `names` (Polygraphy's ModifyOutputs)."""
    from polygraphy.backend.onnx import ModifyOutputs

    existing = [o.name for o in model.graph.output]
    extra = [n for n in names if n not in existing]
    if not extra:
        return model
    return ModifyOutputs(model, outputs=existing + extra, copy=True)()


def max_abs_error(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return float("inf")
    diff = np.abs(np.where(nan_a, 0.0, a) - np.where(nan_b, 0.0, b))
    return float(diff.max()) if diff.size else 0.0


def default_feeds(model: onnx.ModelProto, *, dims=None, seed: int = 0, iterations: int = 2) -> list[dict]:
    return [inputs_mod.make_feeds(model, dims=dims, seed=seed + i) for i in range(iterations)]


def compare_models(original: onnx.ModelProto, candidate: onnx.ModelProto, sites=(), *, dims=None, seed: int = 0,
                   atol: float = 1e-4, rtol: float = 1e-4, feeds: list[dict] | None = None) -> Outcome:
    """Run both models on ONNX Runtime (CPU) through Polygraphy and compare every output."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, CompareFunc

    _quiet_polygraphy()
    site_outputs = [s.output for s in sites if s.output]
    a = with_outputs(original, site_outputs)
    b = with_outputs(candidate, site_outputs)
    feeds = feeds if feeds is not None else default_feeds(original, dims=dims, seed=seed)
    runners = [OnnxrtRunner(SessionFromOnnx(_bytes(a), providers=["cpu"]), name="original"),
               OnnxrtRunner(SessionFromOnnx(_bytes(b), providers=["cpu"]), name="rewritten")]
    with contextlib.redirect_stdout(io.StringIO()):
        results = Comparator.run(runners, data_loader=feeds)
        accuracy = Comparator.compare_accuracy(results, compare_func=CompareFunc.simple(atol=atol, rtol=rtol))
    outcome = Outcome(passed=bool(accuracy), iterations=len(feeds), atol=atol, rtol=rtol)
    (_, ref_runs), (_, new_runs) = list(results.items())[:2]
    graph_outputs = [o.name for o in original.graph.output]
    for ref, new in zip(ref_runs, new_runs):
        for name in ref.keys():
            if name not in new:
                continue
            err = max_abs_error(ref[name], new[name])
            if np.isnan(np.asarray(ref[name], dtype=np.float64)).any() != np.isnan(np.asarray(new[name], dtype=np.float64)).any():
                outcome.nan_mismatch.append(name)
            bucket = outcome.output_errors if name in graph_outputs else outcome.site_errors
            bucket[name] = max(bucket.get(name, 0.0), err)
    # Polygraphy's verdict (elementwise atol or rtol) and a strict bound on the max abs error
    outcome.passed = outcome.passed and all(e <= atol for e in outcome.output_errors.values())
    return outcome


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()
