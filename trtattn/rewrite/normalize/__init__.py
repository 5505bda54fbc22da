"""normalize: every pass behind one call, verified against the original.

    cleanup -> match + probe -> per site: q_prescale + mask_form + NaN guard after BMM2 -> dead-node
            cleanup -> verify on ONNX Runtime -> fusability verdicts on the result [-> quantize]

The result keeps to ops TensorRT's ONNX parser supports, so it serves both trtattn's network
builder and `trtexec --onnx` (TensorRT's implicit fusion). A site already in TensorRT's form (scale on Q/K, one
masking op before the Softmax, nothing but Q/DQ after it) is left alone; a model with nothing to improve comes
back unchanged, and the result says so.
A bf16 model ONNX Runtime's CPU provider cannot open is matched and probed widened to fp32 and rewritten in its own
bf16 types, verified emulated (rewrite/bf16.py), as fuse does.
Sites in If/Loop/Scan bodies (a merged decoder's branches, a scripted loop) are rewritten in their body,
and checked through the model's outputs (feeds of two seeds take both branches of an If).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx
import onnx_graphsurgeon as gs

from ...errors import TrtattnError
from ...graph import external
from ...graph.branches import branch_inputs
from ...graph.emit import Emitter, export_like
from ...graph.view import import_graph
from ...match import analyse, logit_ops, probe_feeds, subgraphs
from ...report import Progress
from ...site import AttentionSite, MaskKind, ScalePlacement, SiteOutcome, SiteStatus
from ...site_names import site_scope
from ...verify import Verification
from .. import bf16, driver
from . import canonical
from .cleanup import CleanupStats, cleanup
from .fusability import AFTER_KEYS, Verdict, verdict
from .mask_form import MaskCache, masked_logits
from .probabilities import between, move_nan_guard, move_row_guard, not_documented, row_guard
from .q_prescale import prescaled_logits

if TYPE_CHECKING:
    from ..quantize import QuantSummary

ROW_GUARD_MOVED = "fully-masked-row guard moved after BMM2"


@dataclass
class SiteNormalization(SiteOutcome):
    """normalize's outcome of one site (status REWRITTEN, KEPT or SKIPPED, the reason saying why the last two)."""

    status: SiteStatus = SiteStatus.KEPT
    scale_to: str = "-"
    mask_form: str = "-"
    probabilities: str = "-"  # what normalize did between the Softmax and BMM2
    before: Verdict | None = None  # fusability verdict on the input
    after: Verdict | None = None  # ... on the normalised graph (None: the site was not found there)

    @property
    def action(self) -> str:
        """The report's words: "rewritten", "kept: WHY" or "skipped: WHY"."""
        return self.status.value if self.status == SiteStatus.REWRITTEN else f"{self.status.value}: {self.reason}"

    def after_reasons(self) -> list[str]:
        """Why the normalised site misses TensorRT's implicit fusion, then IAttention (each in words, if it does)."""
        a = self.after
        return [w for w in ("; ".join(a.implicit_why), "; ".join(a.iattention_why)) if w] if a is not None else []

    def rewritten(self) -> None:
        self.status, self.reason = SiteStatus.REWRITTEN, ""

    def row(self) -> dict:
        s = self.site
        return {"name": s.name, "kind": s.kind.value, "heads": f"{s.q_heads}/{s.kv_heads}", "head_size": s.head_size,
                "scale": s.softmax_scale, "scale_before": s.scale_placement.value, "scale_to": self.scale_to,
                "mask_form": self.mask_form, "probabilities": self.probabilities, "action": self.action,
                "max_abs_err": self.max_abs_err,
                "implicit_before": self.before.implicit if self.before else None,
                **(self.after.row() if self.after else dict.fromkeys(AFTER_KEYS))}


@dataclass
class NormalizeResult:
    model: onnx.ModelProto
    sites: list[SiteNormalization]
    changed: bool
    cleanup: CleanupStats
    verification: Verification
    ignored: list = field(default_factory=list)
    quantization: QuantSummary | None = None  # normalize --quantize: what ModelOpt did, its accuracy
    skipped: list = field(default_factory=list)  # attentions the matcher could not take (Skipped: name, reason)
    precision: str = "fp16"  # what the verdicts are for: the one asked, else the model's (chosen_precision)
    precision_choice: str | None = None  # which precision was taken and why, when none was asked
    notes: list[str] = field(default_factory=list)  # for the output: how the model was read (a bf16 model)

    @property
    def ok(self) -> bool:
        return self.verification.passed is not False and not self.skipped and \
            not any(s.status == SiteStatus.SKIPPED for s in self.sites)


