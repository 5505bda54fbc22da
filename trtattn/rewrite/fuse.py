"""Rewrite every attention site into the standard ONNX Attention op (opset 23).

The fused model runs on ONNX Runtime's CPU provider, so each rewrite is verified numerically
against the original before anything is written (verify.py). RoPE and KV-cache concatenation
stay outside the op (the report says so); GQA is native (the head repeat is dropped); a purely
causal mask becomes is_causal=1; any other mask or bias is passed as one attn_mask tensor.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import TrtattnError, VerificationError
from ..graph.branches import branch_inputs
from ..graph.dims import fit_dims
from ..graph.emit import Emitter, float_dtype
from ..graph.evaluate import runtime_errors
from ..graph.io import default_session_refusal
from ..graph.precision import low_float
from ..graph.qdq_pairs import write_propagated_pairs
from ..graph.shapes import symbolic_shapes, upgrade_opset
from ..graph.view import export_graph, import_graph
from ..match import analyse, logit_ops, probe_feeds, subgraphs
from ..match.fused_ops import MICROSOFT_OPS
from ..report import Progress
from ..site import SOFTCAP_ATTRIBUTE, AttentionSite, CausalKind, SiteKind, SiteOutcome, SiteStatus, Skipped
from ..site_names import site_scope
from ..timings import timed
from ..verify import (
    Check,
    Tolerance,
    Verification,
    compare_models,
    loosened,
    tolerance,
    tolerance_for,
)
from ..version import __version__
from . import bf16, key_blocks
from .group_query import convert_group_query
from .layout import Dims, convert
from .microsoft import convert as convert_microsoft
from .qk_output import qk_output
from .rope import write_rotations
from .verdicts import blame, first_line, output_reason, site_error, summary, verify_reason

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

    def row(self) -> dict:
        s = self.site
        return {
            "name": s.name, "node": s.softmax, "kind": s.kind.value, "source": s.source,
            "q_heads": s.q_heads, "kv_heads": s.kv_heads, "head_size": s.head_size,
            "scale": s.softmax_scale, "scale_placement": s.scale_placement.value,
            "mask": s.mask.value, "causal": s.causal.value, "window": s.window, "padding": self.padding,
            "bias": self.bias, "cache": s.cache.value, "rope": s.rope.kind.value if s.rope else "none",
            "status": self.status.value, "reason": self.reason, "max_abs_err": self.max_abs_err,
            "tolerance": quant_tolerance(s) or None, "notes": list(s.notes) + unit_length_notes(self.unit_lengths),
            "one_key": bool(self.unit_lengths and self.unit_lengths[1] == 1), "merged": list(s.merged),
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
def rewrite_site(graph: gs.Graph, tensors: dict, site: AttentionSite, meaning) -> gs.Node:
    """Replace one site by an ONNX Attention node (returned). Raises on anything it cannot express."""
    if site.source.startswith("com.microsoft"):
        node = next(n for n in graph.nodes if n.outputs and n.outputs[0].name == site.output)
        convert_contrib = convert_group_query if node.op == "GroupQueryAttention" else convert_microsoft
        return convert_contrib(graph, node, site_scope(site.name))
    if site.source == "onnx:Attention":
        return _retarget_attention(graph, tensors, site)
    lay = site.layout
    if lay is None:
        raise ValueError(f"site {site.name} has no layout to rewrite from")
    logits_q = site.quant.logits if site.quant else None
    if logits_q is not None:
        raise ValueError(f"its logits are quantized inside the attention ({logits_q.dtype}, scale {logits_q.scale:.3g}): "
                         "a fused attention (and TensorRT's IAttention) computes them unquantized, so it would not "
                         "compute what this model computes")
    key_blocks.prepare(graph, tensors, site)  # Concat(K_i), Concat(V_i) of a key axis written in blocks
    emit = Emitter(graph, site_scope(site.name))
    dtype = float_dtype(site.dtype)
    dims = Dims(emit, tensors, lay.dims)
    q = convert(emit, tensors[lay.query], lay.q, (lay.batch, lay.heads, ("q",), ("d",)), dims)
    blocks = key_blocks.past_operands(graph, emit, tensors, site, dims)  # a cache and the new slice: the op's past
    past = blocks is not None
    if blocks is not None:
        (k, v), pasts = blocks
    else:
        k = convert(emit, tensors[lay.key], lay.k, (lay.batch, lay.kv_heads, ("k",), ("d",)), dims)
        v = convert(emit, tensors[lay.value], lay.v, (lay.batch, lay.kv_heads, ("k",), ("e",)), dims)
    if lay.batch_broadcast:  # a learned probe [1, ...] the products broadcast: the op takes one batch for all
        batch = emit("Concat", [dims.of(lay.batch), emit.const([1, 1, 1], np.int64)], {"axis": 0}, dtype=np.int64)
        q, k, v = (emit("Expand", [t, batch], dtype=dtype, name=f"{x}_over_batch") if x in lay.batch_broadcast else t
                   for x, t in zip("qkv", (q, k, v)))
    # a mode-2 qk output holds the mask: ONNX Runtime fills is_causal's with the lowest float, the graph's is -inf
    use_causal = (not past and meaning is not None and site.causal == CausalKind.UPPER_LEFT
                  and meaning.pattern == "causal" and not meaning.padding and not meaning.bias
                  and not any(s.op == "sink" for s in site.mask_steps) and site.qk_mode != 2)
    steps = [s for s in site.mask_steps if not (use_causal and logit_ops.unit(s).masks)]
    mask_emit = Emitter(graph, site_scope(site.name, "mask_operands"))
    built = logit_ops.build(graph, tensors, steps, site_scope(site.name, "mask"), dtype,
                            lambda t, step: convert(mask_emit, t, step.frame, lay.scores, dims, broadcast=True))
    if site.qk_mode == 2:  # the op's output holds the mask: ONNX Runtime fills a boolean one with the lowest float
        built.to_float(float("-inf"))  # where the graph's (returned.py: a -inf fill) is -inf
    if site.qk_mode == 2:  # the op's output holds the mask: ONNX Runtime fills a boolean one with the lowest float
        built.to_float(float("-inf"))  # where the graph's (returned.py: a -inf fill) is -inf
    mask = built.m
    for factor in built.q_scales:  # a per-head logit scale: [.., heads, 1, 1] broadcasts over Q's BNSH
        q = emit("Mul", [q, factor], dtype=dtype, name="q_head_scale")
    if built.sink is not None:
        k, v, mask = _with_sink(emit, q, k, v, built, dtype)
    if mask is not None:
        mask = emit.full_query_rows(mask, q)
    attrs = {"scale": float(lay.scale), "is_causal": int(use_causal)}
    if built.softcap:
        attrs[SOFTCAP_ATTRIBUTE] = float(built.softcap)
    if site.qk_output is not None:
        attrs["qk_matmul_output_mode"] = int(site.qk_mode or 0)
    y = emit("Attention", [q, k, v] + ([mask] if mask is not None else []), attrs, dtype=dtype, name="Attention")
    attention = graph.nodes[-1]
    if past:
        key_blocks.with_presents(attention, pasts)
    out = convert(emit, y, (lay.batch, lay.heads, ("q",), ("e",)), lay.out, dims)
    qk = qk_output(emit, attention, tensors, site, dims, dtype)
    shapes = [(tensors[name], _shape_read(emit, dims, tensors[name], frame)) for name, frame in lay.shape_reads]
    # nothing above changed the graph but add nodes; now the site's output and the shapes read from the
    # tensors that go away are made by the new nodes
    _produce(tensors[site.output], out)
    if qk is not None:
        _produce(tensors[site.qk_output], qk)
    for read, shape in shapes:
        if shape is not None:
            read.inputs[0].outputs.clear()
            _produce(read, shape)
    return attention


def _with_sink(emit: Emitter, q, k, v, built, dtype):
    """Attention sinks (match/logit_ops/sink.py) as one extra key: K and V get a zero row, the mask a column
    holding the sink's logit (softmax over a set of keys: where the column stands does not matter)."""
    i64 = lambda values: emit.const(values, np.int64)  # noqa: E731
    part = lambda t, lo, hi: emit("Slice", [emit("Shape", [t], dtype=np.int64), i64([lo]), i64([hi])],  # noqa: E731
                                  dtype=np.int64)
    zero = emit.const(0.0, dtype)

    def zero_row(t):
        shape = emit("Concat", [part(t, 0, 2), i64([1]), part(t, 3, 4)], {"axis": 0}, dtype=np.int64)
        return emit("Concat", [t, emit("Expand", [zero, shape], dtype=dtype)], {"axis": 2}, dtype=dtype, name="sink_key")

    built.to_float()
    scores = emit("Concat", [part(q, 0, 3), part(k, 2, 3)], {"axis": 0}, dtype=np.int64)
    column = emit("Concat", [part(q, 0, 3), i64([1])], {"axis": 0}, dtype=np.int64)
    m = emit("Expand", [built.m if built.m is not None else zero, scores], dtype=dtype)
    sink = emit("Expand", [built.sink, column], dtype=dtype)
    return zero_row(k), zero_row(v), emit("Concat", [m, sink], {"axis": 3}, dtype=dtype, name="sink_column")


