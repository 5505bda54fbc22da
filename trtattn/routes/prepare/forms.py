"""Forms of a fused model, each still standard ONNX and verified on ONNX Runtime before TensorRT
sees it. The network builder lowers their ops one to one (trt/plan.py, trt/lower.py), following the
records a form leaves where ONNX alone does not say what TensorRT should do (lowering.py).

padded    the fused model, with every rotate-half RoPE rewritten into the ONNX RotaryEmbedding op
          (rope.py) and causal-plus-padding masks as a causal kind plus per-row lengths (padded.py).
kv-cache  decoders: a packed query over a preallocated, padded cache (kv_cache.py): ScatterND writes
          the new K/V at each row's `cache_write_index`, attention reads each row's cache up to its
          length, lower-right causal. The cache outputs alias the cache inputs. Attention ops that take
          their past as inputs get it without --form (op_cache.py: TensorScatter, nonpad_kv_seqlen).

In the padded and kv-cache forms every Attention op is then fitted to what IAttention takes (op_fit.py:
one head size, one mask, per-row lengths, rows without keys zeroed).
packed    encoders and cacheless decoders run on packed tokens [1, T] with `cu_seqlens` [B+1]
          instead of a padding mask; positions restart per sequence (packed.py).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from ...contract import CU_SEQLENS, WRITE_INDEX, cache_inputs, record_form
from ...errors import SitesRefused, TrtattnError
from ...graph.emit import export_like
from ...graph.shapes import tensor_types
from ...report import Progress
from ...site import MaskKind, SiteSource, SiteStatus
from ...verify import Verification, adapter_for, compare_models, compare_runners, onnx_runner
from .implicit import REASON as IMPLICIT_REASON
from .implicit import expand_softcapped
from .kv_cache import kv_cache_form, unowned_caches
from .lowering import AttentionLowering, CacheLowering
from .op_cache import CONTRIB_WHY, cache_form, in_op_caches
from .op_cache import OPSET as OP_CACHE_OPSET
from .op_fit import fit_ops
from .packed import packed_form
from .padded import padding_to_lengths
from .qk_beside import qk_outputs_beside, qk_over_cache
from .rope import rope_to_ops
from .rows import PackedCacheAdapter

FORMS = ("padded", "packed", "kv-cache")
GROUP_QUERY = SiteSource.MS_GROUP_QUERY


@dataclass
class Derived:
    model: onnx.ModelProto
    form: str = "padded"
    sites: dict = field(default_factory=dict)  # Attention node -> AttentionSite
    attentions: dict[str, AttentionLowering] = field(default_factory=dict)  # Attention node -> its lowering
    cache_updates: list[CacheLowering] = field(default_factory=list)
    right_padded: list[str] = field(default_factory=list)  # padding masks the form reads as per-row lengths
    implicit: list = field(default_factory=list)  # (AttentionSite, node) left to TensorRT's implicit fusion
    verification: Verification = field(default_factory=Verification.nothing)
    notes: list[str] = field(default_factory=list)


def choose_form(form: str | None, model: onnx.ModelProto) -> tuple[str, str | None]:
    """(the form, why it was chosen or None when asked for): without a request, kv-cache where an Attention
    op takes its past cache as inputs (that is the only form for them), else padded."""
    in_op = in_op_caches(model)
    if form is None:
        if in_op:
            return "kv-cache", (f"form kv-cache (chosen): {len(in_op)} Attention op(s) take past_key/past_value "
                                "inputs, which become preallocated caches updated in place")
        return "padded", None
    if form not in FORMS:
        raise TrtattnError(f"unknown form '{form}'; choose one of {', '.join(FORMS)}")
    if in_op and form != "kv-cache":
        raise TrtattnError(f"Attention {in_op[0]} takes a past cache inside the op: only the kv-cache form takes it "
                           f"(chosen without --form), not the {form} form")
    return form, None


def derive(form: str | None, original: onnx.ModelProto, fused, *, dims=None, progress=None, inputs=None) -> Derived:
    form, chosen = choose_form(form, fused.model)
    progress = progress or Progress(enabled=False)
    reports = [r for r in fused.reports if r.status == SiteStatus.FUSED]
    sites = {r.attention_node: r.site for r in reports}
    nested = [r.site.name for r in reports if r.site.graph]
    if nested:  # the forms rewrite the main graph; TensorRT's IIfConditional/ILoop bodies are not lowered here
        raise TrtattnError(f"sites {', '.join(nested[:4])}{' ...' if len(nested) > 4 else ''} are inside If/Loop/Scan "
                           "bodies: the forms (and IAttention lowering) take attention in the main graph only; export "
                           "the branch you deploy without the control flow, or use `trtattn fuse` (ONNX Attention)")
    with progress.step("rewriting RoPE into RotaryEmbedding ops"):
        model, ropes = rope_to_ops(fused.model, [r.site for r in reports])
    in_op, offsets = in_op_caches(model), {}
    model, split, cached_qk = qk_outputs_beside(model, sites, in_op)
    derived = Derived(model, form, sites, notes=([chosen] if chosen else []) + _unowned_note(form, model, reports)
                      + ([f"{ropes} RoPE rotations as RotaryEmbedding ops"] if ropes else []) + split)
    lowerings: list[AttentionLowering] = []
    capped = [r.site.name for r in reports if r.site.softcap]
    if capped and form != "padded":
        raise SitesRefused(f"sites {', '.join(capped)} are soft-capped: IAttention cannot take them, and only the "
                           "padded form keeps them in TensorRT's implicit form",
                           [(name, f"its logits are soft-capped (tanh), which IAttention cannot do; the {form} form "
                                   "has no implicit fallback") for name in capped])
    if in_op:
        with progress.step("deriving the KV-cache form of the Attention ops' own caches"):
            try:
                row_keys = frozenset(node for node, site in sites.items() if site.source == GROUP_QUERY
                                     and site.mask == MaskKind.NONE and site.window is None)
                derived.model, (derived.cache_updates, notes, offsets) = _rewrite(
                    derived.model, functools.partial(cache_form, row_keys=row_keys), in_op, opset=OP_CACHE_OPSET)
            except SitesRefused as e:  # named as sites, with why a contrib op's conversion meets the refusal
                refused = [(sites[node].name if node in sites else node,
                            why + CONTRIB_WHY.get(sites[node].source if node in sites else "", ""))
                           for node, why in e.sites]
                raise SitesRefused("; ".join(f"{site}: {why}" for site, why in refused), refused) from None
            derived.notes += notes
    elif form == "kv-cache":
        with progress.step("deriving the KV-cache form (packed query over a preallocated cache)"):
            derived.model, lowerings, derived.cache_updates, derived.right_padded = kv_cache_form(derived.model, reports, dims)
    elif form == "packed":
        with progress.step("deriving the packed form (cu_seqlens, restarting positions)"):
            derived.model, lowerings = packed_form(derived.model, reports)
    else:
        graph = gs.import_onnx(derived.model)
        expanded = expand_softcapped(graph, sites)
        derived.implicit = [(sites[node], node) for _, node in expanded]
        lowerings, derived.right_padded, notes = padding_to_lengths(graph, derived.model, reports, dims)
        derived.notes += notes
        if lowerings or expanded:
            derived.model = export_like(graph, derived.model)
        if lowerings:
            derived.notes.append(f"{len(lowerings)} causal/padding masks as key/value lengths: "
                                 f"{', '.join(derived.right_padded)} must be right-padded (a prefix of ones per row)")
        if expanded:
            derived.notes.append(f"{len(expanded)} soft-capped sites in TensorRT's implicit form: {IMPLICIT_REASON}")
    refitted = bool(in_op or split)
    if form == "padded" or in_op:  # every Attention op fitted to what IAttention takes (op_fit.py)
        lowered = {lw.node for lw in lowerings}
        ops = [n.name for n in derived.model.graph.node if n.op_type == "Attention" and n.name not in lowered
               and n.name in sites]
        fitted_model, (fitted, notes) = _rewrite(derived.model, functools.partial(fit_ops, offsets=offsets), ops)
        if notes or fitted:
            derived.model, derived.notes, refitted = fitted_model, derived.notes + notes, True
            lowerings += fitted
    if cached_qk:  # once the kv-cache form's nodes say all the original's did (their causal offsets folded in)
        derived.model, qk_notes = qk_over_cache(derived.model, cached_qk)
        derived.notes += qk_notes
    derived.attentions = {lw.node: lw for lw in lowerings}
    if form != "padded" or derived.right_padded:  # (the fused model itself needs no record)
        record_form(derived.model, form, derived.right_padded)
    if form == "padded" and not ropes and not lowerings and not derived.implicit and not refitted:
        derived.verification = fused.verification
        return derived
    with progress.step(f"verifying the {form} form against the original on ONNX Runtime"):
        # within the tolerance fuse verified with (the model's precision; a quantized softmax's rounding)
        tolerance = {k: v for k, v in (("atol", fused.verification.atol), ("rtol", fused.verification.rtol))
                     if v is not None}
        derived.verification = verify_form(form, original, derived.model, [r.site for r in reports], dims=dims,
                                           inputs=inputs, **tolerance)
    if not derived.verification.passed:
        rows = derived.verification.lengths
        raise TrtattnError(f"the {form} form does not match the original model on ONNX Runtime "
                           f"(max abs error {derived.verification.max_abs_err}"
                           f"{'; rows of ' + str(rows[0]) if rows else ''}); not building it")
    return derived


def _unowned_note(form: str, model: onnx.ModelProto, reports) -> list[str]:
    """Why a padded plan has no KV-cache update where the graph concatenates caches the kv-cache form cannot own
    (kv_cache.unowned_caches), by reason: the plan says it, not only `--form kv-cache`'s refusal."""
    if form != "padded" or not any(r.site.cache_lengths for r in reports):
        return []
    by_reason: dict[str, list[str]] = {}
    for site, why in unowned_caches(gs.import_onnx(model), reports).items():
        by_reason.setdefault(why, []).append(site)
    return [f"no KV-cache update planned for {', '.join(sites)}: the graph concatenates their caches, which the "
            f"kv-cache form cannot own: {why}" for why, sites in by_reason.items()]


