"""prepare: from an exported ONNX model to the verified form in its precision, its build plan and the model
TensorRT's parser gets; no TensorRT needed. Both routes to an engine start here (routes/builder.py,
routes/trt_ops).

    prepared = prepare(model, name="llama", form="padded", precision="fp16")
    print(describe(prepared.plan))

Fuse every site into the standard ONNX op and verify it on ONNX Runtime, derive the requested form
(forms.py), convert its precision (rewrite/precision), plan the lowering (trt/plan.py) with profiles
from the model (trt/profiles.py), cut the lowered ops out for the OnnxParser (trt/cut.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from ...errors import SitesRefused, TrtattnError
from ...graph.dims import fit_dims
from ...graph.op_dims import op_dims
from ...graph.precision import COMPUTE_PRECISIONS, QUANTIZED
from ...report import Progress, table
from ...rewrite.fuse import FuseResult, fuse_model
from ...site import SiteStatus
from ...trt import profiles as profiles_mod
from ...trt.cut import CutModel, cut
from ...trt.plan import BuildPlan, io_contract, make_plan
from ...verify import Verification
from . import forms
from .forms import FORMS

if TYPE_CHECKING:
    from ...graph.user_inputs import GivenInputs
    from ...rewrite.precision.form import PrecisionCheck
    from ...rewrite.quantize import QuantSummary

VERIFY_SEEDS = (0, 1)  # the feeds a precision conversion is calibrated and checked on


@dataclass
class Prepared:
    model: onnx.ModelProto
    fused: FuseResult
    form_model: onnx.ModelProto
    plan: BuildPlan
    cut: CutModel
    source: str = ""
    verification: Verification = field(default_factory=Verification.nothing)  # fp32 form vs the original
    precision_check: PrecisionCheck | None = None  # the converted form against the fp32 form (None: not converted)
    quantization: QuantSummary | None = None  # fp8/int8: where the Q/DQ model came from, its accuracy
    source_model: onnx.ModelProto | None = None  # what the engine computes: the Q/DQ model when quantized
    inputs: object = None  # the user's GivenInputs every check of this preparation ran on (None: generated)


@dataclass
class Limits:
    """What the profiles and the cache capacity run to (trt/profiles.py)."""

    max_batch: int = profiles_mod.DEFAULT_MAX_BATCH
    max_positions: int | None = None  # None: from the model
    max_cache: int | None = None  # None: the maximum positions


def fused_sites(model: onnx.ModelProto, *, dims=None, progress=None, atol: float | None = None,
                inputs=None) -> FuseResult:
    """Every attention as the standard ONNX op, verified; an error naming the sites that are not."""
    return all_fused(fuse_model(model, dims=dims, progress=progress, atol=atol, inputs=inputs))


def all_fused(fused: FuseResult) -> FuseResult:
    """`fused` if every site fused and the model verified; else an error saying what failed."""
    failed = [r for r in fused.reports if r.status != SiteStatus.FUSED]
    if failed:
        raise SitesRefused(f"{len(failed)} of {len(fused.reports)} attention sites cannot be fused, so the engine "
                           f"would not be all-IAttention: " + "; ".join(f"{r.site.name}: {r.reason}" for r in failed[:3]),
                           [(r.site.name, r.reason) for r in failed])
    if not fused.reports:
        raise TrtattnError("the model has no attention; nothing for trtattn to build (use trtexec for it)")
    v = fused.verification
    if v.failed:  # fuse marks its sites not fused then; a result made otherwise is refused too
        worst = max((v.outputs or {}).items(), key=lambda kv: kv[1], default=("?", None))
        nan = "; NaN where the original has none: " + ", ".join(v.nan_mismatch) if v.nan_mismatch else ""
        raise TrtattnError(f"the fused model does not match the original on ONNX Runtime: output '{worst[0]}' is off "
                           f"by {worst[1]} (tolerance atol {v.atol}, rtol {v.rtol}"
                           f"{', in ' + str(v.slices) + ' slices of layers' if v.slices else ''}{nan})")
    return fused


@dataclass
class Request:
    """What prepare was asked for; the first step checks it."""

    name: str
    form: str | None = None  # None: chosen from the model (forms.choose_form)
    precision: str | None = None  # None: from the model (the first step's chosen_precision)
    io_dtype: str | None = None
    calib: object = None
    dims: dict | None = None
    decomposable: bool = False
    shapes: tuple[dict, dict, dict] = ({}, {}, {})
    limits: Limits = field(default_factory=Limits)
    source: str = ""
    mark_sites: bool = False
    inputs: GivenInputs | None = None  # the user's: the fused and form models are verified on exactly these


@dataclass
class Work:
    """What the steps have made so far: each step sets its own fields from the earlier ones (a field without a
    default is not there until its step has run)."""

    model: onnx.ModelProto
    request: Request
    progress: Progress
    precision: str = field(init=False)  # the request's, else the model's (the first step)
    dims: dict | None = field(init=False)  # the dims the original runs on: every check uses them
    start: onnx.ModelProto = field(init=False)  # the model the sites are fused in: the Q/DQ model when quantized
    quantization: QuantSummary | None = None
    atol: float | None = None  # the tolerance the fused Q/DQ model is verified within
    fused: FuseResult = field(init=False)
    derived: forms.Derived = field(init=False)
    normalization_quantize: dict = field(default_factory=dict)  # Attention node -> quantize type (fp8/int8)
    form_model: onnx.ModelProto = field(init=False)  # the form in its precision
    precision_table: dict = field(default_factory=dict)
    precision_check: PrecisionCheck | None = None
    notes: list[str] = field(default_factory=list)
    contrib_lowered: dict[str, int] = field(default_factory=dict)  # ONNX Runtime's ops lowered: op -> count
    limits: profiles_mod.PlanLimits = field(init=False)
    plan: BuildPlan = field(init=False)
    cut: CutModel = field(init=False)


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Work], None]

    def __str__(self) -> str:
        return self.name


def _check_request(work: Work) -> None:
    from ...rewrite.precision.common import chosen_precision

    r = work.request
    work.precision, why = chosen_precision(work.model, r.precision)
    if why:
        work.notes.append(why)
        work.progress.note(why)
    precision = work.precision
    if r.form is not None and r.form not in FORMS:
        raise TrtattnError(f"unknown form '{r.form}'; choose one of {', '.join(FORMS)}")
    if precision not in COMPUTE_PRECISIONS:
        raise TrtattnError(f"unknown precision '{precision}'; choose one of {', '.join(COMPUTE_PRECISIONS)}")
    if r.io_dtype not in (None, precision) or r.io_dtype and precision in QUANTIZED:
        raise TrtattnError(f"--io-dtype {r.io_dtype} with --precision {precision}: the IO is kept as the model has "
                           f"it, or converted to the (fp16/bf16) precision")


def _read_bf16(work: Work) -> None:
    """A bf16 model ONNX Runtime cannot run is worked on widened to fp32 (exact), its IO converted back to bf16;
    the user's bf16 inputs are widened with it (exact), so every check runs on them."""
    from ...rewrite.precision.check import bf16_read_widened

    read = bf16_read_widened(work.model, work.precision)
    if read is not None:
        work.model, io_dtype = read
        work.request.io_dtype = work.request.io_dtype or io_dtype
        if work.request.inputs is not None:
            work.request.inputs = work.request.inputs.widened(work.model)
        work.notes.append("the bf16 model is read widened to fp32 (exact): ONNX Runtime's CPU provider runs no bf16 "
                          "kernel, so the fused form is verified in fp32 on the model's bf16 values, the bf16 form "
                          "emulated; no bf16 kernel runs")


