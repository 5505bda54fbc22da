"""match(): every Softmax tried as the anchor of an attention core, every fused attention op read, and
every attention-like Softmax that is not fused listed with why (never silent)."""

from __future__ import annotations

import weakref

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph.dim_names import lengths_vary
from ..graph.roles import input_specs
from ..graph.view import GraphView, import_graph
from ..site import (
    AttentionSite,
    CausalKind,
    MaskStep,
    MatchResult,
    ScalePlacement,
    SiteLayout,
    SiteQuant,
    SiteSource,
    Skipped,
)
from . import canonical, contraction, fused_ops, likeness, partition, subgraphs
from .axes import Atoms, Unfollowable, atoms_of
from .cache import cache_lengths, find_cache, site_kind
from .core import Core, find_core
from .errors import NotAttention, Unsupported
from .heads import (
    candidates,
    choose,
    heads_of,
    kv_heads_in,
    layout_of,
    resolve_key,
    size_of,
    strip_scale,
    target,
    upstream_scale,
)
from .logit_ops import kind_of, logit_scale, softcap
from .rope import find_rope, read_rope


def match(model: onnx.ModelProto | gs.Graph, view: GraphView | None = None) -> MatchResult:
    """The sites of `model`. A gs.Graph given is made canonical in place (canonical.py: each softmax written
    without a Softmax op becomes one, writing the same probabilities tensor); a ModelProto is not modified."""
    if view is None:
        graph = import_graph(model) if isinstance(model, onnx.ModelProto) else model  # weights on disk: their folder
        view = GraphView(graph, model if isinstance(model, onnx.ModelProto) else None)
    result = MatchResult()
    _match_graph(view, result, {}, ())
    return result


def _match_graph(view: GraphView, result: MatchResult, names: dict[str, int], path: tuple) -> None:
    """The sites of one graph, then of the subgraphs of its control-flow nodes (subgraphs.py). Softmaxes
    written without a Softmax op become one first (canonical.py); those it cannot prove are listed."""
    canon = canonical.canonicalize(view.graph, view.opset, view.rank)
    if not path:  # the graph given was changed in place (a subgraph's is a copy: subgraphs.view_of)
        result.canonical.update(canon.made)
    for u in canon.unproven:
        where = f" (in {_where(path)})" if path else ""
        record = Skipped(_site_name(u.anchor.name or u.anchor.outputs[0].name, names), u.reason + where, u.anchor.name)
        if likeness.attention_like_between(view, u.logits, u.anchor.outputs[0]):
            result.skipped.append(record)
        else:
            result.ignored.append(record)
    parts, shared, refused, unfolded = partition.join_pieces(view)
    result.pieces.update({name: "key partition" for name in parts} | {made: "shared probabilities" for made in shared}
                         | unfolded)
    if parts or shared or unfolded:
        view.graph.toposort()
    for node in list(view.graph.nodes):
        try:
            if node.op == "Softmax":
                if node.name in refused:
                    raise Unsupported(refused[node.name])
                site = _with_pieces(_site_from_softmax(view, node), parts, shared)
                if node.name in canon.made:
                    site = site.replace(notes=site.notes + (f"softmax written as {canon.made[node.name]}",))
            elif fused_ops.is_fused_attention(node):
                site = fused_ops.site_from_node(view, node)
            else:
                continue
        except (NotAttention, Unsupported) as e:  # listed or ignored with why; anything else is our bug: a crash
            where = f" (in {_where(path)})" if path else ""
            verdict = likeness.judged(view, node, e) if node.op == "Softmax" else likeness.Likeness(True)
            if verdict.attention:
                name = _site_name(node.name or node.outputs[0].name, names)
                result.skipped.append(Skipped(name, str(e) + where, node.name))
            else:
                result.ignored.append(Skipped(node.name, verdict.reason + where, node.name))
            continue
        result.sites.append(site.replace(name=_site_name(site.name or site.output, names), graph=path))
    for node, attr, sub in subgraphs.subgraphs(view.graph):
        inner = path + ((node.outputs[0].name, attr),)
        try:
            sub_view, weights = subgraphs.view_of(view, sub)
            contraction.activations(sub_view, weights)
        except Exception as e:  # a subgraph that cannot be read on its own: its softmaxes are listed
            for sm in (n for n in sub.nodes if n.op == "Softmax"):
                result.skipped.append(Skipped(_site_name(sm.name or sm.outputs[0].name, names),
                                              f"in {_where(inner)}, which cannot be analysed on its own: {e}", sm.name))
            continue
        _match_graph(sub_view, result, names, inner)


