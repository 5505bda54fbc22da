"""Rewrite every attention site into the standard ONNX Attention op (opset 23).

The fused model runs on ONNX Runtime's CPU provider, so each rewrite is verified numerically
against the original before anything is written (verify.py). RoPE and KV-cache concatenation
stay outside the op (the report says so); GQA is native (the head repeat is dropped); a purely
causal mask becomes is_causal=1; any other mask or bias is passed as one attn_mask tensor.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from ..errors import TrtattnError, VerificationError
from ..graph.branches import branch_inputs
from ..graph.cache_steps import with_cache_steps
from ..graph.evaluate import runtime_errors
from ..graph.io import default_session_refusal
from ..graph.precision import low_float
from ..graph.qdq_pairs import write_propagated_pairs
from ..graph.shapes import upgrade_opset
from ..graph.view import export_graph, import_graph
from ..match import analyse, probe_feeds, subgraphs
from ..match.fused_ops import MICROSOFT_OPS
from ..report import Progress
from ..site import AttentionSite, MatchResult, SiteKind, SiteOutcome, SiteSource, SiteStatus, Skipped
from ..site_names import site_scope
from ..timings import timed
from ..verify import Check, Tolerance, Verification, compare_models, loosened, tolerance, tolerance_for
from ..version import __version__
from . import bf16, driver
from .group_query import convert_group_query
from .microsoft import convert as convert_microsoft
from .microsoft import with_contrib_shapes
from .pattern import pattern_attention
from .rope import write_rotations
from .verdicts import Fallback, blame, fallback, first_line, logits_beside, output_reason, site_error, summary, verify_reason

ATTENTION_OPSET = 23
NOT_FUSED = SiteStatus.NOT_FUSED  # the status of an attention the output keeps as it was (the reason says why)
# A site whose softmax output the model quantizes (Q/DQ between the Softmax and the product with V) loses
# that rounding in the fused op: each probability moves by up to half a step. Measured on the fuzzer's
# uint8 (1/255) cases: 2.3-3.2 steps on the attention output. Such a site is verified within 8 steps.
QUANT_STEPS = 8


@dataclass
class SiteReport(SiteOutcome):
    """fuse's outcome of one site (status FUSED or NOT_FUSED)."""

    pattern: str = "none"  # what the probe saw in the mask
    padding: bool = False
    bias: bool = False
    attention_node: str | None = None  # the ONNX Attention node the site became in the fused model
    unit_lengths: tuple | None = None  # (query, key) lengths, where the site could be verified only with one of them 1

    @property
    def one_key(self) -> bool:
        """Verified only at a key length of 1, where the check proves nothing."""
        return bool(self.unit_lengths and self.unit_lengths[1] == 1)

    @property
    def tolerance(self) -> float | None:
        """The quantization tolerance the site is verified within (None: the model's own)."""
        return quant_tolerance(self.site) or None

    def row(self) -> dict:
        s = self.site
        return {
            "name": s.name, "node": s.softmax, "kind": s.kind.value, "source": s.source,
            "q_heads": s.q_heads, "kv_heads": s.kv_heads, "head_size": s.head_size,
            "scale": s.softmax_scale, "scale_placement": s.scale_placement.value,
            "mask": s.mask.value, "causal": s.causal.value, "window": s.window, "padding": self.padding,
            "bias": self.bias, "cache": s.cache.value, "rope": s.rope.kind.value if s.rope else "none",
            "status": self.status.value, "reason": self.reason, "max_abs_err": self.max_abs_err,
            "tolerance": self.tolerance, "notes": list(s.notes) + unit_length_notes(self.unit_lengths),
            "one_key": self.one_key, "merged": list(s.merged),
        }