def _produce(target: gs.Tensor, made: gs.Tensor) -> None:
    """`target` (a tensor the graph reads) is now computed by the node that made `made`."""
    node = made.inputs[0]
    target.inputs.clear()
    node.outputs = [target if o is made else o for o in node.outputs]


def _shape_read(emit: Emitter, dims: Dims, out: gs.Tensor, frame) -> gs.Tensor | None:
    """What a Shape node of a tensor that goes away reads, from the site's sizes."""
    shape_node = out.inputs[0] if out.inputs else None
    if shape_node is None or shape_node.op != "Shape":
        return None
    full = dims.shape(frame)
    start, end = shape_node.attrs.get("start"), shape_node.attrs.get("end")
    if start is not None or end is not None:
        rank = len(frame)
        lo = (start or 0) % rank if (start or 0) < 0 else (start or 0)
        hi = rank if end is None else (end % rank if end < 0 else min(end, rank))
        full = emit("Slice", [full, emit.const([lo], np.int64), emit.const([hi], np.int64)], dtype=np.int64)
    return full


def _retarget_attention(graph, tensors, site: AttentionSite) -> gs.Node:
    """An existing ONNX Attention: feed it K and V without the GQA head repeat."""
    node = next(n for n in graph.nodes if n.outputs and n.outputs[0].name == site.output)
    node.name = node.name or f"trtattn/Attention/{site.output}"  # the forms' records and plans go by node name
    node.inputs[1] = tensors[site.key]
    node.inputs[2] = tensors[site.value]
    return node