def _rewrite(model: onnx.ModelProto, step, nodes: list[str], opset: int | None = None):
    """(the model with `step(graph, types, nodes)` applied, what the step returned)."""
    graph = gs.import_onnx(model)
    result = step(graph, tensor_types(model), nodes)
    return export_like(graph, model, opset=opset), result


def form_adapter(original: onnx.ModelProto, inputs: list[str], caches: list[str], capacity: int | None = None):
    """How a form (or its engine, whose caches have a static `capacity`) with these inputs takes the
    original's feeds (verify/adapters.py)."""
    if WRITE_INDEX in inputs and CU_SEQLENS in inputs:
        return PackedCacheAdapter(original, inputs, caches, capacity)
    return adapter_for(original, inputs, caches, capacity)


def verify_form(form: str, original: onnx.ModelProto, derived: onnx.ModelProto, sites, *, dims=None,
                atol: float = 1e-4, rtol: float = 1e-4, inputs=None) -> Verification:
    """The form model against the original, both on ONNX Runtime through Polygraphy. A form ONNX Runtime
    cannot run is a TrtattnError naming the node, not a crash: the form does not fit this model."""
    try:
        if form == "padded":
            return compare_models(original, derived, sites, dims=dims, atol=atol, rtol=rtol, given=inputs).summary()
        adapter = form_adapter(original, [i.name for i in derived.graph.input], cache_inputs(derived))
        with contextlib.ExitStack() as stack:
            reference = onnx_runner(stack, original, name="original")
            candidate = onnx_runner(stack, derived, name=form)
            return compare_runners(reference, candidate, adapter, dims=dims, atol=atol, rtol=rtol,
                                   given=inputs).summary()
    except Exception as e:
        if not type(e).__module__.startswith("onnxruntime"):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TrtattnError(f"the {form} form of this model does not run on ONNX Runtime ({first[:300]}); "
                           "not building it") from None