@dataclass
class FuseResult:
    model: onnx.ModelProto
    reports: list[SiteReport] = field(default_factory=list)
    ignored: list[Skipped] = field(default_factory=list)
    verification: Verification = field(default_factory=Verification.nothing)
    changed: bool = False
    original: onnx.ModelProto | None = field(default=None, repr=False)  # the input, for the pictures
    dims: dict = field(default_factory=dict)  # the dims verification ran at, why, and those skipped for memory
    notes: list[str] = field(default_factory=list)  # for the output: how the model was read (a bf16 model)

    def _repr_html_(self) -> str:
        """A notebook shows the result as the HTML report's section: every site drawn."""
        from ..errors import MissingDependencyError
        from ..pictures import fuse_entry, render

        if self.original is None:
            return f"<pre>{self!r}</pre>"
        try:
            return render([fuse_entry(self.original.graph.name or "model", self.original, self)])
        except MissingDependencyError as e:  # no Graphviz: the table still says everything
            from ..report import site_table

            return f"<p>{e}</p><pre>{site_table(self.reports)}</pre>"

    @property
    def ok(self) -> bool:
        verified = self.verification.empty or bool(self.verification.passed)  # not verified (verify=False): not ok
        return all(r.status == SiteStatus.FUSED for r in self.reports) and verified


def quant_tolerance(site: AttentionSite) -> float:
    """The quantization tolerance a site is verified within (0: none, the model's own tolerance)."""
    probs = site.quant.probs if site.quant else None
    return QUANT_STEPS * probs.scale if probs is not None else 0.0


def has_candidates(model: onnx.ModelProto) -> bool:
    """Anything the matcher could take: a Softmax (or Exp with a sum or a LogSoftmax: one written without it,
    match/canonical.py) or an attention op, also in an If branch or a loop body."""
    return subgraphs.has_softmax(model.graph.node) or subgraphs.has_subgraph_softmax(model.graph) or any(
        n.domain == "com.microsoft" and n.op_type in MICROSOFT_OPS for n in model.graph.node)


# ---------------------------------------------------------------- rewriting
def rewrite_site(graph: gs.Graph, tensors: dict, site: AttentionSite, meaning, shared_buffer: bool = False) -> gs.Node:
    """Replace one site by an ONNX Attention node (returned), with the rewriter of its source. Raises on anything
    it cannot express. `shared_buffer`: the runtime binds each past and its present to one buffer (GenAI's
    past_present_share_buffer), which a converted GroupQueryAttention's presents are written into."""
    if site.source == SiteSource.PATTERN:
        return pattern_attention(graph, tensors, site, meaning)
    if site.source == SiteSource.ONNX_ATTENTION:
        return _retarget_attention(graph, tensors, site)
    return _converted_contrib(graph, site, shared_buffer)


def _converted_contrib(graph: gs.Graph, site: AttentionSite, shared_buffer: bool) -> gs.Node:
    """A com.microsoft attention op as the standard one (GroupQueryAttention has its own converter)."""
    node = next(n for n in graph.nodes if n.outputs and n.outputs[0].name == site.output)
    if site.source == SiteSource.MS_GROUP_QUERY:
        return convert_group_query(graph, node, site_scope(site.name), shared_buffer)
    return convert_microsoft(graph, node, site_scope(site.name))


def _retarget_attention(graph, tensors, site: AttentionSite) -> gs.Node:
    """An existing ONNX Attention: feed it K and V without the GQA head repeat."""
    node = next(n for n in graph.nodes if n.outputs and n.outputs[0].name == site.output)
    node.name = node.name or f"trtattn/Attention/{site.output}"  # the forms' records and plans go by node name
    node.inputs[1] = tensors[site.key]
    node.inputs[2] = tensors[site.value]
    return node


