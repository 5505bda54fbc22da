"""Checking a converted model on CPU: ONNX Runtime's CPU provider, for bf16 on the model emulated in fp32 (emulate.py)
or onnx's reference evaluator."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from numpy.typing import DTypeLike
from onnx import TensorProto

from ...errors import TrtattnError, VerificationError
from ...graph.external import set_session_folder
from ...graph.precision import FEED_DTYPES
from ...verify.tolerance import CONVERSION_BOUNDS
from .common import LARGE, NotRunnableOnCpu, PrecisionError, declared_types
from .emulate import EMULATION, bf16_emulated

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
LOW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


@dataclass
class OutputError:
    max_abs: float  # over the elements finite in both
    rel: float  # max_abs / max |reference|
    rel_l2: float  # ||new - ref|| / ||ref||
    nonfinite: int  # elements NaN/inf in one model and not the same in the other
    ref_max: float


def compare(original: onnx.ModelProto | str | os.PathLike, converted: onnx.ModelProto,
            feeds: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, OutputError], str]:
    """Every float output of `converted` against `original` (fp32 on ONNX Runtime CPU) over `feeds`,
    the worst per output; and what ran the converted model."""
    reference, _ = cpu_runner(original)
    candidate, runner = cpu_runner(converted)
    errors: dict[str, OutputError] = {}
    for f in feeds:
        want, got = reference(f), candidate(f)
        for name, ref in want.items():
            if name not in got:
                raise VerificationError(f"the converted model has no output '{name}'")
            if np.issubdtype(np.asarray(ref).dtype, np.floating):
                e, old = _error(np.asarray(ref, np.float64), np.asarray(got[name]).astype(np.float64)), errors.get(name)
                errors[name] = e if old is None else OutputError(
                    max(old.max_abs, e.max_abs), max(old.rel, e.rel), max(old.rel_l2, e.rel_l2),
                    old.nonfinite + e.nonfinite, max(old.ref_max, e.ref_max))
    return errors, runner


def verify(original: onnx.ModelProto | str | os.PathLike, converted: onnx.ModelProto,
           feeds: Sequence[Mapping[str, np.ndarray]], *, precision: str | None = None,
           tolerance: Mapping[str, float] | None = None) -> dict[str, OutputError]:
    """compare(), then a VerificationError naming the output with a NaN/inf where the original has a
    number (or the reverse), or the worst output past CONVERSION_BOUNDS[precision] (updated by `tolerance`)."""
    return verified(original, converted, feeds, precision=precision, tolerance=tolerance)[0]


def verified(original: onnx.ModelProto | str | os.PathLike, converted: onnx.ModelProto,
             feeds: Sequence[Mapping[str, np.ndarray]], *, precision: str | None = None,
             tolerance: Mapping[str, float] | None = None) -> tuple[dict[str, OutputError], str]:
    """verify(), and what ran the converted model (compare())."""
    if precision is None:
        types = {i.data_type for i in converted.graph.initializer}
        precision = "bf16" if TensorProto.BFLOAT16 in types | set(declared_types(converted).values()) else "fp16"
    limit = {**CONVERSION_BOUNDS[precision], **(tolerance or {})}
    errors, runner = compare(original, converted, feeds)
    for name, e in sorted(errors.items(), key=lambda kv: (-kv[1].nonfinite, -kv[1].rel)):
        if e.nonfinite:
            raise VerificationError(f"{precision} output '{name}' has {e.nonfinite} NaN/inf values where the fp32 "
                                    f"original has numbers (or the reverse), on {runner}")
        if e.rel > limit["rel"] or e.rel_l2 > limit["rel_l2"]:
            raise VerificationError(f"{precision} output '{name}' is off by {e.max_abs:.3g} ({e.rel:.3g} of its "
                                    f"largest value {e.ref_max:.3g}, relative L2 {e.rel_l2:.3g}; tolerance "
                                    f"{limit['rel']} / {limit['rel_l2']}) on {runner}")
    return errors, runner


def _error(ref: np.ndarray, new: np.ndarray) -> OutputError:
    if ref.shape != new.shape:
        raise VerificationError(f"output shape {list(new.shape)} differs from the original's {list(ref.shape)}")
    finite = np.isfinite(ref) & np.isfinite(new)
    same = (ref == new) | (np.isnan(ref) & np.isnan(new))  # inf == inf, NaN where the original has NaN
    diff, ref_f = np.abs(ref - new)[finite], ref[finite]
    ref_max = float(np.abs(ref_f).max()) if ref_f.size else 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    rel_l2 = float(np.linalg.norm(diff) / max(np.linalg.norm(ref_f), 1e-12))
    return OutputError(max_abs, max_abs / max(ref_max, 1e-12), rel_l2, int((~finite & ~same).sum()), ref_max)


def ort_support(model: onnx.ModelProto | str | os.PathLike) -> str | None:
    """None when ONNX Runtime's CPU provider can run `model`, else its one-line reason."""
    try:
        _session(model)
    except Exception as e:
        return " ".join(str(e).split())[:300]
    return None


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if isinstance(model, onnx.ModelProto) and model.ByteSize() > LARGE:
        raise TrtattnError("a model over 2 GB runs from its path: pass the path, not the ModelProto")
    if isinstance(model, onnx.ModelProto) and any(n.op_type in QDQ_OPS for n in model.graph.node):
        # ONNX Runtime's extended optimizations fuse Q/DQ into quantized kernels that round otherwise than the
        # Q/DQ ops say (the zoo's int8 BERT attention output moves by 0.054 of 1.6): the ops' meaning, literally
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    elif isinstance(model, onnx.ModelProto) and any(i.data_type in LOW for i in model.graph.initializer):
        # ONNX Runtime 1.32's layout optimizations (level "all") crash the process (SIGSEGV) on the fp16 FSMT
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if isinstance(model, onnx.ModelProto):
        set_session_folder(options, model)  # its weights left on disk: from their folder, not the working directory
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def cpu_runner(model: onnx.ModelProto | str | os.PathLike):
    """(run(feeds) -> {output: array}, what runs it): ONNX Runtime's CPU provider; for a bf16 model it has no
    kernel for, or whose bf16 inputs or outputs its numpy binding cannot pass, the model emulated in fp32 on it
    (emulate.py), else onnx's reference evaluator. Float inputs are cast to the types the model runs them in."""
    if isinstance(model, onnx.ModelProto) and any(
            v.type.tensor_type.elem_type == TensorProto.BFLOAT16 for v in [*model.graph.input, *model.graph.output]):
        return _emulated_runner(model, "its numpy binding passes no bfloat16 input or output")
    try:
        session = _session(model)
    except TrtattnError:
        raise
    except Exception as e:
        why = " ".join(str(e).split())[:300]
        if "NOT_IMPLEMENTED" not in why or not isinstance(model, onnx.ModelProto):
            raise NotRunnableOnCpu(f"ONNX Runtime cannot load the model: {why}") from None
        return _emulated_runner(model, why)
    return _session_runner(session, "ONNX Runtime (CPU)")