def fuse_model(model: onnx.ModelProto, *, verify: bool = True, dims: dict | None = None, seed: int = 0,
               atol: float | None = None, rtol: float | None = None, progress=None, inputs=None) -> FuseResult:
    """Fuse every site of `model` (not modified) and verify the result on ONNX Runtime, within the
    tolerance of the precision the model computes in unless atol/rtol are given (verify.tolerance_for).
    A model loaded with its weights left on disk (graph.io.load(..., load_external_data=False)) is
    analysed, rewritten and verified without ever holding them. `inputs` (graph.user_inputs.GivenInputs):
    verify on exactly these input sets instead of feeds searched in the model's domain."""
    progress = progress or Progress(enabled=False)
    given = atol is not None, rtol is not None
    atol, rtol = tolerance_for(model, atol, rtol)
    if not has_candidates(model):
        return FuseResult(model, [], [], Verification(passed=True, note="no attention found"))
    if branch_inputs(model):  # If branches chosen by an input (Optimum's merged decoders): each on its own
        from .branches import fuse_branches

        return fuse_branches(model, fuse_model, verify=verify, dims=dims, seed=seed, atol=atol, rtol=rtol,
                             progress=progress)
    wide = bf16.read_widened(model)  # a bf16 model ONNX Runtime cannot open: worked on widened (rewrite/bf16.py)
    if wide is not None:
        progress.note(bf16.NOTE)
        atol, rtol = tolerance_for(wide, *(v if g else None for v, g in zip((atol, rtol), given)))
        inputs = inputs.widened(wide) if inputs is not None else None
    fit = fit_dims(wide or model, dims, progress=progress, given=inputs)  # dims the original runs on (graph/dims.py)
    result = _fuse_fitted(wide or model, fit, verify=verify, seed=seed, atol=atol, rtol=rtol, given=given,
                          progress=progress, inputs=inputs, written=model if wide is not None else None)
    if wide is not None:
        result.notes.append(bf16.NOTE)
        result.model = result.model if result.changed else model
    result.dims = fit_record(fit)
    note_one_key(result.reports, result.verification, fit)
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
    one_key = [r.site.name for r in reports if r.status == SiteStatus.FUSED and r.unit_lengths and r.unit_lengths[1] == 1]
    if one_key and verification.passed is not None:
        verification.one_key = one_key


