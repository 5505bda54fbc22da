"""KV cache roles: K/V concatenated with a past cache, or read from a static (cross) cache."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..graph.view import GraphView
from ..site import CacheKind, SiteKind


@dataclass
class CacheRole:
    kind: CacheKind = CacheKind.NONE
    past_key: str | None = None
    past_value: str | None = None
    new_key: gs.Tensor | None = None
    new_value: gs.Tensor | None = None


def _concat_parts(view: GraphView, t: gs.Tensor, seq_axis: int | None):
    n = view.producer(t)
    if n is None or n.op != "Concat" or len(n.inputs) != 2 or seq_axis is None:
        return None
    rank = view.rank(t)
    if rank is None or n.attrs.get("axis", 0) % rank != seq_axis % rank:
        return None
    return n.inputs[0], n.inputs[1]


def _is_input(view: GraphView, t: gs.Tensor) -> bool:
    return view.skip_passthrough_up(t).name in view.inputs


def find_cache(view: GraphView, key: gs.Tensor, value: gs.Tensor, k_axis: int | None, v_axis: int | None) -> CacheRole:
    """K and V as the fused op reads them, with the axis of their key positions."""
    kparts = _concat_parts(view, key, k_axis)
    vparts = _concat_parts(view, value, v_axis)
    if kparts and vparts:  # name the past as the graph has it (exporters wrap inputs in Identity/Concat)
        past_k, past_v = view.skip_passthrough_up(kparts[0]), view.skip_passthrough_up(vparts[0])
        return CacheRole(CacheKind.CONCAT, past_k.name, past_v.name, kparts[1], vparts[1])
    if _is_input(view, key) and _is_input(view, value):
        k, v = view.skip_passthrough_up(key), view.skip_passthrough_up(value)
        return CacheRole(CacheKind.CROSS_STATIC, k.name, v.name)
    return CacheRole()


# ---------------------------------------------------------------- self or cross
_THROUGH = {"Reshape", "Transpose", "Identity", "Cast", "Unsqueeze", "Squeeze", "Add", "Mul", "Div",
            "Split", "Slice", "Gather", "Expand", "Tile", "RotaryEmbedding", "Neg", "Concat",
            "SimplifiedLayerNormalization", "RMSNormalization", "LayerNormalization", "Dropout"}


@dataclass(frozen=True)
class Source:
    """Where a Q/K operand comes from: the hidden state a projection read, or a graph input read as is."""

    name: str
    projected: bool  # False: the operand is a graph input itself (no projection says which hidden state)


def projection_source(view: GraphView, t: gs.Tensor, budget: int = 24) -> Source | None:
    """The hidden state a Q/K operand was projected from (the data input of the first MatMul/Gemm with
    constant weights above it), or the graph input it is read from as is."""
    seen = set()
    stack = [(t, budget)]
    while stack:
        t, b = stack.pop(0)  # breadth first: the nearest projection wins
        if t.name in seen or b == 0:
            continue
        seen.add(t.name)
        if t.name in view.inputs:
            return Source(t.name, projected=False)
        n = view.producer(t)
        if n is None:
            continue
        if n.op in ("MatMul", "Gemm"):
            data = [i for i in n.inputs[:2] if view.const(i) is None]
            if len(data) == 1:
                return Source(view.skip_passthrough_up(data[0]).name, projected=True)
            continue
        if n.op not in _THROUGH:
            continue
        # follow data inputs only (skip constants and shape operands)
        ins = [i for i in n.inputs if isinstance(i, gs.Variable) and view.const(i) is None]
        if n.op == "Concat" and len(ins) == 2:
            ins = ins[1:]  # Concat(past, new): the new part was projected
        for i in ins[:2]:
            stack.append((i, b - 1))
    return None


def site_kind(view: GraphView, q: gs.Tensor, key: gs.Tensor, role: CacheRole) -> SiteKind:
    """Self or cross attention, decided by where Q and the (new) K come from: projections of one hidden state
    are self-attention, of two cross-attention; a projected query over K/V read from graph inputs is
    cross-attention over a static cache. A Q or K that is a graph input itself says nothing of its hidden
    state: over a concatenated cache (keys that grow step by step with the queries, which a cross-attention's
    K/V computed once never do) the site is self-attention; otherwise its kind is unknown."""
    q_src = projection_source(view, q)
    k_src = projection_source(view, role.new_key if role.kind == CacheKind.CONCAT and role.new_key is not None
                              else key)
    if (q_src is not None and not q_src.projected) or (k_src is not None and not k_src.projected
                                                       and role.kind != CacheKind.CROSS_STATIC):
        return SiteKind.SELF if role.kind == CacheKind.CONCAT else SiteKind.UNKNOWN
    if role.kind == CacheKind.CROSS_STATIC:
        return SiteKind.CROSS
    return SiteKind.CROSS if q_src is not None and k_src is not None and q_src.name != k_src.name else SiteKind.SELF