def _fit_dims(work: Work) -> None:
    work.dims = fit_dims(work.model, work.request.dims, progress=work.progress, given=work.request.inputs)


def _lower_contrib(work: Work) -> None:
    """ONNX Runtime's own ops around attention (Skip/SimplifiedLayerNormalization, MatMulNBits) as standard ONNX,
    each checked on ONNX Runtime against the op on the values it reads (rewrite/lower): AutoCast, the precision
    table and TensorRT's parser know standard ONNX only. Every later check runs against the lowered model."""
    from ...graph.feeds import make_feeds
    from ...rewrite.lower import lower_contrib, lowerable

    if not lowerable(work.model):
        return
    inputs = work.request.inputs
    feeds = inputs.sets if inputs is not None else [make_feeds(work.model, dims=work.dims, seed=s) for s in VERIFY_SEEDS]
    with work.progress.step("lowering ONNX Runtime's own ops to standard ONNX and checking each on ONNX Runtime"):
        lowered = lower_contrib(work.model, feeds)
    if lowered is not None:
        work.model = lowered.model
        work.contrib_lowered = lowered.counts()
        work.notes.append(lowered.note())


def _quantize(work: Work) -> None:
    work.start = work.model
    if work.precision in QUANTIZED:
        work.start, work.quantization, work.atol = quantized_start(work.model, work.precision,
                                                                   work.request.calib, dims=work.dims,
                                                                   progress=work.progress, inputs=work.request.inputs)