def fit_record(fit) -> dict:
    """The dims a run used, why, and which candidates the memory budget ruled out (for reports)."""
    return {"values": dict(fit), "why": list(getattr(fit, "reasons", [])),
            "skipped_for_memory": list(getattr(fit, "skipped", [])),
            **({"also_verified_at": [dict(d) for d in fit.also]} if getattr(fit, "also", None) else {})}


def _fuse_fitted(model: onnx.ModelProto, dims, *, verify: bool, seed: int, atol: float, rtol: float,
                 given: tuple[bool, bool], progress, inputs, written: onnx.ModelProto | None = None) -> FuseResult:
    """`written`: the bf16 model `model` is the widened copy of (rewrite/bf16.py): the sites are rewritten in it
    too, that model verified emulated and returned."""
    with progress.step(f"matching attention sites and probing their masks (opset {ATTENTION_OPSET})"):
        working = upgrade_opset(model, ATTENTION_OPSET)
        graph, result, meanings = analyse(working, probe_feeds(working, dims), progress, dims=dims, merge=True)
    if not result.sites and not result.skipped:
        return FuseResult(model, [], result.ignored, Verification(passed=True, note="no attention found"))
    reports = [_site_report(s, meanings) for s in result.sites]
    reports += [SiteReport(_placeholder(sk), status=NOT_FUSED, reason=sk.reason) for sk in result.skipped]
    while True:
        _unmerge(reports, result.heads_merged, meanings)
        active = [r for r in reports if r.status == SiteStatus.FUSED]
        with progress.step(f"rewriting {len(active)} sites into ONNX Attention"):
            # marks sites it cannot rewrite as skipped. A graph a canonical rule changed is not rewritten: a
            # site that fails must keep its original nodes (a written softmax, a max shift, pieces joined), not
            # the rule's
            fused = _rewrite(working, active, meanings, None if result.canonical or result.pieces else graph)
        graph = None  # rewritten: a second pass starts from the model again
        if _unmerge(reports, result.heads_merged, meanings):
            continue
        active = [r for r in active if r.status == SiteStatus.FUSED]
        fused_bf16 = fused
        if written is not None and active:
            rewritten = bf16.rewritten(upgrade_opset(written, ATTENTION_OPSET), active, meanings, _rewrite)
            if rewritten is None:
                continue
            fused_bf16 = rewritten
        if not verify:
            return FuseResult(fused if written is None else fused_bf16, reports, result.ignored, Verification(),
                              bool(active))
        if not active:
            return FuseResult(model, reports, result.ignored, Verification(passed=True, note="no site fused"), False)
        site_atol, site_rtol, why = _precision_tolerance([r.site for r in active], atol, rtol, given)
        with progress.step("verifying against the original on ONNX Runtime (Polygraphy)"):
            try:
                outcome = compare_models(model, fused, [r.site for r in active if not r.site.graph], dims=dims,
                                         seed=seed, atol=max([site_atol] + [quant_tolerance(r.site) for r in active]),
                                         rtol=site_rtol, given=inputs, progress=progress)
            except VerificationError:  # the inputs, not the rewrite: one line for the whole command
                raise
            except runtime_errors() as e:  # the rewritten model does not run: the site whose node failed goes back
                for r in blame(e, active):
                    if not _retried(r):
                        r.status, r.reason = NOT_FUSED, f"the rewritten model does not run: {first_line(e)}"
                continue
        if outcome.passed:  # compared with ONNX Runtime's basic optimizations; loaded as the user will load it
            with progress.step("loading the rewritten model in ONNX Runtime with default session options"):
                refusal = default_session_refusal(fused)
            if refusal is not None:
                for r in blame(Exception(refusal), active):
                    if not _retried(r):
                        r.status, r.reason = NOT_FUSED, ("ONNX Runtime with default session options refuses the "
                                                         f"rewritten model: {refusal}")
                continue
        for r in active:
            r.max_abs_err = site_error(r, outcome)
        bad = [r for r in active if r.max_abs_err is None
               or not r.max_abs_err <= max(outcome.bounds.get(r.site.output, site_atol), quant_tolerance(r.site))]
        if not bad and not outcome.passed:  # each site within its bound, an output not: keep the original
            if [r for r in active if _logits_beside(r)]:  # unless it is logits the op returned: beside them, again
                continue
            for r in active:
                r.status, r.reason = NOT_FUSED, output_reason(outcome)
            return FuseResult(model, reports, result.ignored, summary(outcome, why), False)
        if not bad and written is not None:
            checked = bf16.checked(written, fused_bf16, active, dims=dims, seed=seed, inputs=inputs,
                                   atol=atol if given[0] else None, rtol=rtol if given[1] else None,
                                   progress=progress, widened=summary(outcome, why))
            if checked is None:
                continue
            return FuseResult(fused_bf16, reports, result.ignored, checked, True)
        if not bad:
            return FuseResult(fused, reports, result.ignored, summary(outcome, why), True)
        for r in bad:  # leave the failing sites as they were and verify the others again
            if not _retried(r):
                r.status, r.reason = NOT_FUSED, verify_reason(r, outcome)


