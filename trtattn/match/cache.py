"""KV cache roles: K/V concatenated with a past cache, or read from a static (cross) cache."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..graph.measure import Sizes, shape_or_measured
from ..graph.view import GraphView
from ..site import CacheKind, CacheLength, SiteKind


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


# ---------------------------------------------------------------- caches the graph appends to
_SAME_AXES = ("Identity", "Cast", "Dropout", "Slice")  # each output axis is the input's (a Slice: a window of it)
_MAX_UP = 12  # nodes between a site's K and the Concat that appends to a cache, at most


def cache_lengths(view: GraphView, key: gs.Tensor, axis: int | None) -> tuple[CacheLength, ...]:
    """The graph input concatenated onto `key` along its key axis `axis`, with its length dim and the new part's:
    followed up from K axis by axis (a Slice of the last positions, a sliding cache; the head split; a Transpose)
    to a Concat along that axis, whose one graph-input part (through a Gather of one cache of a stack) is the
    cache. () when there is none, or the axis is lost on the way."""
    t = key
    for _ in range(_MAX_UP):
        n = view.producer(t)
        if axis is None or n is None or not n.inputs:
            return ()
        if n.op == "Concat":
            rank = view.rank(t)
            if rank is None or n.attrs.get("axis", 0) % rank != axis % rank:
                return ()
            return _appended(view, n, axis % rank)
        scaled = _scaled(view, n, t)
        if scaled is not None:  # K times a constant (openai-whisper scales K by head_size ** -0.25): same axes
            t = scaled
            continue
        axis, t = _axis_above(view, n, t, axis), n.inputs[0]
    return ()


def _scaled(view: GraphView, n: gs.Node, out: gs.Tensor) -> gs.Tensor | None:
    """The one computed operand of `n` when `n` multiplies or divides it by a constant of no more axes (each output
    axis is that operand's); else None."""
    if n.op not in ("Mul", "Div"):
        return None
    computed = [i for i in n.inputs[:2] if view.const(i) is None]
    if len(computed) != 1 or view.rank(computed[0]) != view.rank(out):
        return None
    return computed[0]


def _appended(view: GraphView, concat: gs.Node, axis: int) -> tuple[CacheLength, ...]:
    """The one graph-input part of `concat` (along `axis`) as a CacheLength, the other parts' length its new one."""
    parts = [_input_axis(view, t, axis) for t in concat.inputs]
    caches = [p for p in parts if p is not None]
    if len(caches) != 1 or len(concat.inputs) < 2:
        return ()
    name, at = caches[0]
    past = view.tensors[name].shape  # the graph's own dims (the view's are the fitted sizes)
    if past is None or at >= len(past) or not isinstance(past[at], str):
        return ()
    news = {_input_dim(view, t, axis) for t, p in zip(concat.inputs, parts) if p is None}
    return (CacheLength(name, past[at], news.pop() if len(news) == 1 else None),)


# ops whose output axes are their (non-constant, same-rank) operands', one for one
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Relu", "Gelu", "Erf", "Tanh", "Sigmoid",
                "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "SkipLayerNormalization",
                "RotaryEmbedding"}
_MAX_TO_INPUT = 64  # nodes between the new keys and the graph input whose length they have, at most


def _input_dim(view: GraphView, t: gs.Tensor, axis: int) -> str | None:
    """The name of the graph input dim that `t`'s `axis` is: followed up axis by axis through layout ops, projections
    (a MatMul keeps its first operand's leading axes), elementwise ops and an embedding's Gather of token ids; None
    where the axis is lost or the input's dim has no name."""
    for _ in range(_MAX_TO_INPUT):
        if t.name in view.inputs:
            shape = t.shape
            return shape[axis] if shape is not None and axis < len(shape) and isinstance(shape[axis], str) else None
        n, rank = view.producer(t), view.rank(t)
        if n is None or not n.inputs or rank is None:
            return None
        axis %= rank
        if n.op == "MatMul" or n.op in _ELEMENTWISE:
            same = [i for i in n.inputs[:2] if view.const(i) is None and view.rank(i) == rank]
            if not same or (n.op == "MatMul" and axis >= rank - 1):
                return None
            t = same[0]
        elif n.op == "Gather" and view.const(n.inputs[0]) is not None and n.attrs.get("axis", 0) == 0:
            t = n.inputs[1]  # embedding rows by token id: the ids' axes lead
            if axis >= (view.rank(t) or 0):
                return None
        else:
            above = _axis_above(view, n, t, axis)
            if above is None:
                return None
            axis, t = above, n.inputs[0]
    return None


