"""`trtattn build`: from an exported ONNX model to a TensorRT engine with one IAttention per site.

    prepared = prepare(model, name="llama", form="padded")    # no TensorRT needed
    print(describe(prepared.plan))
    engine_path, sidecar_path = build(prepared, trt, "engines")  # TensorRT >= 11

prepare: fuse every site into the standard ONNX op and verify it on ONNX Runtime, derive the
requested form (trtattn/forms.py), plan the lowering, cut the lowered ops out for the OnnxParser.
build: parse, lower, configure (profiles, timing cache, progress), build, write engine + sidecar.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from .errors import TrtattnError
from .graph.inputs import resolve_dims
from .report import table
from .rewrite import forms
from .rewrite.forms import FORMS
from .rewrite.fuse import FuseResult, fuse_model
from .trt.config import apply_overrides, default_profile
from .trt.cut import CutModel, cut
from .trt.plan import BuildPlan, io_contract, make_plan
PRECISIONS = ("fp16", "bf16", "fp32")


@dataclass
class Prepared:
    model: onnx.ModelProto
    fused: FuseResult
    form_model: onnx.ModelProto
    plan: BuildPlan
    cut: CutModel
    source: str = ""


def prepare(model: onnx.ModelProto, *, name: str, form: str = "padded", precision: str = "fp16",
            dims: dict | None = None, decomposable: bool = False, shapes: tuple[dict, dict, dict] = ({}, {}, {}),
            progress=None, source: str = "", mark_sites: bool = False) -> Prepared:
    if form not in FORMS:
        raise TrtattnError(f"unknown form '{form}'; choose one of {', '.join(FORMS)}")
    if precision not in PRECISIONS:
        raise TrtattnError(f"unknown precision '{precision}' for the attention; choose one of {', '.join(PRECISIONS)}"
                           " (FP8/INT8 come from `trtattn normalize --quantize`)")
    fused = fuse_model(model, dims=dims, progress=progress)
    failed = [r for r in fused.reports if r.status != "fused"]
    if failed:
        raise TrtattnError(f"{len(failed)} of {len(fused.reports)} attention sites cannot be fused, so the engine "
                           f"would not be all-IAttention: " + "; ".join(f"{r.site.name}: {r.reason}" for r in failed[:3]))
    if not fused.reports:
        raise TrtattnError("the model has no attention; nothing for trtattn to build (use trtexec for it)")
    derived = forms.derive(form, model, fused, dims=dims, progress=progress)
    form_model, packed_lengths, sites = derived.model, derived.packed_lengths, derived.sites
    plan = make_plan(form_model, name=name, form=form, precision=precision, sites=sites, causal=derived.causal,
                     packed_lengths=packed_lengths, decomposable=decomposable)
    plan.mark_sites = mark_sites
    cut_model = cut(form_model, plan.lowered())
    io_contract(form_model, cut_model.inputs, plan)
    plan.profiles = apply_overrides(default_profile(plan.inputs, resolve_dims(form_model, dims)), *shapes)
    plan.notes += derived.notes
    if precision == "fp32":
        plan.notes.append("fp32 attention has no fused kernel: expect the build to fail unless --decomposable")
    return Prepared(model, fused, form_model, plan, cut_model, source)


def describe(plan: BuildPlan) -> str:
    rows = [{"site": a.site, "layer": a.layer, "form": a.form, "heads": f"{a.q_heads}/{a.kv_heads}",
             "head": a.head_size, "q_scale": a.q_scale, "causal": a.causal,
             "mask": a.mask_kind if a.mask else "-", "kv_lengths": a.kv_lengths or "-", "precision": a.precision}
            for a in plan.attentions]
    lines = [f"build plan for {plan.name}: {len(plan.attentions)} IAttention ({plan.form}, attention in "
             f"{plan.precision}), {len(plan.ropes)} rotary embedding, {len(plan.cache_updates)} KV-cache update layers",
             table(rows, [("site", "site"), ("layer", "IAttention layer"), ("form", "form"), ("heads", "heads q/kv"),
                          ("head", "head"), ("q_scale", "Q scale"), ("causal", "causal"), ("mask", "mask"),
                          ("kv_lengths", "kv lengths"), ("precision", "precision")])]
    lines.append("engine inputs:  " + ", ".join(f"{i['name']}{i['shape']}:{i['dtype']}" for i in plan.inputs))
    lines.append("engine outputs: " + ", ".join(f"{o['name']}{o['shape']}:{o['dtype']}" for o in plan.outputs))
    for out, inp in plan.aliases.items():
        lines.append(f"in place:       {out} aliases {inp}")
    for p in plan.profiles:
        lines.append(f"profile:        {p['name']} min {p['min']} opt {p['opt']} max {p['max']}")
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