def _site_report(site: AttentionSite, meanings: dict) -> SiteReport:
    meaning = meanings.get(site.name)
    return SiteReport(site, pattern=getattr(meaning, "pattern", "none"), padding=getattr(meaning, "padding", False),
                      bias=getattr(meaning, "bias", site.op_bias))


def _unmerge(reports: list[SiteReport], parts: dict, meanings: dict) -> bool:
    """A multi-head site merged from single-head ones (match/heads_merge.py) that did not fuse gives way to
    those sites, each tried on its own with why (the merged one's reason). Whether any did."""
    failed = [r for r in reports if r.status == NOT_FUSED and r.site.merged and r.site.name in parts]
    for r in failed:
        note = f"merged with {', '.join(r.site.merged[1:])} it did not fuse ({r.reason}): fused one head at a time"
        at = reports.index(r)
        reports[at:at + 1] = [_site_report(s.replace(notes=(*s.notes, note)), meanings)
                              for s in parts.pop(r.site.name)]
    return bool(failed)


def _retried(r: SiteReport) -> bool:
    """Whether a failing site tries again with less written as ops: its rotation left as the graph computes it,
    else the logits it returns computed beside the op instead of as its qk_matmul_output."""
    return _rotation_dropped(r) or _logits_beside(r)


def _logits_beside(r: SiteReport) -> bool:
    site = r.site
    if site.qk_output is None or site.qk_mode == 3:  # the probabilities have no other way out of the op
        return False
    notes = tuple(n for n in site.notes if not n.startswith("its logits, which the model returns"))
    r.site = site.replace(qk_output=None, qk_mode=None, notes=(*notes, f"the logits it returns, as the op's "
                                                                        f"qk_matmul_output (mode {site.qk_mode}), did "
                                                                        "not verify: computed beside the op"))
    return True