def _input_axis(view: GraphView, t: gs.Tensor, axis: int) -> tuple[str, int] | None:
    """(graph input, its axis) that `t`'s `axis` is, through casts and the Gather, or Split and Squeeze, of one cache
    out of a stack; None when `t` is computed."""
    for _ in range(4):
        t = view.skip_passthrough_up(t)  # an exporter's Identity or one-input Concat of the input
        if t.name in view.inputs:
            return t.name, axis
        n = view.producer(t)
        if n is None or not n.inputs:
            return None
        if n.op == "Gather":
            index = view.const(n.inputs[1]) if len(n.inputs) > 1 else None
            if index is None or index.ndim != 0:
                return None
            gathered = n.attrs.get("axis", 0) % (view.rank(n.inputs[0]) or 1)
            axis += int(axis >= gathered)
        elif n.op == "Split":  # one cache of a stack split along another axis (TorchScript's unbind)
            rank = view.rank(n.inputs[0])
            if rank is None or n.attrs.get("axis", 0) % rank == axis % rank:
                return None
        elif n.op in ("Squeeze", "Unsqueeze") or n.op in _SAME_AXES:
            above = _axis_above(view, n, t, axis)
            if above is None:
                return None
            axis = above
        else:
            return None
        t = n.inputs[0]
    return None


def _axis_above(view: GraphView, n: gs.Node, out: gs.Tensor, axis: int) -> int | None:
    """The axis of `n`'s first input that `out`'s `axis` is (None: not one axis of it, or not known)."""
    rank = view.rank(out)
    if rank is None:
        return None
    axis %= rank
    if n.op in _SAME_AXES:
        return axis
    if n.op == "Transpose":
        perm = n.attrs.get("perm", list(range(rank))[::-1])
        return int(perm[axis])
    if n.op in ("Squeeze", "Unsqueeze"):
        axes = n.attrs.get("axes") if "axes" in n.attrs else view.ints(n.inputs[1]) if len(n.inputs) > 1 else None
        return _unit_axes(view, n, axes, axis, rank)
    if n.op == "Reshape":
        return _reshaped(view, n, out, axis)
    return None


def _unit_axes(view: GraphView, n: gs.Node, axes, axis: int, rank: int) -> int | None:
    """The input axis `axis` of a Squeeze's or Unsqueeze's output is."""
    if n.op == "Unsqueeze":
        added = sorted(a % rank for a in axes) if axes is not None else None
        if added is None or axis in added:
            return None
        return axis - sum(a < axis for a in added)
    before = view.rank(n.inputs[0])
    if before is None:
        return None
    removed = sorted(a % before for a in axes) if axes is not None else \
        [i for i, d in enumerate(view.shape(n.inputs[0]) or []) if d == 1]
    kept = [i for i in range(before) if i not in removed]
    return kept[axis] if axis < len(kept) else None


def _reshaped(view: GraphView, n: gs.Node, out: gs.Tensor, axis: int) -> int | None:
    """The axis a Reshape keeps in place: on both sides the axes before it hold as many elements and it has the same
    size (at each measured run, graph/measure.py: shape inference loses both after a computed target), or the
    dims up to it are named alike (a head split [B, S, N*H] -> [B, S, N, H] keeps S)."""
    before, after = shape_or_measured(view, n.inputs[0]), shape_or_measured(view, out)
    if before is None or after is None or axis >= len(before) or axis >= len(after):
        return None
    a, b = _per_run(before[:axis + 1]), _per_run(after[:axis + 1])
    if a is None or b is None or len(a[0]) != len(b[0]):
        return axis if list(before[:axis + 1]) == list(after[:axis + 1]) else None
    lead = [tuple(math.prod(d[i] for d in side[:axis]) for i in range(len(side[0]))) for side in (a, b)]
    return axis if lead[0] == lead[1] and a[axis] == b[axis] else None


def _per_run(shape) -> list[tuple[int, ...]] | None:
    """Each dim as its value at each measured run (a static dim the same at each); None where one is not known."""
    runs = max((len(d) for d in shape if isinstance(d, Sizes)), default=1)
    out = []
    for d in shape:
        if isinstance(d, Sizes):
            out.append(tuple(int(x) for x in d))
        elif isinstance(d, (int, np.integer)):
            out.append((int(d),) * runs)
        else:
            return None
    return out


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
