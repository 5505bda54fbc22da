"""fuse and normalize on a bf16 model ONNX Runtime's CPU provider cannot open (it has no bf16 MatMul, Softmax...).

The model is read widened to fp32, exactly (precision/check.py bf16_read_widened, as the TensorRT route reads it):
sites are matched, probed and verified there. The sites that verified are then rewritten in the bf16 model itself,
so every tensor the rewrite makes takes the type of the tensors it comes from, as in any model: the written model
keeps the original's types. It is verified emulated (precision/emulate.py: every bf16 tensor rounded, each op in
fp32) against the original emulated, and must pass onnx's full check and strict shape inference as the original
does. ONNX Runtime's CPU provider cannot load it, nor the original: nothing written loads less than the input.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import TrtattnError
from ..graph import validate
from ..site import SiteStatus
from ..verify import Outcome, Tolerance, Verification, compare_models, loosened
from . import verdicts
from .precision.check import bf16_read_widened
from .precision.common import declared_types
from .precision.emulate import bf16_emulated

RUN_ON = "emulated in fp32 (no bf16 kernel on CPU)"
NOTE = ("the model is bf16: ONNX Runtime's CPU provider cannot run it (its CUDA provider can); matched and verified "
        "on it widened to fp32 (exact), written in its own bf16 types, checked emulated against the original")


def read_widened(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` widened to fp32 (exact) when it holds bf16 ONNX Runtime's CPU provider cannot open, else None."""
    read = bf16_read_widened(model, "bf16")
    return None if read is None else read[0]


def verify_emulated(original: onnx.ModelProto, written: onnx.ModelProto, sites, *, dims, seed: int, inputs,
                    atol: float | None = None, rtol: float | None = None, progress=None) -> Outcome:
    """`written` against `original` (both bf16), each emulated in fp32, within the bf16 rewrite tolerance (or the
    user's atol/rtol when looser); `inputs` (GivenInputs, or None) as given for the original."""
    reference, candidate = bf16_emulated(original), bf16_emulated(written)
    given = inputs.widened(reference) if inputs is not None else None
    bound = loosened(Tolerance(atol or 0.0, rtol or 0.0), "bf16")
    return compare_models(reference, candidate, sites, dims=dims, seed=seed, atol=bound.atol, rtol=bound.rtol,
                          given=given, progress=progress)


def rewritten(written: onnx.ModelProto, active: list, meanings: dict, rewrite) -> onnx.ModelProto | None:
    """The sites (fuse's SiteReports) verified on the widened model rewritten by `rewrite` in the bf16 model
    `written` itself, whose tensors give the new ones their types; None when one did not rewrite there (it is not
    fused, with why)."""
    twins = [dataclasses.replace(r, site=s) for r, s in zip(active, typed_sites([r.site for r in active], written))]
    fused = rewrite(written, twins, meanings)
    lost = [(r, t) for r, t in zip(active, twins) if t.status != SiteStatus.FUSED]
    for r, t in lost:
        r.status, r.reason = SiteStatus.NOT_FUSED, f"in bf16: {t.reason}"
    for r, t in zip(active, twins):
        r.attention_node = t.attention_node
    return None if lost else fused


def typed_sites(sites: list, model: onnx.ModelProto) -> list:
    """The sites (AttentionSites found on the widened model) in `model`'s own types: the tensors a rewrite makes for
    a site take its dtype."""
    known = types(model)
    return [s.replace(dtype=_dtype_name(known.get(s.query), s.dtype)) for s in sites]


def checked(written: onnx.ModelProto, fused: onnx.ModelProto, active: list, *, dims, seed: int, inputs,
            atol: float | None, rtol: float | None, progress, widened: Verification) -> Verification | None:
    """The verification record of the bf16 model `fused` against `written`, both emulated, with the fp32 one of
    the widened model; None when the model is not typed as the original or a site (fuse's SiteReports) failed
    (those are not fused, with why)."""
    changed = type_change(written, fused)
    if changed is not None:
        for r in active:
            r.status, r.reason = SiteStatus.NOT_FUSED, changed
        return None
    with progress.step(f"verifying the bf16 model against the original, {RUN_ON}"):
        outcome = verify_emulated(written, fused, [r.site for r in active if not r.site.graph], dims=dims, seed=seed,
                                  inputs=inputs, atol=atol, rtol=rtol, progress=progress)
    for r in active:
        r.max_abs_err = verdicts.site_error(r, outcome)
    if not outcome.passed:
        bad = [r for r in active if not outcome.within(r.site.output, r.max_abs_err)]
        for r in bad or active:
            why = verdicts.verify_reason(r, outcome) if bad else verdicts.output_reason(outcome)
            r.status, r.reason = SiteStatus.NOT_FUSED, f"{why} ({RUN_ON})"
        return None
    summary = outcome.summary()
    summary.run_on = RUN_ON
    summary.widened_fp32 = widened.headline()
    return summary


def _dtype_name(elem_type: int | None, default: str) -> str:
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))) if elem_type else default


def type_change(original: onnx.ModelProto, written: onnx.ModelProto) -> str | None:
    """None when `written` is as valid as `original` (onnx's full check and strict shape inference: no failure the
    original has not) and types every input, output and tensor it kept from the original as the original does;
    else what differs, in one line."""
    old = {(f.check, f.subject) for f in validate.findings(original)}
    new = [f for f in validate.findings(written) if (f.check, f.subject) not in old]
    if new:
        return f"the bf16 model written fails onnx's checks where the original passes: {new[0].text}"
    before, after = types(original), types(written)
    for name, t in before.items():
        if name in after and after[name] != t:
            return (f"tensor '{name}' would be {TensorProto.DataType.Name(after[name])} where the original has "
                    f"{TensorProto.DataType.Name(t)}")
    io = lambda m: [(v.name, v.type.tensor_type.elem_type) for v in [*m.graph.input, *m.graph.output]]  # noqa: E731
    if io(original) != io(written):
        return "the inputs and outputs would differ from the original's"
    return None


def types(model: onnx.ModelProto) -> dict[str, int]:
    """Every tensor's element type, by onnx's strict shape inference."""
    try:
        return declared_types(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    except Exception as e:  # onnx's inference errors have no public common base
        raise TrtattnError(f"onnx's shape inference fails on the bf16 model: {' '.join(str(e).split())[:200]}") from None