def _rotation_dropped(r: SiteReport) -> bool:
    """A failing site whose rotation fuse would write as RotaryEmbedding ops tries again with the rotation left
    as the graph computes it (the attention alone may still fuse); False when there is none to drop."""
    rope = r.site.rope
    if rope is None or not rope.op_caches:
        return False
    r.site = r.site.replace(rope=None, notes=(*r.site.notes, "its rotation, read as RotaryEmbedding, did not verify: "
                                                              "left as the graph computes it"))
    return True


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


@timed("rewrite")
def _rewrite(working: onnx.ModelProto, reports: list[SiteReport], meanings: dict,
             graph: gs.Graph | None = None) -> onnx.ModelProto:
    """The sites rewritten in `graph` (the analysis graph, used up) or in a fresh import of `working`."""
    if graph is None or any(n.domain == "com.microsoft" for n in working.graph.node):
        graph = import_graph(_with_contrib_shapes(working))
    scopes: dict[tuple, tuple] = {}  # subgraph path -> (graph, its tensors)
    for r in reports:
        try:
            if r.site.graph not in scopes:
                sub = subgraphs.find(graph, r.site.graph)
                scopes[r.site.graph] = (sub, sub.tensors())
        except KeyError as e:
            r.status, r.reason = NOT_FUSED, str(e)
            continue
        scope, tensors = scopes[r.site.graph]
        mark = len(scope.nodes)
        try:
            r.attention_node = rewrite_site(scope, tensors, r.site, meanings.get(r.site.name)).name
            write_rotations(scope, tensors, r.site)  # a rotation read by value: as the RotaryEmbedding op
        except (TrtattnError, KeyError, ValueError, StopIteration) as e:  # the site stays as it was, with why
            del scope.nodes[mark:]  # (anything else is a bug of ours: a crash, never a site's reason)
            r.status, r.reason = NOT_FUSED, str(e) or type(e).__name__
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    fused = export_graph(graph, working)
    write_propagated_pairs(fused)  # an int8 model raised to opset 23 loads in ONNX Runtime (graph/qdq_pairs.py)
    del fused.metadata_props[:]
    fused.metadata_props.extend(copy.deepcopy(list(working.metadata_props)))
    fused.producer_name, fused.producer_version = "trtattn", __version__
    return fused


def _with_contrib_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Converting com.microsoft ops needs the ranks of their masks, which only ONNX Runtime's
    symbolic shape inference knows (ONNX's does not know contrib ops)."""
    contrib = [n for n in model.graph.node if n.domain == "com.microsoft" and n.op_type in MICROSOFT_OPS]
    if not contrib:
        return model
    try:
        inferred = symbolic_shapes(model)
    except Exception:
        return model
    if inferred is None:
        return model
    # Only the attention ops' inputs: symbolic inference types some contrib outputs wrongly (the float
    # output of EmbedLayerNormalization as int32), and a wrong type breaks the rewritten model.
    wanted = {name for n in contrib for name in n.input if name}
    known = {v.name for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.initializer)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.value_info.extend(v for v in inferred.graph.value_info if v.name in wanted and v.name not in known)
    return out
