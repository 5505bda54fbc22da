"""What a site's mask means: causal (upper-left / lower-right), sliding window, padding, bias.

Two questions, answered two ways:
- Does the mask depend on input *values* (a padding mask, position ids)? Structurally: walk the
  mask's ancestors; a path to a graph input that does not pass through Shape means yes.
- What pattern does it have? Numerically: build the mask (logit_ops.materialize) in the graph for a
  moment, run only the nodes it needs with ONNX Runtime (one session for every probe) on inputs
  without padding, and compare the allowed positions with causal and banded patterns.
The verification of the fused model then checks every conclusion drawn here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph.dependence import depends_on_input_values
from ..graph.dim_names import resolve_dims
from ..graph.emit import Emitter
from ..graph.feeds import make_feeds
from ..graph.measure import inferred_shapes
from ..graph.op_dims import op_dims
from ..graph.slices import bounded_evaluator
from ..graph.view import GraphView, import_graph
from ..site import AttentionSite, CausalKind, MaskKind, MatchResult, SiteSource
from ..timings import timed
from . import logit_ops
from .errors import MASKED_FILL
from .find import match
from .heads_merge import merge_heads


@dataclass
class MaskMeaning:
    causal: CausalKind = CausalKind.NONE
    window: int | None = None
    padding: bool = False  # depends on input values (padding mask, positions)
    bias: bool = False  # finite non-zero values on allowed positions (relative bias, ALiBi)
    pattern: str = "none"  # none | causal | window | custom
    allowed: np.ndarray | None = None  # [..., Sq, Skv] the probe saw (kept to check other probes against)


def expected(pattern: str, causal: CausalKind, window: int | None, sq: int, skv: int) -> np.ndarray:
    """The allowed matrix a pattern gives at these lengths."""
    if pattern == "none":
        return np.ones((sq, skv), bool)
    i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
    diag = i + (skv - sq) if causal == CausalKind.LOWER_RIGHT else i
    allowed = j <= diag
    if pattern == "window":
        if window is None:
            raise ValueError("a window pattern needs its window size")
        allowed &= j > diag - window
    return allowed


def consistent(pattern: str, causal: CausalKind, window: int | None, allowed: np.ndarray) -> bool:
    sq, skv = allowed.shape[-2:]
    a = allowed.reshape(-1, sq, skv)
    return bool((a == expected(pattern, causal, window, sq, skv)).all())


def classify_pattern(allowed: np.ndarray) -> tuple[str, CausalKind, int | None]:
    """allowed: [..., Sq, Skv] booleans, identical for every batch row and head."""
    sq, skv = allowed.shape[-2:]
    a = allowed.reshape(-1, sq, skv)
    if not all((a[0] == x).all() for x in a[1:]):
        return "custom", CausalKind.NONE, None
    a = a[0]
    if a.all():
        return "none", CausalKind.NONE, None
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    off = skv - sq
    for kind, diag in ((CausalKind.LOWER_RIGHT, i + off), (CausalKind.UPPER_LEFT, i)):
        causal = j <= diag
        if (a == causal).all():
            if sq == skv:
                kind = CausalKind.UPPER_LEFT  # both alignments agree: name the simple one
            return "causal", kind, None
        widths = a.sum(axis=1)
        w = int(widths.max()) if widths.size else 0
        if w and (a == (causal & (j > diag - w))).all():
            return "window", kind if sq != skv else CausalKind.UPPER_LEFT, w
    return "custom", CausalKind.NONE, None


def probe_masks(graph: gs.Graph, model: onnx.ModelProto, sites: list[AttentionSite],
                feeds_list: list[dict[str, np.ndarray]], progress=None, view: GraphView | None = None
                ) -> list[dict[str, MaskMeaning]]:
    """MaskMeaning per site name, one dict per feed dict (sites without a mask, or whose mask cannot be
    probed, are absent). The masks are built in `graph` for the duration (then removed again) and run on
    one ONNX Runtime session over just the nodes they need. `view`: the shapes that tell the logits' query
    and key lengths from the graph inputs' (else they are read off the logits, which runs the layers)."""
    tensors = graph.tensors()
    inputs = {t.name for t in graph.inputs}
    wanted: dict[str, gs.Tensor] = {}
    by_name = {n.name: n for n in graph.nodes if n.name}
    padding: dict[str, bool] = {}
    mark = len(graph.nodes)
    try:
        for site in sites:
            if site.source.is_contrib:  # its masks are the op's inputs, laid out as its kernel
                continue  # reads them (GroupQueryAttention's bias over its compacted present), not over the logits
            steps = logit_ops.masking(site.mask_steps)
            if not steps or not all(logit_ops.unit(s).probe_ok for s in steps):
                continue
            try:
                m, kind = logit_ops.materialize(graph, tensors, steps, f"probe/{site.name}", _dtype(site.dtype))
            except (KeyError, ValueError):
                continue
            padding[site.name] = depends_on_input_values(m, inputs)
            if site.source == SiteSource.PATTERN:  # an attention op's mask meets its logits inside it
                m = _as_met(graph, by_name, steps, m, f"probe_met/{site.name}", view)
            out = gs.Variable(f"probe_out/{site.name}", dtype=np.bool_ if kind == MaskKind.BOOLEAN else _dtype(site.dtype))
            graph.nodes.append(gs.Node("Identity", f"probe_id/{site.name}", inputs=[m], outputs=[out]))
            wanted[site.name] = out
        if not wanted:
            return [{} for _ in feeds_list]
        try:  # a probe that cannot run is dropped
            run = bounded_evaluator(graph, list(wanted.values()), model, quiet=True)
        except Exception:
            return [{} for _ in feeds_list]
        results: list[dict[str, MaskMeaning]] = []
        counted = progress.count(feeds_list, f"probing the masks of {len(wanted)} sites", unit="probe") \
            if progress is not None else feeds_list
        for feeds in counted:
            try:
                values = run(feeds)
            except Exception:
                results.append({})
                continue
            results.append({name: _meaning(np.asarray(v), padding[name]) for name, v in zip(wanted, values)})
        return results
    finally:
        for node in graph.nodes[mark:]:  # the analysis graph is rewritten next: leave it as it was
            node.inputs.clear()
            node.outputs.clear()
        del graph.nodes[mark:]