def _by_branch(model: onnx.ModelProto, **options) -> NormalizeResult:
    """normalize_model on each branch of a merged decoder (rewrite/branches.py), as one result."""
    from ..branches import by_branch, in_branch, tagged, verification

    cond, results, merged = by_branch(model, normalize_model, **options)
    rows, ignored, skipped = [], [], []
    cleanup_stats = CleanupStats()
    for value, r in results.items():
        rows += [dataclasses.replace(row, site=in_branch(model, cond, value, row.site)) for row in r.sites]
        ignored += [tagged(cond, value, i) for i in r.ignored]
        skipped += [tagged(cond, value, i) for i in r.skipped]
        cleanup_stats += r.cleanup
    return NormalizeResult(merged or model, rows, merged is not None, cleanup_stats, verification(cond, results),
                           ignored, None, skipped)


def already_normal(site) -> bool:
    ops = [s for s in site.mask_steps if not logit_ops.unit(s).scales]
    late = [s for s in site.mask_steps if logit_ops.unit(s).scales]
    return (site.scale_placement in (ScalePlacement.ON_Q, ScalePlacement.ON_K, ScalePlacement.SQRT_ON_QK,
                                     ScalePlacement.NONE)
            and not late and len(ops) <= 1 and all(logit_ops.unit(s).implicit_ok for s in ops))


def normalize_model(model: onnx.ModelProto, *, precision: str | None = None, progress=None,
                    **options) -> NormalizeResult:
    """`model` normalised and verified (within the tolerance of the precision it computes in unless
    atol/rtol are given), its fusability verdicts for `precision` (None: the model's own bf16 or fp16, else fp16:
    chosen_precision); a model whose weights were left on disk is worked on without reading them."""
    from ..precision.common import chosen_precision

    progress = progress or Progress(enabled=False)
    precision, why = chosen_precision(model, precision)
    if why:
        progress.note(why)
    result = _normalized(model, precision=precision, progress=progress, **options)
    result.precision, result.precision_choice = precision, why
    return result


def _normalized(model: onnx.ModelProto, *, fold_scale_into_weights: bool = False, precision: str,
                verify: bool = True, dims: dict | None = None, seed: int = 0, atol: float | None = None,
                rtol: float | None = None, progress: Progress, inputs=None) -> NormalizeResult:
    if branch_inputs(model):  # If branches chosen by an input (Optimum's merged decoders): each on its own
        return _by_branch(model, fold_scale_into_weights=fold_scale_into_weights, precision=precision, verify=verify,
                          dims=dims, seed=seed, atol=atol, rtol=rtol, progress=progress)
    # a bf16 model ONNX Runtime cannot open: probed widened (rewrite/bf16.py); the dims the original runs on
    reading = driver.read(model, dims=dims, atol=atol, rtol=rtol, inputs=inputs, progress=progress,
                          widened_tolerance=False)
    with progress.step("cleanup: constant folding, no-op removal"):
        cleaned, stats = cleanup(model)
        external.set_data_dir(cleaned, external.data_dir(model))  # weights on disk: still where they were
    with progress.step("matching attention sites and probing masks"):
        probed = _runnable(cleaned, reading.wide)
        graph, result, meanings = analyse(probed, probe_feeds(probed, reading.dims), progress, dims=reading.dims)
    if probed is not cleaned:  # rewritten in the bf16 model itself: the new tensors take its types
        graph, result.sites = import_graph(cleaned), bf16.typed_sites(result.sites, cleaned)
    rows = [_kept(cleaned, site, meanings.get(site.name), precision) for site in result.sites]
    driver.rewrite_each(graph, rows, _NormalizeRewriter(cleaned, meanings, fold_scale_into_weights))
    rewritten = sum(r.status == SiteStatus.REWRITTEN for r in rows)
    if not (rewritten > 0 or stats.changed):
        for r in rows:
            r.after = r.before
        return NormalizeResult(model, rows, False, stats, Verification(passed=True, note="nothing to improve"),
                               result.ignored, skipped=list(result.skipped), notes=reading.notes)
    out = export_like(graph, model)
    if reading.wide is not None:
        changed = bf16.type_change(model, out)
        if changed is not None:
            raise TrtattnError(f"normalize would not write the bf16 model as it read it: {changed}")
    verification = _verified(out, rows, reading, seed=seed, progress=progress) if verify else Verification()
    _verdicts_after(out, rows, reading, precision)  # what the normalised graph offers TensorRT, site by site
    return NormalizeResult(out, rows, True, stats, verification, result.ignored, skipped=list(result.skipped),
                           notes=reading.notes)


