"""`trtattn build`: from an exported ONNX model to a TensorRT engine with one IAttention per site.

    prepared = prepare(model, name="llama", form="padded", precision="fp16")   # no TensorRT needed
    print(describe(prepared.plan))
    engine_path, sidecar_path = build(prepared, trt, "engines")               # TensorRT >= 11

prepare: fuse every site into the standard ONNX op and verify it on ONNX Runtime, derive the requested
form (rewrite/forms), convert its precision (rewrite/precision.py), plan the lowering (trt/plan.py) with
profiles from the model (trt/profiles.py), cut the lowered ops out for the OnnxParser (trt/cut.py).
build: parse, lower, configure (profiles, timing cache, progress), build, write engine + sidecar.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from .errors import TrtattnError
from .graph.dims import fit_dims
from .report import Progress, table
from .rewrite import forms
from .rewrite.forms import FORMS
from .rewrite.fuse import FuseResult, fuse_model
from .trt import profiles as profiles_mod
from .trt.cut import CutModel, cut
from .trt.plan import BuildPlan, io_contract, make_plan

PRECISIONS = ("fp16", "bf16", "fp32", "fp8", "int8")
QUANTIZED = ("fp8", "int8")
VERIFY_SEEDS = (0, 1)  # the feeds a precision conversion is calibrated and checked on


@dataclass
class Prepared:
    model: onnx.ModelProto
    fused: FuseResult
    form_model: onnx.ModelProto
    plan: BuildPlan
    cut: CutModel
    source: str = ""
    verification: dict = field(default_factory=dict)  # the fp32 form against the original
    precision_check: dict = field(default_factory=dict)  # the converted form against the fp32 form
    quantization: dict = field(default_factory=dict)  # fp8/int8: where the Q/DQ model came from, its accuracy
    source_model: onnx.ModelProto | None = None  # what the engine computes: the Q/DQ model when quantized


@dataclass
class Limits:
    """What the profiles and the cache capacity run to (trt/profiles.py)."""

    max_batch: int = profiles_mod.DEFAULT_MAX_BATCH
    max_positions: int | None = None  # None: from the model
    max_cache: int | None = None  # None: the maximum positions


def fused_sites(model: onnx.ModelProto, *, dims=None, progress=None, atol: float | None = None,
                inputs=None) -> FuseResult:
    """Every attention as the standard ONNX op, verified (on `inputs`, a user's GivenInputs, when given); an
    error naming the sites that are not."""
    return all_fused(fuse_model(model, dims=dims, progress=progress, atol=atol, inputs=inputs))


def all_fused(fused: FuseResult) -> FuseResult:
    """`fused` if every site fused and the model verified; else an error saying what failed."""
    failed = [r for r in fused.reports if r.status != "fused"]
    if failed:
        raise TrtattnError(f"{len(failed)} of {len(fused.reports)} attention sites cannot be fused, so the engine "
                           f"would not be all-IAttention: " + "; ".join(f"{r.site.name}: {r.reason}" for r in failed[:3]))
    if not fused.reports:
        raise TrtattnError("the model has no attention; nothing for trtattn to build (use trtexec for it)")
    v = fused.verification
    if v.get("passed") is False:  # fuse marks its sites not fused then; a result made otherwise is refused too
        worst = max(v.get("outputs", {}).items(), key=lambda kv: kv[1], default=("?", None))
        raise TrtattnError(f"the fused model does not match the original on ONNX Runtime: output '{worst[0]}' is off "
                           f"by {worst[1]} (tolerance atol {v.get('atol')}, rtol {v.get('rtol')}"
                           f"{', in ' + str(v['slices']) + ' slices of layers' if v.get('slices') else ''}"
                           f"{'; NaN where the original has none: ' + ', '.join(v['nan_mismatch']) if v.get('nan_mismatch') else ''})")
    return fused


def prepare(model: onnx.ModelProto, *, name: str, form: str = "padded", precision: str = "fp16",
            io_dtype: str | None = None, calib=None, dims: dict | None = None, decomposable: bool = False,
            shapes: tuple[dict, dict, dict] = ({}, {}, {}), limits: Limits | None = None, progress=None,
            source: str = "", mark_sites: bool = False, inputs=None) -> Prepared:
    """The verified form in `precision` (IO types kept unless io_dtype is the precision; fp8/int8: the model
    ModelOpt quantized on `calib`, or the model's own Q/DQ), its plan and the model TensorRT's parser gets.
    `inputs` (a user's GivenInputs): the fused and form models are verified on exactly these."""
    if form not in FORMS:
        raise TrtattnError(f"unknown form '{form}'; choose one of {', '.join(FORMS)}")
    if precision not in PRECISIONS:
        raise TrtattnError(f"unknown precision '{precision}'; choose one of {', '.join(PRECISIONS)}")
    if io_dtype not in (None, precision) or io_dtype and precision in QUANTIZED:
        raise TrtattnError(f"--io-dtype {io_dtype} with --precision {precision}: the IO is kept as the model has it, "
                           f"or converted to the (fp16/bf16) precision")
    limits = limits or Limits()
    dims = fit_dims(model, dims, progress=progress)  # dims the original runs on: every check below uses them
    start, quantization, atol = model, {}, None
    if precision in QUANTIZED:
        start, quantization, atol = quantized_start(model, precision, calib, dims=dims, progress=progress)
    given = inputs if start is model else None  # a quantized start takes the user's inputs as the original does
    fused = fused_sites(start, dims=dims, progress=progress, atol=atol, inputs=given)
    derived = forms.derive(form, start, fused, dims=dims, progress=progress, inputs=given)
    quantized, notes = {}, []
    if precision in QUANTIZED:
        from .rewrite.quantize.source import normalization_quantize

        quantized, notes = normalization_quantize([r for r in fused.reports if r.status == "fused"], precision,
                                                  max_sequence=limits.max_positions or max_positions_of(start))
    form_model, table, check, more = form_in_precision(derived, start, precision, io_dtype=io_dtype, dims=dims,
                                                       progress=progress)
    plan = make_plan(form_model, name=name, form=form, precision=precision, sites=derived.sites,
                     lowerings=derived.attentions, cache_lowerings=derived.cache_updates, decomposable=decomposable,
                     quantized=quantized, implicit=derived.implicit, implicit_reason=forms.IMPLICIT_REASON)
    plan.mark_sites, plan.right_padded, plan.precision_table = mark_sites, list(derived.right_padded), table
    plan.notes += derived.notes + notes + more
    cut_model = plan_engine_io(plan, start, form_model, limits, shapes)
    if any(a.dtype == "fp32" for a in plan.native) and not decomposable:
        plan.notes.append("fp32 attention has no fused kernel: expect the build to fail unless --decomposable")
    return Prepared(model, fused, form_model, plan, cut_model, source, derived.verification, check, quantization,
                    start)


def quantized_start(model: onnx.ModelProto, mode: str, calib, *, dims=None, progress=None):
    """(the Q/DQ model, what was done, the tolerance its fused form is verified within)."""
    from .graph.feeds import make_feeds
    from .rewrite.quantize.source import fuse_tolerance, quantized_model

    progress = progress or Progress(enabled=False)
    with progress.step(f"quantizing to {mode} (ModelOpt PTQ) unless the model has its Q/DQ"):
        start, info = quantized_model(model, mode, calib, dims=dims, progress=progress)
    feeds = [make_feeds(start, dims=dims, seed=seed) for seed in VERIFY_SEEDS]
    return start, info, fuse_tolerance(start, mode, feeds)


def max_positions_of(model: onnx.ModelProto) -> int:
    positions, _ = profiles_mod.max_positions(model)
    return positions or profiles_mod.DEFAULT_MAX_POSITIONS


def form_in_precision(derived, original: onnx.ModelProto, precision: str, *, io_dtype=None, dims=None,
                      progress=None) -> tuple[onnx.ModelProto, dict, dict, list[str]]:
    """(the form in `precision`, its matmul work per dtype, its check against the fp32 form, notes).
    Calibrated and checked on the original's realistic feeds as the form takes them."""
    from .contract import cache_inputs
    from .rewrite import precision as precision_mod

    adapter = forms.form_adapter(original, [i.name for i in derived.model.graph.input], cache_inputs(derived.model))
    feeds = [adapter.feeds(adapter.original_feeds(dims, seed)) for seed in VERIFY_SEEDS]
    if precision in ("fp32", *QUANTIZED):  # a Q/DQ model's types are ModelOpt's (its high precision: fp16)
        return derived.model, precision_mod.precision_table(derived.model, feeds[0]), {}, []
    progress = progress or Progress(enabled=False)
    with progress.step(f"converting the {derived.form} form to {precision} (ModelOpt AutoCast) and checking it"):
        result = precision_mod.convert_form(derived.model, precision, feeds, caches=derived.cache_updates,
                                            keep_io_types=io_dtype is None)
    return result.model, result.table, result.summary(), result.notes


def plan_engine_io(plan: BuildPlan, original: onnx.ModelProto, form_model: onnx.ModelProto, limits: Limits,
                   shapes: tuple[dict, dict, dict]) -> CutModel:
    """Cut the form for TensorRT's parser (caches at a static capacity), and the engine's I/O and profiles."""
    positions, source = (limits.max_positions, "--max-positions") if limits.max_positions else \
        profiles_mod.max_positions(original)
    if positions is None:
        positions = profiles_mod.DEFAULT_MAX_POSITIONS
        plan.notes.append(f"the model does not say its maximum positions: profiles run to {positions} "
                          "(set --max-shapes / --max-cache)")
    capacity = limits.max_cache or positions
    plan.limits = {"max_batch": limits.max_batch, "max_positions": positions, "max_positions_from": source,
                   "max_cache": capacity if plan.cache_updates else None}
    static = {c.cache: {2: capacity} for c in plan.cache_updates}
    cut_model = cut(form_model, plan.lowered(), static)
    io_contract(form_model, cut_model.model, cut_model.inputs, plan)
    defaults = profiles_mod.default_profiles(plan.inputs, {"max_positions": positions, "max_batch": limits.max_batch})
    plan.profiles = profiles_mod.apply_overrides(defaults, *shapes)
    return cut_model


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
    lines.append("engine inputs:  " + ", ".join(f"{i['name']}{i['shape']}:{i['dtype']}" for i in plan.inputs))
    lines.append("engine outputs: " + ", ".join(f"{o['name']}{o['shape']}:{o['dtype']}" for o in plan.outputs))
    for out, inp in plan.aliases.items():
        lines.append(f"in place:       {out} aliases {inp}")
    lines += [f"                {line}" if i else f"profiles:       {line}"
              for i, line in enumerate(profiles_mod.describe(plan.profiles))]
    if plan.limits:
        lines.append(f"limits:         batch <= {plan.limits['max_batch']}, positions <= {plan.limits['max_positions']} "
                     f"(from {plan.limits['max_positions_from']})"
                     + (f", cache capacity {plan.limits['max_cache']}" if plan.limits.get("max_cache") else ""))
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def build(prepared: Prepared, trt, out_dir: str | Path, *, force: bool = False, timing_cache: Path | None = None,
          workspace_mb: int | None = None, progress: bool = True, logger=None, write: bool = True):
    """Build with the given tensorrt module. Returns (engine path, sidecar path) or, with
    write=False, the serialized engine and the sidecar dict."""
    from .trt import engine as engine_mod
    from .trt.config import create_config
    from .trt.network import build_network

    logger = logger or trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = build_network(trt, builder, logger, prepared.cut, prepared.plan)
    config = create_config(trt, builder, network, prepared.plan.profiles, workspace_mb=workspace_mb,
                           timing_cache=timing_cache, progress=progress)
    blob = engine_mod.build_serialized(trt, builder, network, config)
    if timing_cache is not None:
        engine_mod.atomic_write(Path(timing_cache), bytes(config.get_timing_cache().serialize()))
    info = engine_mod.sidecar(prepared.plan, trt_version=getattr(trt, "__version__", None), source=prepared.source,
                              gpu=engine_mod.gpu_name())
    if not write:
        return blob, info
    return engine_mod.write_engine(blob, info, Path(out_dir), prepared.plan.name, force=force)