def _as_met(graph: gs.Graph, by_name: dict, steps, m: gs.Tensor, name: str, view: GraphView | None = None
            ) -> gs.Tensor:
    """M with its (query, key) axes expanded to those of the logits it meets (the output of the last masking step),
    its other axes as they are (a bias added in another frame, [B*N, S, S], keeps its own): a mask the graph
    broadcasts over the keys (whisper's mask[:n, :n] at one new token, (1, 1)) masks no key, which M's own shape
    does not say. Those two lengths are taken from the graph inputs where `view` names them as input dims: read
    off the logits themselves, the probe would run every layer before the site (the whole model for the last
    one: 16 GB of weights in one session for an 8B)."""
    met = by_name.get(steps[-1].node)
    if met is None or not met.outputs:
        return m
    emit = Emitter(graph, name)
    lead = emit.shape_slice(m, 0, -2)
    rows_keys = _input_lengths(emit, graph, view, met.outputs[0]) \
        or emit.shape_slice(met.outputs[0], -2, np.iinfo(np.int64).max)
    return emit("Expand", [m, emit("Concat", [lead, rows_keys], {"axis": 0}, dtype=np.int64)], dtype=m.dtype)


def _input_lengths(emit: Emitter, graph: gs.Graph, view: GraphView | None, logits: gs.Tensor) -> gs.Tensor | None:
    """Shape(logits)[-2:] built from the graph inputs' shapes, where `view` names both dims as dims of a graph
    input (an input's axis is cheap to read; a length that is a sum, such as past + new tokens, is not named so);
    else None."""
    shape = view.shape(logits) if view is not None else None
    if shape is None or len(shape) < 2:
        return None
    axes: dict[str, tuple[gs.Tensor, int]] = {}
    for t in graph.inputs:
        for axis, d in enumerate(t.shape or ()):
            if isinstance(d, str) and d:
                axes.setdefault(d, (t, axis))
    if not all(isinstance(d, str) and d in axes for d in shape[-2:]):
        return None
    parts = [emit.shape_slice(axes[d][0], axes[d][1], axes[d][1] + 1) for d in shape[-2:]]
    return emit("Concat", parts, {"axis": 0}, dtype=np.int64)


def _meaning(value: np.ndarray, padding: bool) -> MaskMeaning:
    meaning = MaskMeaning(padding=padding)
    if value.ndim < 2:
        meaning.pattern = "custom"
        return meaning
    allowed = value if value.dtype == np.bool_ else value > MASKED_FILL
    if value.dtype != np.bool_:
        meaning.bias = bool(np.any(value[allowed] != 0))
    meaning.pattern, meaning.causal, meaning.window = classify_pattern(allowed)
    meaning.allowed = allowed
    return meaning