def _with_pieces(site: AttentionSite, parts: dict, shared: dict[str, str]) -> AttentionSite:
    """The site with what partition.py proved of its pieces: the key blocks it joined, or the value products
    that share its probabilities (one attention each)."""
    name = site.softmax or ""
    if name in parts:
        return site.replace(partition=parts[name], notes=site.notes + (parts[name].note(),))
    original = shared.get(name, name)
    if original in shared.values():
        count = 1 + sum(1 for o in shared.values() if o == original)
        return site.replace(notes=site.notes + (f"the probabilities of {original} feed {count} value products: one "
                                                "attention per product",))
    return site


def _where(path: tuple) -> str:
    return " > ".join(f"{attr} of the node making {out}" for out, attr in path)


def _site_name(name: str, used: dict[str, int]) -> str:
    """A readable, unique site name: the module path of the softmax (/model/layers.0/self_attn)."""
    base = name.rsplit("/", 1)[0].strip("/") if "/" in name else name
    base = base or name
    if base in used:
        used[base] += 1
        return f"{base}#{used[base]}"
    used[base] = 0
    return base


def _placement(q_scale: float, k_scale: float, logit: float, upstream_q: float) -> ScalePlacement:
    on = [x != 1.0 for x in (q_scale * upstream_q, k_scale, logit)]
    if not any(on):
        return ScalePlacement.NONE
    if on == [True, True, False] and abs(q_scale * upstream_q - k_scale) < 1e-6 * abs(k_scale):
        return ScalePlacement.SQRT_ON_QK
    if sum(on) > 1:
        return ScalePlacement.MIXED
    return [ScalePlacement.ON_Q, ScalePlacement.ON_K, ScalePlacement.AFTER_BMM1][on.index(True)]


def _operands(view: GraphView, core: Core):
    """The Q, K and V the fused op reads (heads.py: candidates), the heads, and K/V's heads under GQA."""
    atoms = core.atoms
    q_c = candidates(view, core.q_operand, core.q_frame, atoms)
    k_c = candidates(view, core.k_operand, core.k_frame, atoms, repeats=True)
    v_c = candidates(view, core.v_operand, core.v_frame, atoms, repeats=True, scales=False)
    flat = [a for g in atoms.resolve(tuple((b,) for b in core.batch)) for a in g]
    heads = heads_of(q_c, core.batch, atoms)
    batch = tuple(a for a in flat if a not in heads)
    q = choose(q_c, target(batch, heads, core.query, "c"), atoms)
    if q is None:
        raise Unsupported(f"cannot read Q of {core.bmm1.node.name} as [batch, heads, seq, dim]")
    options = sorted({kv for c in k_c if (kv := kv_heads_in(c, heads, atoms)) is not None}, key=len)
    for kv in options:
        k = choose([c for c in k_c if kv_heads_in(c, heads, atoms) == kv], target(batch, kv, core.key, "c"), atoms)
        v = choose([c for c in v_c if kv_heads_in(c, heads, atoms) == kv], target(batch, kv, core.key, "e"), atoms)
        if k is not None and v is not None:
            return q, k, v, batch, heads, kv
    raise Unsupported(f"cannot read K and V of {core.bmm1.node.name} and {core.bmm2.node.name} with the same heads")


_LENGTHS_VARY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # view -> lengths_vary of its model


def _lengths_vary(view: GraphView) -> bool:
    """Whether the model's inputs have a symbolic dim besides the batch (without a model: assume so)."""
    if view.model is None:
        return True
    if view not in _LENGTHS_VARY:
        _LENGTHS_VARY[view] = lengths_vary(input_specs(view.model))
    return _LENGTHS_VARY[view]


def _notes(view: GraphView, core: Core, upstream: float, *, gqa: bool, repeat: int) -> tuple[str, ...]:
    """What the report says of a pattern site: defaults taken, and what its rewrite leaves out or reads otherwise."""
    notes = list(core.notes) + _defaults_taken(view, core.steps)
    if upstream != 1.0:
        notes.append(f"query pre-scaled by {upstream:g} before the head split")
    if gqa:
        notes.append(f"GQA head repeat x{repeat} dropped")
    if core.logits_cast is not None:
        notes.append("the softmax's own precision cast dropped: the fused op computes it in the products' precision")
    if core.qk_output is not None:
        what = "probabilities" if core.qk_output[2] == 3 else "logits"
        notes.append(f"its {what}, which the model returns, as the op's qk_matmul_output (mode {core.qk_output[2]})")
    if core.bmm1.node.op == "Einsum" or core.bmm2.node.op == "Einsum":
        notes.append("products written as Einsum")
    return tuple(notes)


