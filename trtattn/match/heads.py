"""Q, K and V operands of the core: scale strips, transposes, head split, GQA head repeat.

Q is BMM1's first input; K^T its second, which the exporters build as Transpose(K, [0,1,3,2])
from BNSH, Transpose(K, [0,2,3,1]) straight from BSNH, or a pre-transposed projection. The key
operand is traced back through transposes to the tensor they start from, with the permutation
that turns it into BNSH. A GQA head repeat (Unsqueeze -> Expand/Tile -> Reshape, HF repeat_kv)
is dropped: the fused op takes the kv heads natively.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..site import Layout
from ..graph.view import PASSTHROUGH, GraphView

SHAPE_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"} | PASSTHROUGH


@dataclass
class Operand:
    tensor: gs.Tensor  # what the fused op consumes (before the permutation below)
    perm: list[int] | None  # Transpose that turns `tensor` into BNSH (None: already BNSH)
    scale: float  # scalar factors stripped between `tensor` and the MatMul
    repeat: int = 1  # GQA repeat factor that was dropped
    adjacent: gs.Tensor | None = None  # the MatMul input with only the scales right above it stripped
    inner_scale: float = 1.0  # scale still inside `adjacent` (a Mul before a Transpose)


def strip_scale(view: GraphView, t: gs.Tensor) -> tuple[gs.Tensor, float]:
    """Strip Mul/Div by scalar constants (and pass-throughs) directly above a MatMul input."""
    scale = 1.0
    for _ in range(8):
        t = view.skip_passthrough_up(t)
        n = view.producer(t)
        if n is None or n.op not in ("Mul", "Div"):
            return t, scale
        values = [view.scalar(i) for i in n.inputs]
        if n.op == "Mul" and values[1] is not None:
            scale, t = scale * values[1], n.inputs[0]
        elif n.op == "Mul" and values[0] is not None:
            scale, t = scale * values[0], n.inputs[1]
        elif n.op == "Div" and values[1] is not None:
            scale, t = scale / values[1], n.inputs[0]
        else:
            return t, scale
    return t, scale


def upstream_scale(view: GraphView, t: gs.Tensor) -> float:
    """A scalar Mul applied before the head split (Whisper scales q_proj's output): reported,
    not moved, since the query operand already includes it."""
    for _ in range(10):
        n = view.producer(t)
        if n is None:
            return 1.0
        if n.op in SHAPE_OPS or view.is_noop_cast(n):
            t = n.inputs[0]
            continue
        if n.op == "Mul":
            for i, other in ((0, 1), (1, 0)):
                v = view.scalar(n.inputs[other])
                if v is not None:
                    return v
        return 1.0
    return 1.0


def _compose(outer: list[int], inner: list[int]) -> list[int]:
    """y = Transpose(x, inner); z = Transpose(y, outer)  =>  z = Transpose(x, result)."""
    return [inner[i] for i in outer]


def resolve_key(view: GraphView, kt: gs.Tensor, rank: int, strip: bool = True) -> Operand:
    """K operand from K^T (BMM1's second input)."""
    t, scale = strip_scale(view, kt)
    adjacent, adjacent_scale = t, scale
    # perm such that kt = Transpose(t, perm); start from identity (t is kt)
    perm = list(range(rank))
    for _ in range(6):
        t = view.skip_passthrough_up(t)
        n = view.producer(t)
        if n is not None and n.op == "Transpose":
            inner = list(n.attrs.get("perm", reversed(range(rank))))
            perm = _compose(perm, inner)
            t = n.inputs[0]
            continue
        if n is not None and n.op in ("Mul", "Div"):
            t2, s = strip_scale(view, t)
            if t2 is not t:
                t, scale = t2, scale * s
                continue
        break
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    to_bnsh = _compose(swap, perm)  # K = Transpose(kt, swap) = Transpose(t, to_bnsh)
    inner = scale / adjacent_scale
    if to_bnsh == list(range(rank)):
        base, repeat = strip_repeat(view, t, rank) if strip else (t, 1)
        return Operand(base, None, scale, repeat, adjacent, inner)
    return Operand(t, to_bnsh, scale, 1, adjacent, inner)


def resolve_value(view: GraphView, v: gs.Tensor, rank: int, strip: bool = True) -> Operand:
    t = view.skip_passthrough_up(v)
    base, repeat = strip_repeat(view, t, rank) if strip else (t, 1)
    return Operand(base, None, 1.0, repeat)


def layout_of(perm: list[int] | None) -> Layout:
    if perm is None:
        return Layout.BNSH
    if perm == [0, 2, 1, 3]:
        return Layout.BSNH
    if perm == [0, 1, 3, 2]:
        return Layout.BNHS
    return Layout.BNSH  # some other permutation: the fused op receives an explicit Transpose


def strip_repeat(view: GraphView, t: gs.Tensor, rank: int) -> tuple[gs.Tensor, int]:
    """Drop HF repeat_kv: Reshape(Expand(Unsqueeze(kv, 2), [B, Nkv, rep, S, H]), [B, Nkv*rep, S, H]).

    Tile(Unsqueeze(kv, 2), [1, 1, rep, 1, 1]) is the same; Tile(kv, [1, rep, 1, 1]) is not (it
    repeats the whole block of heads, not each head) and is kept as is.
    """
    if rank != 4:
        return t, 1
    reshape = view.producer(t)
    if reshape is None or reshape.op != "Reshape":
        return t, 1
    expand = view.producer(view.skip_passthrough_up(reshape.inputs[0]))
    if expand is None or expand.op not in ("Expand", "Tile"):
        return t, 1
    unsq = view.producer(view.skip_passthrough_up(expand.inputs[0]))
    if unsq is None or unsq.op != "Unsqueeze":
        return t, 1
    axes = unsq.attrs.get("axes") if "axes" in unsq.attrs else (view.ints(unsq.inputs[1]) if len(unsq.inputs) > 1 else None)
    if axes is None or [a % 5 for a in axes] != [2]:
        return t, 1
    kv = unsq.inputs[0]
    if expand.op == "Tile":
        reps = view.ints(expand.inputs[1])
        if reps is None or len(reps) != 5 or reps[:2] != [1, 1] or reps[3:] != [1, 1]:
            return t, 1
        rep = reps[2]
    else:
        target = view.ints(expand.inputs[1])
        rep = target[2] if target is not None and len(target) == 5 else None
        if rep is None:
            # the expand shape is computed: read the repeat from the shapes instead
            heads_out, heads_in = view.dim(t, 1), view.dim(kv, 1)
            rep = heads_out // heads_in if heads_out and heads_in and heads_out % heads_in == 0 else None
        if rep is None:
            return t, 1
    return kv, rep


def heads_and_size(view: GraphView, t: gs.Tensor, perm: list[int] | None, rank: int):
    """(heads, head size) of an operand in BNSH after `perm` (None where unknown)."""
    shape = view.shape(t)
    if shape is None or len(shape) != rank:
        return None, None
    if perm is not None:
        shape = [shape[p] for p in perm]
    n = shape[1] if rank == 4 else 1
    h = shape[-1]
    return (n if isinstance(n, int) and n > 0 else None), (h if isinstance(h, int) and h > 0 else None)
