"""How far a quantized model is from its fp32 original on ONNX Runtime CPU, through Polygraphy's Comparator.

FP8 on CPU: ONNX Runtime runs QuantizeLinear/DequantizeLinear with float8e4m3fn (opset >= 19), but
its extended graph optimisations fuse DequantizeLinear -> MatMul into MatMulIntegerToFloat, which
rejects float8: both models run at the basic optimisation level.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math

import numpy as np
import onnx

from ...errors import VerificationError
from ...graph.io import session_source
from ...report import Progress
from ...verify.runners import quiet_polygraphy
from ...verify.tolerance import QUANTIZATION_REL_L2
from .ptq import QuantAccuracy, QuantSummary, quantize


def compare(original: onnx.ModelProto, quantized: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> dict:
    """Max abs and relative (L2) error of every float output of `quantized` against `original` on ORT CPU.

    Returns {output: {"max_abs": ..., "rel": ..., "ref_max": ...}} over all feeds (worst case).
    Polygraphy computes each feed's max abs error (SimpleCompareFunc) and the L2 norm of the
    difference (L2CompareFunc); rel is that norm over the reference's. A NaN in either output
    makes both errors inf (Polygraphy's rule: NaN never equals anything)."""
    from polygraphy.comparator import Comparator, L2CompareFunc, SimpleCompareFunc
    from polygraphy.exception import PolygraphyException

    quiet_polygraphy()
    with contextlib.ExitStack() as stack, contextlib.redirect_stdout(io.StringIO()):
        try:
            runs = Comparator.run([_runner(stack, original, "fp32"), _runner(stack, quantized, "quantized")],
                                  data_loader=feeds)
        except PolygraphyException as e:
            raise VerificationError(f"cannot run the fp32 and quantized models on ONNX Runtime: "
                                    f"{str(e).strip().splitlines()[0]}") from None
        # thresholds that always pass: the tolerance is judged on the relative L2 error below
        funcs = [SimpleCompareFunc(check_error_stat="max", atol=math.inf, rtol=math.inf),
                 L2CompareFunc(l2_threshold=math.inf)]
        max_abs, l2 = (next(iter(r.values())) for r in Comparator.compare_accuracy(runs, compare_func=funcs))
    reference, candidate = runs.values()
    errors: dict[str, dict] = {}
    for ref, new, absdiff, dist in zip(reference, candidate, max_abs, l2):
        for name, x in ref.items():
            if not np.issubdtype(x.dtype, np.floating):
                continue
            if name not in absdiff or name not in dist:
                raise VerificationError(f"the quantized model has no output '{name}'")
            if isinstance(absdiff[name], bool):  # Polygraphy's verdict on outputs it cannot compare
                raise VerificationError(f"quantized output '{name}' has shape {list(new[name].shape)}; "
                                        f"the original's is {list(x.shape)}")
            worst_abs, diff_norm = _or_inf(absdiff[name].max_absdiff), _or_inf(dist[name].l2_norm)
            # the reference's scale, with NaN left out (fmax skips it); 0 for an empty output
            ref_max = float(np.fmax.reduce(np.abs(x).ravel(), initial=0.0))
            rel = diff_norm if math.isinf(diff_norm) else \
                diff_norm / max(float(np.linalg.norm(np.asarray(x, np.float64))), 1e-12)
            worst = errors.setdefault(name, {"max_abs": 0.0, "rel": 0.0, "ref_max": 0.0})
            worst["max_abs"] = max(worst["max_abs"], worst_abs)
            worst["rel"] = max(worst["rel"], rel)
            worst["ref_max"] = max(worst["ref_max"], ref_max)
    return errors


def _runner(stack: contextlib.ExitStack, model: onnx.ModelProto, name: str):
    """Polygraphy's ONNX Runtime runner at the basic optimisation level (FP8 Q/DQ; see above)."""
    import onnxruntime as ort
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    ort.set_default_logger_severity(3)  # no optimizer chatter about the Q/DQ nodes
    source = stack.enter_context(session_source(model))
    return OnnxrtRunner(SessionFromOnnx(source, providers=["cpu"],
                                        graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
                        name=name)


def _or_inf(value: float) -> float:
    return math.inf if math.isnan(value) else float(value)


def quantize_checked(original: onnx.ModelProto, model: onnx.ModelProto, mode: str, calib: dict[str, np.ndarray],
                     feeds: list[dict[str, np.ndarray]], progress=None) -> tuple[onnx.ModelProto, QuantSummary, bool]:
    """Quantize `model` (normalised from `original`) and compare it with the fp32 original.
    Returns (quantized model, summary with the per-site table and the accuracy, passed)."""
    progress = progress or Progress(enabled=False)
    with progress.step(f"ModelOpt {mode} quantization, calibrating on CPU"):
        quantized = quantize(model, mode, calib)
    with progress.step(f"comparing the {mode} model with the fp32 original on ONNX Runtime"):
        errors = compare(original, quantized.model, feeds)
    worst = max((e["rel"] for e in errors.values()), default=float("inf"))
    accuracy = QuantAccuracy(errors, worst, QUANTIZATION_REL_L2[mode])
    return quantized.model, dataclasses.replace(quantized.summary(), accuracy=accuracy), accuracy.passed