def _kept(model: onnx.ModelProto, site: AttentionSite, meaning, precision: str) -> SiteNormalization:
    """A site's row before its rewrite: kept as it is, with its fusability verdict on the input."""
    probs = between(_graph_of(model, site), site.softmax) if site.softmax else None
    return SiteNormalization(site, SiteStatus.KEPT, "already in TensorRT's form",
                             before=verdict(site, precision=precision, meaning=meaning, probs_ops=probs))


@dataclass
class _Scope:
    """A graph sites are rewritten in (the main graph, or an If/Loop/Scan body, in place) and what its sites share."""

    graph: gs.Graph
    tensors: dict
    nodes: dict  # node name -> node
    masks: MaskCache  # masks already written in this graph (sites of one model share them)


class _NormalizeRewriter(driver.SiteRewriter[_Scope, SiteNormalization]):
    """normalize's rewrite of one site into TensorRT's form; a site it cannot rewrite is skipped, with why."""

    catches = (KeyError, ValueError)

    def __init__(self, model: onnx.ModelProto, meanings: dict, fold_scale_into_weights: bool):
        self.model, self.meanings, self.fold = model, meanings, fold_scale_into_weights

    def scope(self, graph: gs.Graph, path: tuple) -> _Scope:
        scope = driver.find_scope(graph, path)
        return _Scope(scope, scope.tensors(), {n.name: n for n in scope.nodes}, MaskCache())

    def nodes(self, scope: _Scope) -> list:
        return scope.graph.nodes

    def failed(self, outcome: SiteNormalization, error: BaseException) -> None:
        outcome.refuse(SiteStatus.SKIPPED, str(error))

    def rewrite(self, scope: _Scope, row: SiteNormalization) -> None:
        site, meaning = row.site, self.meanings.get(row.site.name)
        if site.source.is_op:
            row.reason = f"already a fused op ({site.source})"
            return
        if site.quant is not None and site.quant.logits is not None:
            row.refuse(SiteStatus.SKIPPED, "its logits are quantized (Q/DQ between the first MatMul and the Softmax), "
                       "which TensorRT's fused attention does not compute")
            return
        probs = between(_graph_of(self.model, site), site.softmax) if site.softmax else None
        pure_causal = meaning is not None and meaning.pattern in ("causal", "window") and not meaning.padding \
            and not meaning.bias
        if canonical.needed(site):  # logits change layout on the way to the Softmax
            self._reemitted(scope, row, probs)
            return
        logits_normal = already_normal(site) and not (self.fold and site.scale != 1.0) and \
            not (pure_causal and site.mask == MaskKind.ADDITIVE)
        if logits_normal and not not_documented(probs):
            return
        if not logits_normal:
            self._masked(scope, row, meaning)
        self._probabilities(scope, row, probs, logits_normal)

    @staticmethod
    def _reemitted(scope: _Scope, row: SiteNormalization, probs) -> None:
        """The attention core written again in TensorRT's form (logits that change layout before the Softmax)."""
        site = row.site
        guard = "IsNaN" in (probs or [])
        rows_guard = row_guard(scope.graph, scope.nodes[site.softmax])
        row.mask_form = canonical.canonical_core(scope.graph, scope.tensors, site, scope.nodes[site.softmax],
                                                 guard=guard, row_guard=rows_guard)
        row.scale_to = "q"
        row.rewritten()
        row.probabilities = "NaN guard moved after BMM2" if guard else ROW_GUARD_MOVED if rows_guard else "-"

    def _masked(self, scope: _Scope, row: SiteNormalization, meaning) -> None:
        """The scale moved onto Q (or into the weights) and the mask as one op before the Softmax."""
        site = row.site
        logits, row.scale_to = prescaled_logits(scope.graph, scope.tensors, site, fold_weights=self.fold)
        shape = None
        if logit_ops.has_layout_change(site.mask_steps):
            shape = Emitter(scope.graph, site_scope(site.name, "shape")).score_shape(
                scope.tensors[site.query], scope.tensors[site.key_transposed], site.rank, site.rank - 1)
        x, row.mask_form = masked_logits(scope.graph, scope.tensors, site, meaning, logits, scope.masks, shape)
        scope.nodes[site.softmax].inputs[0] = x
        row.rewritten()

    @staticmethod
    def _probabilities(scope: _Scope, row: SiteNormalization, probs, logits_normal: bool) -> None:
        """What stands between the Softmax and BMM2: a NaN or fully-masked-row guard moved after BMM2, or named."""
        softmax, prefix = scope.nodes[row.site.softmax], site_scope(row.site.name)
        if move_nan_guard(scope.graph, softmax, prefix):
            row.probabilities = "NaN guard moved after BMM2"
            row.rewritten()
        elif move_row_guard(scope.graph, softmax, prefix):
            row.probabilities = ROW_GUARD_MOVED
            row.rewritten()
        elif not_documented(probs):
            row.probabilities = f"{', '.join(probs or [])} left (not TensorRT's form)"
            if logits_normal:
                row.reason = f"{', '.join(not_documented(probs))} between the Softmax and BMM2"


