"""The FP8 / INT8 model `trtattn build --precision fp8|int8` starts from, and what each site's IAttention takes.

    model, summary = quantized_model(original, "fp8", calib)    # ModelOpt PTQ, or the model as it is
    settings = normalization_quantize(reports, "fp8", max_sequence=2048)

A model that already carries Q/DQ (quantized by ModelOpt or another tool) is taken as it is, if its
attention Q/DQ are of the requested type; any other is normalised (the softmax scale on Q: TensorRT's
pattern) and quantized by ModelOpt on the calibration data, checked against fp32 (quantize_checked).

Per site (the matcher records its Q/DQ: AttentionSite.quant): the Q/DQ on Q, K and V stay in the graph and
feed IAttention; the Q/DQ after the softmax becomes its normalization quantize type and scale. A site
outside the published fused-kernel limits (INT8: head size 16, 32 or 64, sequence <= 512) keeps its Q/DQ
inputs but computes in the model's float type, and the plan names it with why.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from ...errors import TrtattnError
from ...graph.precision import numpy_precision
from ...report import verdict
from ...verify.tolerance import QUANTIZATION_REL_L2
from .accuracy import quantize_checked
from .calibration import load_calibration
from .ptq import QuantSummary
from .sites import QDQ_DTYPES

INT8_HEAD_SIZES = (16, 32, 64)
INT8_MAX_SEQUENCE = 512


def qdq_types(model: onnx.ModelProto) -> set[str]:
    """The types a model's QuantizeLinear nodes quantize to ("fp8", "int8", or others as ONNX names them)."""
    inits = {i.name: i for i in model.graph.initializer}
    found = set()
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            zero = inits.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            elem = zero.data_type if zero is not None else attrs.get("output_dtype", onnx.TensorProto.UINT8)
            name = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "uint8"
            found.add(numpy_precision(name) or name)
    return found


def quantized_model(model: onnx.ModelProto, mode: str, calib: str | dict | None, *, dims=None,
                    progress=None, feeds: list[dict] | None = None) -> tuple[onnx.ModelProto, QuantSummary]:
    """(the Q/DQ model, what was done). A model with Q/DQ already is kept (its type must be `mode`).
    ModelOpt calibrates on `calib`; its accuracy against fp32 is checked on `feeds` (the user's) or
    generated ones."""
    from ...graph.feeds import make_feeds

    if mode not in QDQ_DTYPES:
        raise TrtattnError(f"unknown quantization '{mode}'; choose one of: {', '.join(QDQ_DTYPES)}")
    found = qdq_types(model)
    if found:
        if found != {mode}:
            raise TrtattnError(f"the model is quantized to {', '.join(sorted(found))}, not {mode}: build it with "
                               f"--precision {sorted(found)[0]}" if len(found) == 1 else
                               f"the model mixes quantized types {sorted(found)}; build takes one")
        return model, QuantSummary(mode, "the model's own Q/DQ")
    if calib is None:
        raise TrtattnError(f"--precision {mode} needs calibration data (--calib DATA.npz, arrays keyed by input name, "
                           "samples along axis 0), or a model ModelOpt has already quantized")
    from ..normalize import normalize_model

    calib = load_calibration(calib) if not isinstance(calib, dict) else calib
    normalized = normalize_model(model, dims=dims, progress=progress)
    if not normalized.ok:
        raise TrtattnError("normalising the model for quantization failed its verification: "
                           f"{verdict(normalized.verification)}")
    if feeds is None:
        feeds = [make_feeds(model, dims=dims, seed=100 + i, padding=False) for i in range(2)]
    quantized, summary, passed = quantize_checked(model, normalized.model, mode, calib, feeds, progress)
    if not passed:
        assert summary.accuracy is not None  # quantize_checked measured it
        raise TrtattnError(f"the {mode} model is off by {summary.accuracy.worst_relative:.3g} of fp32 (tolerance "
                           f"{summary.accuracy.tolerance}): not building it")
    return quantized, dataclasses.replace(summary, source="ModelOpt PTQ")


def fuse_tolerance(model: onnx.ModelProto, mode: str, feeds: list[dict]) -> float:
    """The absolute tolerance the fused Q/DQ model is verified within: the fused op drops the softmax's
    Q/DQ (IAttention re-applies it), which moves the outputs by up to the quantization's own accuracy bound
    (QUANTIZATION_REL_L2 of each output's largest magnitude, as quantize_checked measures it against fp32)."""
    from ..precision import cpu_runner

    run = cpu_runner(model)[0]
    largest = max(float(np.abs(np.nan_to_num(np.asarray(v, np.float64))).max(initial=0.0))
                  for f in feeds for v in run(f).values() if np.issubdtype(np.asarray(v).dtype, np.floating))
    return QUANTIZATION_REL_L2[mode] * max(largest, 1.0)


def normalization_quantize(reports, mode: str, *, max_sequence: int) -> tuple[dict, list[str]]:
    """({Attention node: (type, scale)} for every site IAttention takes quantized, notes naming the others)."""
    settings, notes = {}, []
    for r in reports:
        probs = r.site.quant.probs if r.site.quant is not None else None
        if probs is None:
            notes.append(f"site {r.site.name}: no Q/DQ after its softmax, so no normalization quantize: it computes "
                         "in the model's float type")
            continue
        kind = numpy_precision(probs.dtype)
        if kind != mode or probs.zero_point:
            notes.append(f"site {r.site.name}: its softmax is quantized to {probs.dtype} (zero point {probs.zero_point}); "
                         f"IAttention takes symmetric {mode}: it computes in the model's float type")
            continue
        if mode == "int8":
            head = r.site.head_size
            if head not in INT8_HEAD_SIZES or max_sequence > INT8_MAX_SEQUENCE:
                notes.append(f"site {r.site.name}: TensorRT's fused INT8 attention takes head size 16/32/64 and "
                             f"sequences <= {INT8_MAX_SEQUENCE}; this one has head size {head} and runs to "
                             f"{max_sequence}: it computes in the model's float type (its Q/DQ inputs stay)")
                continue
        elif (r.site.head_size or 0) < 128 and max_sequence < 128:
            notes.append(f"site {r.site.name}: FP8 fused attention pays off from head size or sequence 128 "
                         f"(this one: {r.site.head_size}, <= {max_sequence}); FP16 may be as fast")
        settings[r.attention_node] = (mode, float(probs.scale))
    return settings, notes