def _given_inputs(work: Work):
    """The user's inputs (GivenInputs, or None: generated ones), which every check runs on at every precision:
    a quantized start (ModelOpt's Q/DQ model) keeps the original's inputs, so it takes them as the original
    does. (ModelOpt's calibration stays on --calib.)"""
    return work.request.inputs


def _fuse(work: Work) -> None:
    work.fused = fused_sites(work.start, dims=work.dims, progress=work.progress, atol=work.atol,
                             inputs=_given_inputs(work))


def _derive(work: Work) -> None:
    work.derived = forms.derive(work.request.form, work.start, work.fused, dims=work.dims, progress=work.progress,
                                inputs=_given_inputs(work))
    work.notes += work.derived.notes


def _normalization_quantize(work: Work) -> None:
    if work.precision not in QUANTIZED:
        return
    from ...rewrite.quantize.source import normalization_quantize

    positions = work.request.limits.max_positions or max_positions_of(work.start, work.request.source or None)
    work.normalization_quantize, notes = normalization_quantize(
        [r for r in work.fused.reports if r.status == SiteStatus.FUSED], work.precision, max_sequence=positions)
    work.notes += notes


def _convert_precision(work: Work) -> None:
    work.form_model, work.precision_table, work.precision_check, notes = form_in_precision(
        work.derived, work.start, work.precision, io_dtype=work.request.io_dtype, dims=work.dims,
        progress=work.progress, inputs=_given_inputs(work))
    work.notes += notes


def _limits(work: Work) -> None:
    limits = work.request.limits
    positions, source = (limits.max_positions, "--max-positions") if limits.max_positions else \
        profiles_mod.max_positions(work.start, work.request.source or None)
    if positions is None:
        positions = profiles_mod.DEFAULT_MAX_POSITIONS
        work.notes.append(f"the model does not say its maximum positions: profiles run to {positions} "
                          "(set --max-shapes / --max-cache)")
    work.limits = profiles_mod.PlanLimits(limits.max_batch, positions, source,
                                          (limits.max_cache or positions) if work.derived.cache_updates else None)


def _plan(work: Work) -> None:
    r, derived = work.request, work.derived
    plan = make_plan(work.form_model, name=r.name, form=derived.form, precision=work.precision, sites=derived.sites,
                     lowerings=derived.attentions, cache_lowerings=derived.cache_updates,
                     decomposable=r.decomposable, quantized=work.normalization_quantize, implicit=derived.implicit,
                     implicit_reason=forms.IMPLICIT_REASON)
    plan.mark_sites, plan.right_padded, plan.precision_table = r.mark_sites, list(derived.right_padded), \
        work.precision_table
    plan.limits, plan.contrib_lowered = work.limits, work.contrib_lowered
    plan.notes += work.notes
    if any(a.dtype == "fp32" for a in plan.native) and not r.decomposable:
        plan.notes.append("fp32 attention has no fused kernel: expect the build to fail unless --decomposable")
    work.plan = plan


