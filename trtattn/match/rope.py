"""Rotary position embedding on Q and K.

Recognised forms:
- the standard ONNX RotaryEmbedding op (opset 23) and com.microsoft RotaryEmbedding;
- HF rotate_half: x*cos + Concat(-x[..., h/2:], x[..., :h/2])*sin;
- partial rotary: Concat(rope(x[..., :r]), x[..., r:]);
- any other cone that computes what a RotaryEmbedding op computes from two cos/sin caches (rotation.py: ONNX's
  own RotaryEmbedding function body, half-split or interleaved, partial, 3-D, with or without position ids).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph.rotary import RotaryAttrs, is_rotary, rotary_inputs
from ..graph.view import GraphView
from ..site import Rope, RopeKind
from .rotation import read_rotation


def _slice_range(view: GraphView, n: gs.Node):
    """(source, start, end) of a Slice over the last axis, or None."""
    if n is None or n.op != "Slice":
        return None
    if len(n.inputs) >= 3:
        starts, ends = view.ints(n.inputs[1]), view.ints(n.inputs[2])
        axes = view.ints(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3].name else None
        steps = view.ints(n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4].name else None
    else:  # opset < 10
        starts, ends, axes, steps = n.attrs.get("starts"), n.attrs.get("ends"), n.attrs.get("axes"), None
    if not starts or not ends or len(starts) != 1:
        return None
    rank = view.rank(n.inputs[0])
    if axes is not None and rank is not None and axes[0] % rank != rank - 1:
        return None
    if axes is not None and rank is None and axes[0] != -1:
        return None
    if steps and steps != [1]:
        return None
    return n.inputs[0], starts[0], ends[0]


def _rotate_half_source(view: GraphView, t: gs.Tensor, head: int | None):
    """x if t == Concat(-x[..., h/2:], x[..., :h/2]) along the last axis."""
    n = view.producer(t)
    if n is None or n.op != "Concat" or len(n.inputs) != 2:
        return None
    neg = view.producer(n.inputs[0])
    if neg is None or neg.op != "Neg":
        return None
    hi = _slice_range(view, view.producer(neg.inputs[0]))
    lo = _slice_range(view, view.producer(n.inputs[1]))
    if hi is None or lo is None or hi[0] is not lo[0]:
        return None
    x = hi[0]
    half = lo[2]
    if lo[1] != 0 or hi[1] != half:
        return None
    if head is not None and half * 2 != head and not hi[2] >= head:
        return None
    return x


def _mul_parts(view: GraphView, t: gs.Tensor):
    n = view.producer(t)
    if n is None or n.op != "Mul":
        return None
    return n.inputs[0], n.inputs[1]


def _rotate_half_rope(view: GraphView, t: gs.Tensor, head: int | None):
    """(x, cos, sin) if t == x*cos + rotate_half(x)*sin (operands in any order)."""
    n = view.producer(t)
    if n is None or n.op != "Add":
        return None
    for a, b in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        pa, pb = _mul_parts(view, a), _mul_parts(view, b)
        if pa is None or pb is None:
            continue
        for rot, sin in ((pb[0], pb[1]), (pb[1], pb[0])):
            x = _rotate_half_source(view, rot, None)
            if x is None:
                continue
            for xx, cos in ((pa[0], pa[1]), (pa[1], pa[0])):
                if xx is x:
                    return x, cos, sin
    return None


def _rope_of(view: GraphView, t: gs.Tensor, head: int | None):
    """(kind, x, cos, sin, position_ids, rotary_dim) or None."""
    t = view.skip_passthrough_up(t)
    n = view.producer(t)
    if n is None:
        return None
    if is_rotary(n.op, n.domain):
        attrs = RotaryAttrs.of(n.attrs)
        x, cos, sin, pos = rotary_inputs(n.domain, n.inputs)
        kind = RopeKind.INTERLEAVED if attrs.interleaved else RopeKind.HALF_SPLIT
        return kind, x, cos, sin, pos, attrs.rotary_dim(head)
    full = _rotate_half_rope(view, t, head)
    if full is not None:
        x, cos, sin = full
        return RopeKind.HALF_SPLIT, x, cos, sin, None, head
    # partial rotary: Concat(rope(x[..., :r]), x[..., r:])
    if n.op == "Concat" and len(n.inputs) == 2:
        part = _rotate_half_rope(view, n.inputs[0], None)
        rest = _slice_range(view, view.producer(n.inputs[1]))
        if part is not None and rest is not None:
            xr = _slice_range(view, view.producer(part[0]))
            if xr is not None and xr[0] is rest[0] and xr[1] == 0 and xr[2] == rest[1]:
                return RopeKind.HALF_SPLIT, rest[0], part[1], part[2], None, xr[2]
    return None


def find_rope(view: GraphView, q: gs.Tensor, k: gs.Tensor, head: int | None) -> Rope | None:
    rq = _rope_of(view, q, head)
    rk = _rope_of(view, _unrepeated(view, k), head)
    if rq is None or rk is None or rq[0] != rk[0] or rq[5] != rk[5]:
        return read_rope(view, q, k)
    return Rope(kind=rq[0], rotary_dim=int(rq[5] or 0), cos=rq[2].name, sin=rq[3].name, q_input=rq[1].name,
                k_input=rk[1].name, position_ids=rq[4].name if rq[4] is not None else None,
                interleaved=rq[0] == RopeKind.INTERLEAVED)


def _unrepeated(view: GraphView, k: gs.Tensor) -> gs.Tensor:
    """K before a cache concat (the rotation applies to the new keys only)."""
    n = view.producer(k)
    if n is not None and n.op == "Concat" and len(n.inputs) == 2:
        return n.inputs[1]
    return k


def read_rope(view: GraphView, q: gs.Tensor, k: gs.Tensor) -> Rope | None:
    """The same rotation on Q and on K (before a cache concat), read by what it computes (rotation.py)."""
    rq = read_rotation(view, q)
    if rq is None:
        return None
    rk = read_rotation(view, k)
    if rk is None and _unrepeated(view, k) is not k:
        rk = read_rotation(view, _unrepeated(view, k))
    if rk is None or rk.attrs != rq.attrs or _tables(rk) != _tables(rq):
        return None  # one Rope record names one pair of tables for both
    return Rope(kind=RopeKind.INTERLEAVED if rq.interleaved else RopeKind.HALF_SPLIT, rotary_dim=rq.rotary_dim,
                cos=rq.cos.name, sin=rq.sin.name, q_input=rq.x.name, k_input=rk.x.name,
                position_ids=rq.position_ids.name if rq.position_ids is not None else None,
                interleaved=rq.interleaved, op_caches=True, q_output=rq.y.name, k_output=rk.y.name,
                num_heads=rq.num_heads, rotary_embedding_dim=rq.attrs["rotary_embedding_dim"])


def _tables(r) -> tuple:
    return r.cos.name, r.sin.name, r.position_ids.name if r.position_ids is not None else None