def _dtype(name: str):
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(np.float32)


# ---------------------------------------------------------------- match + probe
@timed("match and probe")
def analyse(model: onnx.ModelProto, feeds=None, progress=None, dims: dict | None = None, merge: bool = False
            ) -> tuple[gs.Graph, MatchResult, dict]:
    """Match sites and probe what their masks mean. Returns (graph, match result, meanings): the graph is
    imported once (weights left on disk stay there) and comes back unchanged, ready to be rewritten.
    `progress` (report.Progress) counts the probe runs; `dims`: the dims the model runs at (graph/dims.py),
    where values and shapes a pattern cannot tell are measured (graph/measure.py). `merge`: single-head sites
    proved one attention become one multi-head site (heads_merge.py; the parts in result.heads_merged), whose
    mask means what its first head's does (the same mask steps, by the proof)."""
    graph = import_graph(model)
    view = GraphView(graph, model, dims=dims, inferred=inferred_shapes(graph, model, dims))
    result = match(graph, view)
    meanings = {}
    if result.sites:
        if feeds is None:
            feeds = [make_feeds(model, all_keys=True)]
        meanings = _agree(probe_masks(graph, model, result.sites, feeds, progress, view))
        result.sites = [_apply_meaning(s, meanings.get(s.name)) for s in result.sites]
        if merge:
            result.sites, result.heads_merged = merge_heads(view, result.sites)
    return graph, result, meanings


def probe_feeds(model: onnx.ModelProto, dims: dict | None = None) -> list[dict]:
    """Inputs without padding at two sequence lengths: a band (sliding window) shorter than the
    first length would look causal; the second, doubled, length tells them apart."""
    base = resolve_dims(model, dims)
    ops = op_dims(model)  # sizes the attention ops fix stay; their totals follow the doubled lengths
    doubled = ops.decode({k: (v if k.startswith("batch") or k in ops.fixed else 2 * v) for k, v in base.items()},
                         dims or {})
    # and at the other dims verification runs at (a prefill, a decode step: graph/dims.py's Fit.also), where a
    # mask may read otherwise
    return [make_feeds(model, dims=base, all_keys=True),
            make_feeds(model, dims=doubled, all_keys=True)] + \
        [make_feeds(model, dims=other, all_keys=True) for other in getattr(dims, "also", ())]


def _agree(probes: list[dict]) -> dict:
    """One conclusion per site that every probe's mask agrees with: a decode step (one query)
    sees no causal restriction that a longer probe shows, so each probe's pattern is checked
    against the others' masks; the most specific consistent one wins, else the mask is custom."""
    if not probes:
        return {}
    out = {}
    for name, first in probes[0].items():
        seen = [m for p in probes if (m := p.get(name)) is not None]
        allowed = [m.allowed for m in seen if m.allowed is not None]
        if len(allowed) < len(probes):
            first.pattern, first.causal, first.window = "custom", CausalKind.NONE, None
            out[name] = first
            continue
        found = list(dict.fromkeys((m.pattern, m.causal, m.window) for m in seen))
        # a square probe names a causal band upper-left (both alignments agree there): lower-right reads it as well
        found += [(p, CausalKind.LOWER_RIGHT, w) for p, c, w in found if c == CausalKind.UPPER_LEFT]
        candidates = sorted(dict.fromkeys(found), key=lambda c: c[0] == "none")
        for pattern, causal, window in candidates:
            if pattern != "custom" and all(consistent(pattern, causal, window, a) for a in allowed):
                break
        else:
            pattern, causal, window = "custom", CausalKind.NONE, None
        first.pattern, first.causal, first.window = pattern, causal, window
        first.padding = any(m.padding for m in seen)
        first.bias = any(m.bias for m in seen)
        out[name] = first
    return out


def _apply_meaning(site: AttentionSite, meaning) -> AttentionSite:
    if meaning is None:
        return site
    causal = site.causal if site.causal != CausalKind.NONE else meaning.causal
    site = site.replace(causal=causal, window=meaning.window, padding=meaning.padding)
    if meaning.pattern == "none" and not meaning.padding and not meaning.bias \
            and not any(s.op == "sink" for s in site.mask_steps):
        # a mask of shapes alone that every probe saw all zero masks nothing (the ONNX Attention body's
        # ConstantOfShape bias when the op has no mask): the site has none
        site = site.replace(mask=MaskKind.NONE,
                            mask_steps=tuple(s for s in site.mask_steps if not logit_ops.unit(s).masks))
    return site