def _site_from_softmax(view: GraphView, sm: gs.Node) -> AttentionSite:
    core = find_core(view, sm)
    atoms = core.atoms
    try:
        q, k, v, batch, heads, kv = _operands(view, core)
    except Unfollowable as e:
        raise Unsupported(str(e)) from None
    for atom, size, node in atoms.baked((core.query, core.key), _lengths_vary(view)):
        what = "query" if atom == core.query else "key"
        raise Unsupported(f"Reshape {node} writes the {what} length {size} into the graph where the model's length "
                          "is symbolic: at other lengths it attends within blocks of that length, which no fused "
                          "attention computes")
    precisions = {str(view.dtype(x.tensor)) for x in (q, k, v) if view.dtype(x.tensor) is not None}
    if len(precisions) > 1:
        raise Unsupported(f"Q, K and V of {core.bmm1.node.name} and {core.bmm2.node.name} are in different "
                          f"precisions ({', '.join(sorted(precisions))}): one fused op takes one")
    logit = logit_scale(core.steps)
    upstream = upstream_scale(view, q.tensor)
    rename = {core.query: "q", core.key: "k", "c": "d", "e": "e"}
    ren = lambda f: tuple(tuple(rename.get(a, a) for a in g) for g in atoms.resolve(f))  # noqa: E731
    steps = tuple(MaskStep(s.op, s.operand, s.value, s.node, ren(s.frame) if s.frame is not None else None)
                  for s in core.steps)
    frames = {"q": ren(q.frame), "k": ren(k.frame), "v": ren(v.frame), "out": ren(core.out_frame)}
    operands = [(q.tensor, q.frame), (k.tensor, k.frame), (v.tensor, v.frame),
                (core.q_operand, core.q_frame), (core.k_operand, core.k_frame), (core.v_operand, core.v_frame)]
    broadcast = [_is_broadcast(view, t, f, atoms) for t, f in operands]
    dims = _dims(atoms, rename, [(t, f) for (t, f), b in zip(operands, broadcast) if not b])
    layout = SiteLayout(q.tensor.name, k.tensor.name, v.tensor.name, frames["q"], frames["k"], frames["v"],
                        frames["out"], batch, heads, kv, dims,
                        tuple((name, ren(f)) for name, f in core.shape_reads), q.scale * k.scale * logit,
                        ren(core.qk_output[1]) if core.qk_output else (),
                        tuple(x for x, b in zip("qkv", broadcast) if b), _qk_dtype(view, core))
    q_heads, kv_heads = size_of(heads, atoms) if heads else 1, size_of(kv, atoms) if kv else 1
    head, v_head = atoms.known("c"), atoms.known("e")

    bmm1 = core.bmm1.node
    rank = len(core.q_frame)
    matmul = bmm1.op == "MatMul" and rank in (3, 4) and core.q_index == 0
    query, _ = strip_scale(view, core.q_operand)
    key = resolve_key(view, core.k_operand, rank) if matmul else None
    key_perm = _perm(frames["k"], target(batch, kv, "k", "d"))
    cache = find_cache(view, k.tensor, v.tensor, _axis_of(frames["k"], "k"), _axis_of(frames["v"], "k"))
    kind = site_kind(view, q.tensor, k.tensor, cache)
    bnsh = frames["q"] == target(batch, heads, "q", "d") and len(frames["q"]) == 4
    # a 3-D attention ([B, S, hidden], one head) may rotate heads folded in its last axis: read by value only
    rope = find_rope(view, q.tensor, k.tensor, head) if bnsh else \
        read_rope(view, q.tensor, k.tensor) if len(frames["q"]) == 3 else None

    repeat = q_heads // kv_heads if q_heads and kv_heads else 0
    notes = _notes(view, core, upstream, gqa=kv != heads and bool(repeat), repeat=repeat)
    quant = SiteQuant(q.quant, k.quant, v.quant, core.logits_quant, core.probs_quant)
    return AttentionSite(
        name=sm.name,
        kind=kind,
        query=query.name if matmul else q.tensor.name,
        key=k.tensor.name,
        value=v.tensor.name,
        output=core.bmm2.node.outputs[0].name,
        k_layout=layout_of(list(key_perm) if key_perm else None),
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_size=head,
        v_head_size=v_head,
        scale=layout.scale,
        prescale=upstream,
        scale_placement=_placement(q.scale, k.scale, logit, upstream),
        mask=kind_of(steps),
        mask_steps=steps,
        causal=CausalKind.NONE,
        cache=cache.kind,
        past_key=cache.past_key,
        past_value=cache.past_value,
        new_key=cache.new_key.name if cache.new_key is not None else None,
        new_value=cache.new_value.name if cache.new_value is not None else None,
        rope=rope,
        rank=rank,
        source=SiteSource.PATTERN,
        softmax=sm.name,
        dtype=str(view.dtype(q.tensor) or view.dtype(core.q_operand) or "float32"),
        products_dtype=_products_dtype(view, core),
        key_perm=key_perm,
        key_transposed=key.adjacent.name if key is not None and key.adjacent is not None else None,
        key_transposed_scale=key.inner_scale if key is not None else 1.0,
        logits_cast=core.logits_cast,
        notes=notes,
        layout=layout,
        softcap=softcap(steps),
        quant=quant if any(vars(quant).values()) else None,
        qk_output=core.qk_output[0] if core.qk_output else None,
        qk_mode=core.qk_output[2] if core.qk_output else None,
        cache_lengths=cache_lengths(view, k.tensor, _axis_of(frames["k"], "k")),
    )