def _verified(out: onnx.ModelProto, rows: list[SiteNormalization], reading: driver.Reading, *, seed: int,
              progress: Progress) -> Verification:
    """The normalised model against the original (a bf16 one emulated); each site's error, and the sites verified
    only over one key, where any softmax gives 1 (graph/dims.py)."""
    outcome = driver.verify(reading.model, out, [r.site for r in rows], reading=reading, seed=seed, atol=reading.atol,
                            rtol=reading.rtol, emulated=reading.wide is not None, progress=progress)
    for r in rows:
        r.max_abs_err = outcome.site_errors.get(r.site.output)
    verification = outcome.summary()
    if reading.wide is not None:
        verification.run_on = bf16.RUN_ON
    verification.one_key = driver.one_key(reading.dims, rows) or None
    return verification


def _verdicts_after(out: onnx.ModelProto, rows: list[SiteNormalization], reading: driver.Reading,
                    precision: str) -> None:
    """Each row's fusability verdict on the normalised graph, found again there by its Softmax (or output)."""
    probed = _runnable(out, reading.wide)
    _, after, after_meanings = analyse(probed, probe_feeds(probed, reading.dims), dims=reading.dims)
    by_softmax = {s.softmax or s.output: s for s in after.sites}
    for r in rows:
        s2 = by_softmax.get(r.site.softmax or r.site.output)
        if s2 is not None:
            r.after = verdict(s2, precision=precision, meaning=after_meanings.get(s2.name),
                              mask_ops=_mask_ops(out, s2), probs_ops=between(_graph_of(out, s2), s2.softmax)
                              if s2.softmax is not None else None)


def _runnable(model: onnx.ModelProto, wide: onnx.ModelProto | None) -> onnx.ModelProto:
    """`model`, or for a bf16 model (`wide`: the input read widened) it widened too: what ONNX Runtime probes."""
    return model if wide is None else bf16.read_widened(model) or model


def _graph_of(model: onnx.ModelProto, site: AttentionSite) -> onnx.GraphProto:
    """The graph a site is in: the main graph or an If/Loop/Scan body."""
    return subgraphs.find_proto(model.graph, site.graph) if site.graph else model.graph


def _mask_ops(model: onnx.ModelProto, site: AttentionSite) -> set[str]:
    """Op types in the subgraph that computes the site's mask operand (in the site's own graph)."""
    operands = {s.operand for s in site.mask_steps if s.operand}
    producers = {o: n for n in _graph_of(model, site).node for o in n.output}
    ops, stack, seen = set(), list(operands), set()
    while stack:
        t = stack.pop()
        if t in seen or t not in producers:
            continue
        seen.add(t)
        n = producers[t]
        ops.add(n.op_type)
        stack.extend(i for i in n.input if i)
    return ops