def _engine_io(work: Work) -> None:
    """Cut the form for TensorRT's parser (caches at a static capacity), then the engine's I/O and profiles."""
    plan, limits = work.plan, work.limits
    capacity = limits.max_cache  # set exactly when the form has caches
    static = {c.cache: {2: capacity} for c in plan.cache_updates} if capacity is not None else {}
    work.cut = cut(work.form_model, plan.lowered(), static)
    io_contract(work.form_model, work.cut.model, work.cut.inputs, plan, original=work.model)
    fixed = {n: f.value for n, f in op_dims(work.start).fixed.items()}  # a cache's head size, say, is one value
    defaults = profiles_mod.default_profiles(plan.inputs, limits, fixed)
    plan.profiles = profiles_mod.apply_overrides(defaults, *work.request.shapes)


# prepare's steps, in order (as torch_tensorrt lists its lowering passes); describe_steps() prints them
STEPS: tuple[Step, ...] = (
    Step("check the request (form, precision, IO types)", _check_request),
    Step("read a bf16 model widened to fp32 (ONNX Runtime's CPU provider runs no bf16)", _read_bf16),
    Step("fit the dims the original runs on", _fit_dims),
    Step("lower ONNX Runtime's own ops (Skip/SimplifiedLayerNormalization, MatMulNBits) to standard ONNX, each "
         "checked on ONNX Runtime", _lower_contrib),
    Step("quantize to fp8/int8 (ModelOpt PTQ, or the model's own Q/DQ)", _quantize),
    Step("fuse every site into ONNX Attention and verify it", _fuse),
    Step("derive the form (padded, packed, kv-cache) and verify it", _derive),
    Step("plan the softmax output's quantize (fp8/int8)", _normalization_quantize),
    Step("convert the form's precision (ModelOpt AutoCast) and check it", _convert_precision),
    Step("set the limits: batch, positions, cache capacity", _limits),
    Step("plan the lowering (IAttention, KV-cache update, RoPE)", _plan),
    Step("cut the lowered ops out for the parser; engine I/O and profiles", _engine_io),
)


def describe_steps(steps: tuple[Step, ...] = STEPS) -> str:
    return "\n".join(f"{i:2d}. {step}" for i, step in enumerate(steps, 1))


def prepare(model: onnx.ModelProto, *, name: str, form: str | None = None, precision: str | None = None,
            io_dtype: str | None = None, calib=None, dims: dict | None = None, decomposable: bool = False,
            shapes: tuple[dict, dict, dict] = ({}, {}, {}), limits: Limits | None = None, progress=None,
            source: str = "", mark_sites: bool = False, inputs=None, steps: tuple[Step, ...] = STEPS) -> Prepared:
    """The verified form in `precision` (None: the model's own bf16 or fp16, else fp16: chosen_precision; IO types
    kept unless io_dtype is the precision; fp8/int8: the model ModelOpt quantized on `calib`, or the model's own
    Q/DQ), its complete plan and the model TensorRT's parser gets: STEPS run in order."""
    request = Request(name, form, precision, io_dtype, calib, dims, decomposable, shapes, limits or Limits(), source,
                      mark_sites, inputs)
    work = Work(model, request, progress or Progress(enabled=False))
    for step in steps:
        step.run(work)
    return Prepared(work.model, work.fused, work.form_model, work.plan, work.cut, source, work.derived.verification,
                    work.precision_check, work.quantization, work.start, _given_inputs(work))


def quantized_start(model: onnx.ModelProto, mode: str, calib, *, dims=None, progress=None, inputs=None):
    """(the Q/DQ model, what was done, the tolerance its fused form is verified within). The quantized
    model's accuracy and the tolerance are measured on the user's inputs (`inputs`, GivenInputs) when given,
    else on generated ones; ModelOpt calibrates on `calib` either way."""
    from ...graph.feeds import make_feeds
    from ...rewrite.quantize.source import fuse_tolerance, quantized_model

    progress = progress or Progress(enabled=False)
    with progress.step(f"quantizing to {mode} (ModelOpt PTQ) unless the model has its Q/DQ"):
        start, info = quantized_model(model, mode, calib, dims=dims, progress=progress,
                                      feeds=inputs.sets if inputs is not None else None)
    feeds = inputs.sets if inputs is not None else [make_feeds(start, dims=dims, seed=seed) for seed in VERIFY_SEEDS]
    if inputs is not None:
        info = dataclasses.replace(info, inputs=inputs.used())  # what the accuracy and the tolerance were measured on
    return start, info, fuse_tolerance(start, mode, feeds)