def fuse_model(model: onnx.ModelProto, *, verify: bool = True, dims: dict | None = None, seed: int = 0,
               atol: float | None = None, rtol: float | None = None, progress=None, inputs=None,
               shared_buffer: bool = False) -> FuseResult:
    """Fuse every site of `model` (not modified) and verify the result on ONNX Runtime, within the
    tolerance of the precision the model computes in unless atol/rtol are given (verify.tolerance_for).
    A model loaded with its weights left on disk (graph.io.load(..., load_external_data=False)) is
    analysed, rewritten and verified without ever holding them. `inputs` (graph.user_inputs.GivenInputs):
    verify on exactly these input sets instead of feeds searched in the model's domain. `shared_buffer`: the
    runtime binds each past and its present to one buffer (rewrite_site), as GenAI does with its
    past_present_share_buffer; verified as always, where the buffer is the concatenated cache."""
    progress = progress or Progress(enabled=False)
    if not has_candidates(model):
        return FuseResult(model, [], [], Verification(passed=True, note="no attention found"))
    if branch_inputs(model):  # If branches chosen by an input (Optimum's merged decoders): each on its own
        from .branches import fuse_branches

        branch_atol, branch_rtol = tolerance_for(model, atol, rtol)
        return fuse_branches(model, fuse_model, verify=verify, dims=dims, seed=seed, atol=branch_atol,
                             rtol=branch_rtol, progress=progress)
    # a bf16 model ONNX Runtime cannot open is worked on widened (rewrite/bf16.py), verified in fp32 first
    reading = driver.read(model, dims=dims, atol=atol, rtol=rtol, inputs=inputs, progress=progress,
                          widened_tolerance=True)
    run = _Run(reading, verify=verify, seed=seed, given=(atol is not None, rtol is not None), progress=progress,
               shared_buffer=shared_buffer)
    result = _fuse_fitted(run)
    if reading.wide is not None:
        result.notes.append(bf16.NOTE)
        result.model = result.model if result.changed else model
    result.dims = fit_record(reading.dims)
    note_one_key(result.reports, result.verification, reading.dims)
    return result


def unit_length_notes(lengths: tuple | None) -> list[str]:
    if not lengths:
        return []
    if lengths[1] == 1:
        return ["verified only at a key length of 1, where any softmax gives 1: the check proves nothing of it"]
    return ["verified only at a query length of 1: the check proves nothing of how its mask varies across queries"]


def note_one_key(reports: list[SiteReport], verification: Verification, fit) -> None:
    """Mark the sites whose softmax the dims search left at one key or one query at every length the model runs at
    (graph/dims.py). Over one key the verification cannot fail: the summary line names those sites."""
    left = getattr(fit, "one_key", {})
    for r in reports:
        r.unit_lengths = left.get(r.site.output)
    one_key = driver.one_key(fit, [r for r in reports if r.status == SiteStatus.FUSED])
    if one_key and verification.passed is not None:
        verification.one_key = one_key


def cache_pasts(sites) -> dict[str, str | None]:
    """The length dims of the caches the graph appends to (graph inputs concatenated onto the sites' keys) -> their
    new tokens' length dims (named by any site that reads it: one whose walk to the input lost the axis says none)."""
    out: dict[str, str | None] = {}
    for c in (c for s in sites for c in s.cache_lengths):
        out[c.past] = out.get(c.past) or c.new
    return out


def fit_record(fit) -> dict:
    """The dims a run used, why, and which candidates the memory budget ruled out (for reports)."""
    return {"values": dict(fit), "why": list(getattr(fit, "reasons", [])),
            "skipped_for_memory": list(getattr(fit, "skipped", [])),
            **({"also_verified_at": [dict(d) for d in fit.also]} if getattr(fit, "also", None) else {})}


@dataclass
class _Run:
    """What every attempt of one fuse run reads: the model as read, and how to verify."""

    reading: driver.Reading
    verify: bool
    seed: int
    given: tuple[bool, bool]  # whether atol, rtol were given (else the model's, loosened where a site needs it)
    progress: Progress
    shared_buffer: bool = False  # past and present are one buffer at run time (rewrite_site)

    @property
    def model(self) -> onnx.ModelProto:
        """What is matched, rewritten and verified in fp32: the model, or a bf16 model widened."""
        return self.reading.runnable

    @property
    def written(self) -> onnx.ModelProto | None:
        """A bf16 model `model` is the widened copy of: the sites are rewritten in it too, it is verified emulated
        and returned."""
        return self.reading.model if self.reading.wide is not None else None


@dataclass
class _Attempt:
    """One rewrite of the sites still fused, in fp32 (and in the bf16 model's own types when there is one)."""

    reports: list[SiteReport]  # every site of the run
    active: list[SiteReport]  # the sites this attempt fused
    fused: onnx.ModelProto
    fused_bf16: onnx.ModelProto  # `fused` itself unless the run writes a bf16 model
    ignored: list[Skipped]


