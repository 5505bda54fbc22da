"""Q, K and V operands of the core: where the fused op reads them, scale strips, heads, GQA head repeat.

Each operand of the two products is followed up through layout ops and scalar Mul/Div (layout_ops.py),
giving candidates with their frames; the fused op reads the candidate that needs the fewest layout
ops to become [batch, heads, seq, dim], the highest one on a tie (so the layout ops below it go
away). The heads are the batch atom a projection merged with the head dim ([B, S, N*H]), else the
last static batch atom. A GQA head repeat (Unsqueeze -> Expand/Tile -> Reshape, HF repeat_kv) leaves
K and V without the minor part of Q's heads: the fused op takes the kv heads natively.

Also here, for the fused ops and the TensorRT implicit form: scale strips, HF's repeat_kv by its
nodes, heads and head size of a BNSH operand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..graph.view import PASSTHROUGH, GraphView
from ..site import Layout, QuantParams
from . import layout_ops
from .axes import Atoms, Frame, Unfollowable

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
            for other in (1, 0):
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
            inner_perm = list(n.attrs.get("perm", reversed(range(rank))))
            perm = _compose(perm, inner_perm)
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


def layout_of(perm) -> Layout:
    if perm is None:
        return Layout.BNSH
    if list(perm) == [0, 2, 1, 3]:
        return Layout.BSNH
    if list(perm) == [0, 1, 3, 2]:
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
        rep: int | None = reps[2]
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


# ---------------------------------------------------------------- operands by axis meaning
@dataclass
class Candidate:
    tensor: gs.Tensor
    frame: Frame
    scale: float  # scalar factors between this tensor and the product's operand
    quant: QuantParams | None = None  # a Q/DQ pair right above this tensor (kept outside the fused op)


def candidates(view: GraphView, t: gs.Tensor, frame: Frame, atoms: Atoms, repeats: bool = False,
               scales: bool = True) -> list[Candidate]:
    """`t` and its ancestors through layout ops and (Q, K) scalar Mul/Div, nearest first. With `repeats`
    (K and V), also through a broadcast that repeats heads (Expand/Tile of a unit axis)."""
    from .core import quant_params

    atoms.learn(frame, view.shape(t))
    out = [Candidate(t, frame, 1.0)]
    scale = 1.0
    for _ in range(24):
        n = view.producer(t)
        if n is None:
            break
        if n.op == "DequantizeLinear":  # Q/DQ on an operand stay outside the fused op
            out[-1].quant = quant_params(view, n)
            break
        if n.op == "Cast" and not view.is_noop_cast(n):  # a change of precision (autocast, fp16 conversion)
            break  # stays outside the fused op: it computes in the precision of the products
        if n.op in ("Mul", "Div") and scales:
            values = [view.scalar(i) for i in n.inputs]
            if n.op == "Mul" and values[1] is not None:
                scale, t = scale * values[1], n.inputs[0]
            elif n.op == "Mul" and values[0] is not None:
                scale, t = scale * values[0], n.inputs[1]
            elif n.op == "Div" and values[1] is not None and values[1] != 0:
                scale, t = scale / values[1], n.inputs[0]
            else:
                break
            out.append(Candidate(t, frame, scale))
            continue
        try:
            if layout_ops.is_layout(view, n):
                frame = layout_ops.backward(view, n, frame, atoms)
            elif repeats and n.op in ("Expand", "Tile"):
                frame = _unrepeated(view, n, frame, atoms)
            else:
                break
        except Unfollowable:
            break
        t = n.inputs[0]
        atoms.learn(frame, view.shape(t))
        out.append(Candidate(t, frame, scale))
    return out


def _unrepeated(view: GraphView, n: gs.Node, frame: Frame, atoms: Atoms) -> Frame:
    """The input frame of an Expand/Tile that only broadcasts unit axes: those axes hold nothing."""
    src = view.shape(n.inputs[0])
    if src is None or len(src) > len(frame):
        raise Unfollowable(f"{n.op} {n.name}: the shape it repeats is unknown")
    if n.op == "Tile":
        reps = view.ints(n.inputs[1])
        if reps is None or len(reps) != len(src):
            raise Unfollowable(f"Tile {n.name}: its repeats are computed")
        if any(r != 1 and d != 1 for r, d in zip(reps, src)):
            raise Unfollowable(f"Tile {n.name} repeats a whole block of heads")
    frame = frame[len(frame) - len(src):]
    return tuple(() if d == 1 and g else g for g, d in zip(frame, src))


def heads_of(q_cands: list[Candidate], batch: list[str], atoms: Atoms) -> tuple[str, ...]:
    """Q's heads: the batch atom merged with the head dim in a projection's [B, S, N*H], else the last
    batch atom of static size (BNSH's N, einsum's n) when there are two or more."""
    for c in q_cands:
        for g in atoms.resolve(c.frame):
            if len(g) >= 2 and g[-1] == "c" and g[-2] in _leaves(batch, atoms):
                head = g[-2]
                return tuple(x for x in _split_run(g[:-1], head, batch, atoms))
    last = batch[-1] if batch else None
    if len(batch) == 1 and last in atoms.parts:  # B*N split by a Reshape: the minor part
        last = atoms.parts[last][-1]
    if last is None or (len(batch) == 1 and last == batch[0]):
        return ()
    leaves = tuple(_leaves([last], atoms))
    return leaves if size_of(leaves, atoms) not in (None, 1) else ()


def _leaves(batch: list[str], atoms: Atoms) -> list[str]:
    return [a for g in atoms.resolve(tuple((b,) for b in batch)) for a in g]


def _split_run(group: tuple, head: str, batch, atoms) -> list[str]:
    """The heads atoms in a merged group ending before the head dim: the batch atoms of one original
    batch atom that end with `head` (h.0, h.1 of a split heads atom), else `head` alone."""
    parent = head.rsplit(".", 1)[0] if "." in head else None
    if parent is None:
        return [head]
    run = [a for a in group if a.rsplit(".", 1)[0] == parent]
    return run if run and run[-1] == head else [head]


def target(batch: tuple, heads: tuple, seq: str, dim: str) -> Frame:
    return (batch, heads, (seq,), (dim,))


def cost(src: Frame, dst: Frame, atoms: Atoms) -> int | None:
    """Layout ops to turn a tensor of frame `src` into frame `dst` (None: it holds other atoms)."""
    src, dst = atoms.resolve(src), atoms.resolve(dst)
    if src == dst:
        return 0
    real = lambda f: [tuple(a for a in g if atoms.known(a) != 1) for g in f]  # noqa: E731
    s, d = [g for g in real(src) if g], [g for g in real(dst) if g]
    if sorted(a for g in s for a in g) != sorted(a for g in d for a in g):
        return None
    if s == d:  # the same order: a reshape
        return 1
    if sorted(s) == sorted(d):  # whole axes, permuted
        return 1 if len(src) == len(dst) and all(g for g in src) == all(g for g in dst) else 2
    return 3


def choose(cands: list[Candidate], dst: Frame, atoms: Atoms) -> Candidate | None:
    """The candidate needing the fewest layout ops; the highest one on a tie."""
    best, best_cost = None, None
    for c in cands:
        k = cost(c.frame, dst, atoms)
        if k is not None and (best_cost is None or k <= best_cost):
            best, best_cost = c, k
    return best


def kv_heads_in(c: Candidate, heads: tuple, atoms: Atoms) -> tuple | None:
    """The heads atoms a K or V candidate holds: a prefix of Q's (GQA keeps the major part), or None."""
    present = {a for g in atoms.resolve(c.frame) for a in g}
    kept = tuple(a for a in heads if a in present)
    return kept if heads[:len(kept)] == kept else None


def size_of(group: tuple, atoms: Atoms) -> int | None:
    sizes = [atoms.known(a) for a in group]
    known = [s for s in sizes if s is not None]
    return math.prod(known) if len(known) == len(sizes) else None