def max_positions_of(model: onnx.ModelProto, source=None) -> int:
    positions, _ = profiles_mod.max_positions(model, source)
    return positions or profiles_mod.DEFAULT_MAX_POSITIONS


def form_in_precision(derived, original: onnx.ModelProto, precision: str, *, io_dtype=None, dims=None,
                      progress=None, inputs=None) -> tuple[onnx.ModelProto, dict, PrecisionCheck | None, list[str]]:
    """(the form in `precision`, its matmul work per dtype, its check against the fp32 form, notes).
    Calibrated and checked on the user's inputs (`inputs`, GivenInputs) else the original's realistic feeds,
    as the form takes them."""
    from ...contract import cache_inputs
    from ...rewrite import precision as precision_mod

    adapter = forms.form_adapter(original, [i.name for i in derived.model.graph.input], cache_inputs(derived.model))
    if inputs is not None:
        originals = inputs.sets
    else:
        fitted = adapter.fit(dims)
        originals = [adapter.original_feeds(fitted, seed) for seed in VERIFY_SEEDS]
    feeds = [adapter.feeds(f) for f in originals]
    if precision in ("fp32", *QUANTIZED):  # a Q/DQ model's types are ModelOpt's (its high precision: fp16)
        return derived.model, precision_mod.precision_table(derived.model, feeds[0]), None, []
    progress = progress or Progress(enabled=False)
    with progress.step(f"converting the {derived.form} form to {precision} (ModelOpt AutoCast) and checking it"):
        result = precision_mod.convert_form(derived.model, precision, feeds, caches=derived.cache_updates,
                                            keep_io_types=io_dtype is None)
    return result.model, result.table, result.summary(inputs.used() if inputs is not None else None), result.notes


def describe(plan: BuildPlan) -> str:
    rows = [{"site": a.site, "layer": a.layer if a.reason is None else "-",
             "form": a.query_form if a.query_form == a.kv_form else f"{a.query_form} q / {a.kv_form} kv",
             "heads": f"{a.q_heads}/{a.kv_heads}", "head": a.head_size, "q_scale": a.q_scale, "causal": a.causal,
             "mask": a.mask_kind if a.mask else "-", "kv_lengths": a.kv_lengths or "-", "dtype": a.dtype,
             "nq": a.normalization_quantize_to_type or "-", "reason": a.reason or "-"}
            for a in plan.attentions]
    native = plan.native
    lines = [f"build plan for {plan.name}: {len(native)} IAttention ({plan.form}, {plan.precision}), "
             f"{len(plan.ropes)} rotary embedding, {len(plan.cache_updates)} KV-cache update layers"
             + (f", {len(plan.attentions) - len(native)} sites left to TensorRT's own fusion" if len(native) <
                len(plan.attentions) else ""),
             table(rows, [("site", "site"), ("layer", "IAttention layer"), ("form", "form"), ("heads", "heads q/kv"),
                          ("head", "head"), ("q_scale", "Q scale"), ("causal", "causal"), ("mask", "mask"),
                          ("kv_lengths", "kv lengths"), ("dtype", "dtype"), ("nq", "norm. quantize"),
                          ("reason", "not native because")])]
    if plan.precision_table:
        lines.append("matmul work by dtype: " + ", ".join(f"{k} {v:.1%}" for k, v in
                                                           sorted(plan.precision_table.items(), key=lambda kv: -kv[1])))
    lines.append("engine inputs:  " + ", ".join(f"{i.name}{i.shape}:{i.dtype}" for i in plan.inputs))
    lines.append("engine outputs: " + ", ".join(f"{o.name}{o.shape}:{o.dtype}" for o in plan.outputs))
    for out, inp in plan.aliases.items():
        lines.append(f"in place:       {out} aliases {inp}")
    lines += [f"                {line}" if i else f"profiles:       {line}"
              for i, line in enumerate(profiles_mod.describe(plan.profiles))]
    if (limits := plan.limits) is not None:
        lines.append(f"limits:         batch <= {limits.max_batch}, positions <= {limits.max_positions} "
                     f"(from {limits.max_positions_from})"
                     + (f", cache capacity {limits.max_cache}" if limits.max_cache else ""))
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)