@dataclass(frozen=True)
class Decision:
    """What one attempt decided, as values: the sites to try again with less written as ops or to keep as they were
    (applied first), and the result when this attempt is the last."""

    fallbacks: tuple[Fallback | Unmerged, ...] = ()
    result: FuseResult | None = None


def _fuse_fitted(run: _Run) -> FuseResult:
    """Match and probe, then rewrite the sites, verify them and decide, until a decision gives the result."""
    with run.progress.step(f"matching attention sites and probing their masks (opset {ATTENTION_OPSET})"):
        working = upgrade_opset(run.model, ATTENTION_OPSET)
        graph, result, meanings = analyse(working, probe_feeds(working, run.reading.dims), run.progress,
                                          dims=run.reading.dims, merge=True)
        fit = with_cache_steps(run.model, run.reading.dims, cache_pasts(result.sites), run.reading.user)
        for reason in fit.reasons[len(run.reading.dims.reasons):]:  # as graph/dims.py says its own
            run.progress.note(f"dims: {reason}")
        if fit.also != run.reading.dims.also:  # its masks read at those lengths too (match/probe.py)
            run.reading.dims = fit
            graph, result, meanings = analyse(working, probe_feeds(working, fit), run.progress, dims=fit, merge=True)
    if not result.sites and not result.skipped:
        return FuseResult(run.model, [], result.ignored, Verification(passed=True, note="no attention found"))
    reports = [_site_report(s, meanings) for s in result.sites]
    reports += [SiteReport(_placeholder(sk), status=NOT_FUSED, reason=sk.reason) for sk in result.skipped]
    # A graph a canonical rule changed is not rewritten: a site that fails must keep its original nodes (a
    # written softmax, a max shift, pieces joined), not the rule's. After the first pass each starts from the model
    # again.
    first: gs.Graph | None = None if result.canonical or result.pieces else graph
    while True:
        for split in _unmerged(reports, result.heads_merged, meanings):  # merged sites a fallback kept as they were
            split.apply()
        decision = _attempted(run, working, reports, meanings, result, first)
        first = None
        for back in decision.fallbacks:
            back.apply()
        if decision.result is not None:
            return decision.result


def _site_report(site: AttentionSite, meanings: dict) -> SiteReport:
    meaning = meanings.get(site.name)
    return SiteReport(site, pattern=getattr(meaning, "pattern", "none"), padding=getattr(meaning, "padding", False),
                      bias=getattr(meaning, "bias", site.op_bias))


@dataclass(frozen=True)
class Unmerged:
    """A decision about a multi-head site merged from single-head ones (match/heads_merge.py) that did not fuse: it
    gives way to those sites, each tried on its own with why (the merged one's reason)."""

    reports: list[SiteReport]  # the run's, where `merged` stands
    merged: SiteReport
    parts: tuple[SiteReport, ...]

    def apply(self) -> None:
        at = self.reports.index(self.merged)
        self.reports[at:at + 1] = list(self.parts)


def _unmerged(reports: list[SiteReport], parts: dict, meanings: dict) -> tuple[Unmerged, ...]:
    """The merged sites that did not fuse, each as the single-head sites it was merged from (taken from `parts`:
    a merged site gives way once: it leaves `reports`)."""
    decisions = []
    for r in reports:
        if r.status == NOT_FUSED and r.site.merged and r.site.name in parts:
            note = f"merged with {', '.join(r.site.merged[1:])} it did not fuse ({r.reason}): fused one head at a time"
            decisions.append(Unmerged(reports, r, tuple(_site_report(s.replace(notes=(*s.notes, note)), meanings)
                                                        for s in parts[r.site.name])))
    return tuple(decisions)


