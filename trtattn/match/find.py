"""match(): every Softmax tried as the anchor of an attention core, and every fused attention op read."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from ..graph.view import GraphView
from ..site import AttentionSite, CacheKind, CausalKind, MatchResult, ScalePlacement, SiteKind, Skipped
from . import fused_ops
from .cache import find_cache, projection_source
from .core import find_core
from .errors import NotAttention, Unsupported
from .heads import heads_and_size, layout_of, resolve_key, resolve_value, strip_scale, upstream_scale
from .logit_ops import kind_of, logit_scale
from .rope import find_rope


def match(model: onnx.ModelProto | gs.Graph, view: GraphView | None = None) -> MatchResult:
    if view is None:
        graph = gs.import_onnx(model) if isinstance(model, onnx.ModelProto) else model
        view = GraphView(graph, model if isinstance(model, onnx.ModelProto) else None)
    result = MatchResult()
    names: dict[str, int] = {}
    for node in list(view.graph.nodes):
        try:
            if node.op == "Softmax":
                site = _site_from_softmax(view, node)
            elif fused_ops.is_fused_attention(node):
                site = fused_ops.site_from_node(view, node)
            else:
                continue
        except NotAttention as e:
            result.ignored.append(Skipped(node.name, str(e)))
            continue
        except Unsupported as e:
            result.skipped.append(Skipped(_site_name(node.name or node.outputs[0].name, names), str(e)))
            continue
        result.sites.append(site.replace(name=_site_name(site.name or site.output, names)))
    return result


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


def _site_from_softmax(view: GraphView, sm: gs.Node) -> AttentionSite:
    core = find_core(view, sm)
    q_in, kt = core.bmm1.inputs
    rank = view.rank(q_in) or view.rank(kt) or view.rank(core.bmm2.outputs[0])
    if rank not in (3, 4):
        raise Unsupported(f"attention MatMuls of rank {rank} (only 3-D [B*N, S, H] and 4-D [B, N, S, H] are supported)")
    q, q_scale = strip_scale(view, q_in)
    key = resolve_key(view, kt, rank)
    value = resolve_value(view, core.bmm2.inputs[1], rank)
    upstream = upstream_scale(view, q)
    logit = logit_scale(core.steps)

    if key.repeat != value.repeat:  # drop neither: the fused op needs equal K and V head counts
        key, value = resolve_key(view, kt, rank, strip=False), resolve_value(view, core.bmm2.inputs[1], rank, strip=False)
    q_heads, head = heads_and_size(view, q, None, rank)
    kv_heads, k_head = heads_and_size(view, key.tensor, key.perm, rank)
    _, v_head = heads_and_size(view, value.tensor, value.perm, rank)
    if head is not None and k_head is not None and head != k_head:
        raise Unsupported(f"query head size {head} differs from key head size {k_head}")
    if q_heads and kv_heads and q_heads % kv_heads:
        raise Unsupported(f"{q_heads} query heads are not a multiple of {kv_heads} key/value heads")

    cache = find_cache(view, key.tensor, value.tensor, rank) if key.perm is None else find_cache(view, kt, kt, rank)
    q_src = projection_source(view, q)
    k_src = projection_source(view, cache.new_key if cache.new_key is not None else key.tensor)
    cross = cache.kind == CacheKind.CROSS_STATIC or (q_src is not None and k_src is not None and q_src != k_src)
    rope = find_rope(view, q, key.tensor if key.perm is None else kt, head) if rank == 4 else None

    notes = []
    if upstream != 1.0:
        notes.append(f"query pre-scaled by {upstream:g} before the head split")
    if key.repeat > 1:
        notes.append(f"GQA head repeat x{key.repeat} dropped")
    return AttentionSite(
        name=sm.name,
        kind=SiteKind.CROSS if cross else SiteKind.SELF,
        query=q.name,
        key=key.tensor.name,
        value=value.tensor.name,
        output=core.bmm2.outputs[0].name,
        k_layout=layout_of(key.perm),
        v_layout=layout_of(value.perm),
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_size=head,
        v_head_size=v_head,
        scale=q_scale * key.scale * logit,
        prescale=upstream,
        scale_placement=_placement(q_scale, key.scale, logit, upstream),
        mask=kind_of(core.steps),
        mask_steps=tuple(core.steps),
        causal=CausalKind.NONE,
        cache=cache.kind,
        past_key=cache.past_key,
        past_value=cache.past_value,
        new_key=cache.new_key.name if cache.new_key is not None else None,
        new_value=cache.new_value.name if cache.new_value is not None else None,
        rope=rope,
        rank=rank,
        source="pattern",
        softmax=sm.name,
        dtype=str(view.dtype(q) or "float32"),
        key_perm=tuple(key.perm) if key.perm else None,
        key_transposed=key.adjacent.name if key.adjacent is not None else None,
        key_transposed_scale=key.inner_scale,
        logits_cast=core.logits_cast,
        notes=tuple(notes),
    )