def _emulated_runner(model: onnx.ModelProto, why: str):
    """A model ONNX Runtime cannot run as it is (`why`): emulated in fp32 if it holds bf16, else (or if ONNX
    Runtime refuses the emulation too) onnx's reference evaluator."""
    if TensorProto.BFLOAT16 in {*declared_types(model).values(), *(i.data_type for i in model.graph.initializer)}:
        bf16_outputs = {o.name: onnx.helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
                        for o in model.graph.output if o.type.tensor_type.elem_type == TensorProto.BFLOAT16}
        try:
            return _session_runner(_session(bf16_emulated(model)), EMULATION, bf16_outputs)
        except TrtattnError:
            raise
        except Exception as e:  # ONNX Runtime's errors have no public common base
            why = f"{why}; emulated in fp32: {' '.join(str(e).split())[:200]}"
    return _reference_runner(model, why)


def _session_runner(session, runner: str, outputs_as: Mapping[str, DTypeLike] | None = None):
    """outputs_as: outputs returned in another type than the session's (an emulated model's bf16 outputs)."""
    names = [o.name for o in session.get_outputs()]
    casts = {i.name: np.dtype(FEED_DTYPES[i.type]) for i in session.get_inputs() if i.type in FEED_DTYPES}
    return (lambda feeds: _cast(dict(zip(names, session.run(names, _cast(feeds, casts)))), outputs_as or {})), runner


def _reference_runner(model: onnx.ModelProto, why: str):
    from onnx.reference import ReferenceEvaluator

    failed = (f"ONNX Runtime has no CPU kernel for the model ({why}) and onnx's reference evaluator "
              "failed on it")
    try:
        evaluator = ReferenceEvaluator(model)
    except Exception as e:
        raise NotRunnableOnCpu(f"{failed}: {type(e).__name__}: {e}") from None
    names = [o.name for o in model.graph.output]
    casts = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input
             if i.type.tensor_type.elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)}

    def run(feeds):
        try:
            with np.errstate(all="ignore"):  # a Cast of finfo(float32).min overflows to -inf, as on ORT
                return dict(zip(names, evaluator.run(names, _cast(feeds, casts))))
        except Exception as e:
            raise NotRunnableOnCpu(f"{failed}: {type(e).__name__}: {e}") from None

    return run, f"onnx's reference evaluator (ONNX Runtime: {why.split(':')[-1].strip()})"


def _cast(feeds: Mapping[str, np.ndarray], casts: Mapping[str, DTypeLike]) -> dict[str, np.ndarray]:
    return {k: (np.asarray(v).astype(casts[k]) if k in casts else v) for k, v in feeds.items()}


def bf16_read_widened(model: onnx.ModelProto, precision: str) -> tuple[onnx.ModelProto, str | None] | None:
    """A model ONNX Runtime's CPU provider cannot open because it computes in bf16, for the route: (a copy widened
    to fp32, exactly; the IO dtype to convert it back to: 'bf16' when every float input and output is bf16, None when
    none is), or None for a model ONNX Runtime opens. The route verifies the widened model in fp32 and converts it
    to bf16; a PrecisionError when the model asks another precision or mixes bf16 and fp32 IO."""
    import copy

    from ...graph import external
    from .widen import widened

    graph = model.graph
    if TensorProto.BFLOAT16 not in {*declared_types(model).values(), *(i.data_type for i in graph.initializer)}:
        return None
    why = ort_support(model)
    if why is None or "NOT_IMPLEMENTED" not in why:
        return None
    if precision != "bf16":
        raise PrecisionError(f"the model computes in bf16, which ONNX Runtime's CPU provider cannot run ({why[:160]}): "
                             "trtattn reads it widened to fp32 and builds it only with --precision bf16")
    floats = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]
              if v.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)}
    bf16 = [n for n, t in floats.items() if t == TensorProto.BFLOAT16]
    if bf16 and len(bf16) < len(floats):
        other = ", ".join(n for n in floats if n not in bf16)
        raise PrecisionError(f"the model's inputs and outputs mix bf16 ({', '.join(bf16)}) and other float types "
                             f"({other}): trtattn converts the IO of a bf16 model all to bf16 or keeps it all")
    wide, _ = widened(copy.deepcopy(model), "fp16", external.data_dir(model))  # fp16's foreign type is bf16
    return wide, ("bf16" if bf16 else None)