def _attempted(run: _Run, working: onnx.ModelProto, reports: list[SiteReport], meanings: dict,
               result: MatchResult, graph: gs.Graph | None) -> Decision:
    """Rewrite the sites still fused (the rewrite marks those it cannot take), verify, and decide. A merged site
    the rewrite could not take gives way to its single-head sites, and the attempt repeats."""
    ignored = result.ignored
    active = [r for r in reports if r.status == SiteStatus.FUSED]
    with run.progress.step(f"rewriting {len(active)} sites into ONNX Attention"):
        fused = _rewrite(working, active, meanings, graph, shared_buffer=run.shared_buffer)
    split = _unmerged(reports, result.heads_merged, meanings)
    if split:
        return Decision(split)
    active = [r for r in active if r.status == SiteStatus.FUSED]
    fused_bf16 = fused
    if run.written is not None and active:
        rewritten = bf16.rewritten(upgrade_opset(run.written, ATTENTION_OPSET), active, meanings,
                                   functools.partial(_rewrite, shared_buffer=run.shared_buffer))
        if rewritten is None:  # the sites it could not write in bf16 are marked: again without them
            return Decision()
        fused_bf16 = rewritten
    if not run.verify:
        return Decision(result=FuseResult(fused if run.written is None else fused_bf16, reports, ignored,
                                          Verification(), bool(active)))
    if not active:
        return Decision(result=FuseResult(run.model, reports, ignored, Verification(passed=True, note="no site fused"),
                                          False))
    return _verified(run, _Attempt(reports, active, fused, fused_bf16, ignored))


def _verified(run: _Run, attempt: _Attempt) -> Decision:
    """The attempt against the original on ONNX Runtime, then loaded with default session options: a model that
    does not run, or that the session refuses, sends back the sites its error names."""
    active = attempt.active
    site_atol, site_rtol, why = _precision_tolerance([r.site for r in active], run.reading.atol, run.reading.rtol,
                                                     run.given)
    with run.progress.step("verifying against the original on ONNX Runtime (Polygraphy)"):
        try:
            outcome = compare_models(run.model, attempt.fused, [r.site for r in active if not r.site.graph],
                                     dims=run.reading.dims, seed=run.seed,
                                     atol=max([site_atol] + [quant_tolerance(r.site) for r in active]),
                                     rtol=site_rtol, given=run.reading.wide_inputs, progress=run.progress,
                                     atol_given=run.given[0])
        except VerificationError:  # the inputs, not the rewrite: one line for the whole command
            raise
        except runtime_errors() as e:  # the rewritten model does not run: the site whose node failed goes back
            reason = f"the rewritten model does not run: {first_line(e)}"
            return Decision(tuple(fallback(r, reason) for r in blame(e, active)))
    if outcome.passed:  # compared with ONNX Runtime's basic optimizations; loaded as the user will load it
        with run.progress.step("loading the rewritten model in ONNX Runtime with default session options"):
            refusal = default_session_refusal(attempt.fused)
        if refusal is not None:
            reason = f"ONNX Runtime with default session options refuses the rewritten model: {refusal}"
            return Decision(tuple(fallback(r, reason) for r in blame(Exception(refusal), active)))
    for r in active:
        r.max_abs_err = site_error(r, outcome)
    return _judged(run, attempt, outcome, site_atol, why)


def _judged(run: _Run, attempt: _Attempt, outcome, site_atol: float, why: str) -> Decision:
    """Each site within its bound and every output: the result. A site off its bound goes back (tried again with
    less written as ops, else kept as it was); every site within its bound but an output off: the original."""
    active, reports, ignored = attempt.active, attempt.reports, attempt.ignored
    bad = [r for r in active if r.max_abs_err is None
           or not r.max_abs_err <= max(outcome.bounds.get(r.site.output, site_atol), quant_tolerance(r.site))]
    if bad:  # leave the failing sites as they were and verify the others again
        return Decision(tuple(fallback(r, verify_reason(r, outcome)) for r in bad))
    if not outcome.passed:
        besides = tuple(Fallback(r, site) for r in active if (site := logits_beside(r.site)) is not None)
        if besides:  # unless it is logits the op returned: beside them, again
            return Decision(besides)
        reason = output_reason(outcome)
        return Decision(tuple(Fallback(r, None, reason) for r in active),
                        FuseResult(run.model, reports, ignored, summary(outcome, why), False))
    if run.written is None:
        return Decision(result=FuseResult(attempt.fused, reports, ignored, summary(outcome, why), True))
    atol, rtol = run.reading.atol, run.reading.rtol
    checked = bf16.checked(run.written, attempt.fused_bf16, active, dims=run.reading.dims, seed=run.seed,
                           inputs=run.reading.wide_inputs, atol=atol if run.given[0] else None,
                           rtol=rtol if run.given[1] else None, progress=run.progress, widened=summary(outcome, why))
    if checked is None:  # bf16.checked marked the sites that failed emulated: again without them
        return Decision()
    return Decision(result=FuseResult(attempt.fused_bf16, reports, ignored, checked, True))