def _qk_dtype(view: GraphView, core) -> str | None:
    t = view.tensors.get(core.qk_output[0]) if core.qk_output else None
    dtype = view.dtype(t) if t is not None else None
    return str(np.dtype(dtype)) if dtype is not None else None


def _defaults_taken(view: GraphView, steps) -> list[str]:
    """A scale read from a graph input that has a default (keep_initializers_as_inputs) is taken at that
    default: ONNX Runtime feeds it unless told otherwise, and the fused op's scale is an attribute."""
    if not view.defaults:
        return []
    names = {s.node for s in steps if s.op == "scale"}
    return [f"scale {t.name} is a graph input with a default: taken at its default {view.scalar(t):g} (the "
            "rewritten model no longer reads it)"
            for n in view.graph.nodes if n.name in names for t in n.inputs if t.name in view.defaults
            and view.scalar(t) is not None]


def _perm(src: tuple, dst: tuple) -> tuple[int, ...] | None:
    """The Transpose turning a 4-D operand of frame `src` into BNSH (None: it is BNSH or not a permutation)."""
    if len(src) != 4 or len(dst) != 4 or sorted(src) != sorted(dst) or src == dst or len(set(src)) != 4:
        return None
    return tuple(src.index(g) for g in dst)


def _axis_of(frame: tuple, atom: str) -> int | None:
    return next((i for i, g in enumerate(frame) if atom in g), None)


def _is_broadcast(view: GraphView, t, frame, atoms: Atoms) -> bool:
    """`t` holds size 1 on an axis of batch atoms a product broadcasts it over (core.py: _broadcast_batch)."""
    shape = view.shape(t)
    if not atoms.broadcast or shape is None or len(shape) != len(frame):
        return False
    return any(d == 1 and any(a in atoms.broadcast for a in g) for g, d in zip(atoms.resolve(frame), shape))


def _dims(atoms: Atoms, rename: dict, tensors: list) -> tuple:
    """How to get each atom's size (and each merged group's) when rewriting: static, a dim of a tensor the
    fused op reads (or of a layout op between it and the product), the entry of a Reshape target that
    computes it, or a dim divided by static parts."""
    ren = lambda a: rename.get(a, a)  # noqa: E731
    recipes: dict[tuple, tuple] = {}
    for t, frame in tensors:
        for i, g in enumerate(atoms.resolve(frame)):
            key = tuple(ren(a) for a in g)
            if key and key not in recipes:
                recipes[key] = ("axis", t.name, i)
    for a in list(atoms.size):
        if a in atoms.parts:
            continue
        key = (ren(a),)
        if atoms.known(a) is not None:
            recipes[key] = ("static", atoms.known(a))
    for a, (target_name, index) in atoms.entries.items():
        if a not in atoms.parts and (ren(a),) not in recipes:
            recipes[(ren(a),)] = ("entry", target_name, index)
    for parent in atoms.parts:
        leaves = atoms.resolve(((parent,),))[0]
        whole = recipes.get(tuple(ren(a) for a in leaves))
        missing = [a for a in leaves if (ren(a),) not in recipes]
        if whole is not None and len(missing) == 1:
            recipe, divisor = whole, 1
            for a in leaves:
                if a == missing[0]:
                    continue
                size = atoms.known(a)
                if size is not None:
                    divisor *= size
                else:  # a part whose size is read at run time
                    recipe = ("part", recipe, recipes[(ren(a),)])
            recipes[(ren(missing[0]),)] = ("part", recipe, divisor) if divisor != 1 else recipe
    return tuple(recipes.items())


__all__ = ["match", "atoms_of"]


def _products_dtype(view: GraphView, core: Core) -> str | None:
    """The narrow float type (fp16, bf16) the original's products read, Q.K^T or P.V: what its attention is
    rounded to, whatever the tensors the fused op reads are in (Casts around the MatMuls)."""
    types = {str(view.dtype(t)) for t in (*core.bmm1.operands, *core.bmm2.operands) if view.dtype(t) is not None}
    return next((t for t in ("float16", "bfloat16") if t in types), None)