def _precision_tolerance(sites, atol: float, rtol: float, given: tuple[bool, bool]) -> tuple[float, float, str]:
    """The tolerance to verify at, and why when it is not the model's: the model's (or the user's), loosened
    to that of the lowest precision a fused site computes in. An fp32 model whose products autocast or a
    converter put in fp16 computes its attention in fp16: the fused op too when it reads the fp16 tensors
    (the casts outside it), and when it reads the fp32 ones the original's products still round to fp16."""
    low = {name: s for s in sites for t in (s.dtype, s.products_dtype) if (name := low_float(t))}
    if not low:
        return atol, rtol, ""
    loosest = max(low, key=lambda p: tolerance(Check.REWRITE, p).atol)
    out_atol, out_rtol = loosened(Tolerance(atol, rtol), loosest, given)
    if (out_atol, out_rtol) == (atol, rtol):
        return atol, rtol, ""
    site = low[loosest]
    products = site.products_dtype and not low_float(site.dtype)
    return out_atol, out_rtol, (f"the {loosest} tolerance: site {site.name} computes its "
                                f"{'products' if products else 'attention'} "
                                f"in {site.products_dtype or site.dtype}")


def _placeholder(sk: Skipped) -> AttentionSite:
    return AttentionSite(name=sk.name, kind=SiteKind.SELF, query="", key="", value="", output="", softmax=sk.node)


class _FuseRewriter(driver.SiteRewriter[tuple, SiteReport]):
    """fuse's rewrite of one site: the ONNX Attention op (rewrite_site), and a rotation read by value as the
    RotaryEmbedding op. A failure it expects leaves the site as it was, with why; anything else is a crash."""

    catches = (TrtattnError, KeyError, ValueError, StopIteration)  # anything else is a bug of ours: a crash

    def __init__(self, meanings: dict, shared_buffer: bool):
        self.meanings = meanings
        self.shared_buffer = shared_buffer

    def scope(self, graph: gs.Graph, path: tuple) -> tuple:
        sub = driver.find_scope(graph, path)
        return sub, sub.tensors()

    def nodes(self, scope: tuple) -> list:
        return scope[0].nodes

    def rewrite(self, scope: tuple, outcome: SiteReport) -> None:
        graph, tensors = scope
        outcome.attention_node = rewrite_site(graph, tensors, outcome.site, self.meanings.get(outcome.site.name),
                                              self.shared_buffer).name
        write_rotations(graph, tensors, outcome.site)

    def failed(self, outcome: SiteReport, error: BaseException) -> None:
        outcome.refuse(NOT_FUSED, str(error) or type(error).__name__)


@timed("rewrite")
def _rewrite(working: onnx.ModelProto, reports: list[SiteReport], meanings: dict,
             graph: gs.Graph | None = None, *, shared_buffer: bool = False) -> onnx.ModelProto:
    """The sites rewritten in `graph` (the analysis graph, used up) or in a fresh import of `working`."""
    if graph is None or any(n.domain == "com.microsoft" for n in working.graph.node):
        graph = import_graph(with_contrib_shapes(working))
    driver.rewrite_each(graph, reports, _FuseRewriter(meanings, shared_buffer))
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    fused = export_graph(graph, working)
    write_propagated_pairs(fused)  # an int8 model raised to opset 23 loads in ONNX Runtime (graph/qdq_pairs.py)
    del fused.metadata_props[:]
    fused.metadata_props.extend(copy.deepcopy(list(working.metadata_props)))
    fused.producer_name, fused.producer_version = "trtattn", __version__
    return fused
