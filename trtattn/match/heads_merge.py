"""Attention written one head at a time (SHA), proved one multi-head attention and merged.

NPU toolchains export each head as its own attention: Q, K and V unpacked along the heads axis (Split,
Gather or Slice, maybe a Squeeze after), the outputs packed back along it (Concat, maybe after an
Unsqueeze). Per head the matcher finds an ordinary single-head site. Those sites are one attention
when, by algebra:
- their outputs are the pieces of one Concat, in its order (that order is the head index h);
- Q of head h is piece h of one tensor along one axis, the pieces of equal length covering the axis
  exactly once and in order (split sizes, slice bounds and gather indices evaluated, not matched);
- K and V likewise, with the same order, or one tensor every head reads (one KV head, or a cache);
- every other part of the site is the same: scale, mask steps (the same tensors on the same axes), the
  frames by axis meaning, the cache, the types.
Then the merged site reads the unsplit tensors with one more atom, h, in the piece axis: where a piece
keeps the axis its group G becomes (h, *G) (G empty for a size-1 piece, the query positions when heads
are folded into the query axis), where it drops the axis (Gather, Squeeze) h stands alone. The pack gives
the output's frame the same way. The rewrite then writes one Attention op with q_num_heads = N, and the
split and the pack go away with the per-head chains.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..graph.dependence import value_readers
from ..graph.measure import shape_or_measured
from ..graph.view import GraphView
from ..site import AttentionSite, CacheKind, SiteLayout
from .heads import layout_of, target

Frame = tuple  # of atom groups, one per axis (site.SiteLayout)


@dataclass(frozen=True)
class Piece:
    """One head's part of a tensor: the axis `axis` of `source` (frame `frame`, the head atom included)
    from `start` to `stop`, read through `how` (the ops from the source to the tensor the site reads)."""

    source: str
    axis: int
    start: int
    stop: int
    frame: Frame
    how: str


@dataclass(frozen=True)
class Operand:
    """What the merged site reads for Q, K or V: the tensor and its frame, and whether it is split by head."""

    tensor: str
    frame: Frame
    split: bool
    how: str = ""


@dataclass(frozen=True)
class HeadsMerge:
    """The proof that single-head sites `sites` (in head order) are one attention over `heads` heads."""

    sites: tuple[str, ...]
    heads: int
    atom: str  # the head atom the merged frames hold
    query: Operand
    key: Operand
    value: Operand
    output: str  # the pack's output
    out_frame: Frame

    def note(self) -> str:
        kv = "K and V split alike" if self.key.split else "one K and V read by every head"
        return (f"{self.heads} single-head sites merged into one ({', '.join(self.sites)}): Q {self.query.how}, "
                f"{kv}, outputs packed into {self.output}")


# ---------------------------------------------------------------- frames through layout ops
def _insert(frame: Frame, at: int, group: tuple) -> Frame:
    return frame[:at] + (group,) + frame[at:]


def _axis(view: GraphView, node: gs.Node, rank: int) -> int | None:
    """The one axis of a Squeeze/Unsqueeze (attribute or input), normalised to `rank`."""
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:
        axes = view.ints(node.inputs[1])
    if axes is None or len(axes) != 1:
        return None
    return axes[0] % rank


def _dim(view: GraphView, t: gs.Tensor, axis: int) -> int | None:
    """The static size of `t`'s axis: inferred, else measured at the model's dims (graph/measure.py)."""
    for shape in (view.shape(t), shape_or_measured(view, t)):
        d = shape[axis] if shape is not None and axis < len(shape) else None
        if isinstance(d, int):
            return d
    return None


def _piece(view: GraphView, t: gs.Tensor, frame: Frame, atom: str) -> Piece | None:
    """Where the tensor `t` (frame `frame`) is one head's part of a bigger tensor (module doc), else None."""
    how: list[str] = []
    for _ in range(8):
        n = view.producer(t)
        if n is None:
            return None
        if n.op in ("Identity", "Transpose"):
            perm = n.attrs.get("perm", list(range(len(frame)))[::-1]) if n.op == "Transpose" else range(len(frame))
            src: list = [()] * len(frame)
            for j, p in enumerate(perm):
                src[p] = frame[j]
            frame, t = tuple(src), n.inputs[0]
            how.append(n.op)
            continue
        if n.op == "Squeeze":
            axis = _axis(view, n, len(frame) + 1)
            if axis is None:
                return None
            frame, t = _insert(frame, axis, ()), n.inputs[0]
            how.append("Squeeze")
            continue
        found = _cut(view, n, t, frame, atom)
        if found is None:
            return None
        source, axis, start, stop, frame = found
        return Piece(source.name, axis, start, stop, frame, " + ".join([f"{n.op} along axis {axis} of "
                                                                         f"{source.name}", *reversed(how)]))
    return None


def _cut(view: GraphView, n: gs.Node, t: gs.Tensor, frame: Frame, atom: str):
    """(source, axis, start, stop, source frame) of a Gather, Split or Slice making `t`; None for another op."""
    x = n.inputs[0] if n.inputs else None
    rank = view.rank(x) if x is not None else None
    if rank is None:
        return None
    if n.op == "Gather" and len(frame) == rank - 1:
        index = view.const(n.inputs[1])
        axis = int(n.attrs.get("axis", 0)) % rank
        size = _dim(view, x, axis)
        if index is None or index.size != 1 or index.ndim != 0 or size is None:
            return None
        i = int(index) % size
        return x, axis, i, i + 1, _insert(frame, axis, (atom,))
    if len(frame) != rank:
        return None
    if n.op == "Split":
        axis = int(n.attrs.get("axis", 0)) % rank
        sizes = _split_sizes(view, n, x, axis)
        if sizes is None:
            return None
        i = n.outputs.index(t)
        start = sum(sizes[:i])
        return x, axis, start, start + sizes[i], frame[:axis] + ((atom, *frame[axis]),) + frame[axis + 1:]
    if n.op == "Slice":
        bounds = _slice_bounds(view, n, x, rank)
        if bounds is None:
            return None
        axis, start, stop = bounds
        return x, axis, start, stop, frame[:axis] + ((atom, *frame[axis]),) + frame[axis + 1:]
    return None


def _split_sizes(view: GraphView, n: gs.Node, x: gs.Tensor, axis: int) -> list[int] | None:
    sizes = n.attrs.get("split")
    if sizes is None and len(n.inputs) > 1 and n.inputs[1].name:
        sizes = view.ints(n.inputs[1])
    if sizes is not None:
        return list(sizes)
    size = _dim(view, x, axis)
    parts = len(n.outputs)
    if size is None or size % parts:
        return None  # uneven equal splits (num_outputs with a remainder): not pieces of equal length
    return [size // parts] * parts


def _slice_bounds(view: GraphView, n: gs.Node, x: gs.Tensor, rank: int) -> tuple[int, int, int] | None:
    """(axis, start, stop) of a Slice of one axis with step 1, the bounds clamped to the axis."""
    values = [view.ints(n.inputs[i]) if len(n.inputs) > i and n.inputs[i].name else None for i in range(1, 5)]
    starts, ends, axes, steps = values
    if starts is None or ends is None or len(starts) != 1 or (steps is not None and steps != [1]):
        return None
    if len(n.inputs) > 3 and n.inputs[3].name and axes is None:
        return None
    axis = (axes[0] if axes else 0) % rank
    size = _dim(view, x, axis)
    if size is None:
        return None
    clamp = lambda v: min(max(v + size if v < 0 else v, 0), size)  # noqa: E731
    return axis, clamp(starts[0]), clamp(ends[0])


def _pack(view: GraphView, site: AttentionSite, atom: str) -> tuple[gs.Node, int, Frame] | None:
    """(the Concat packing the site's output, its position there, the Concat output's frame)."""
    t = view.tensors.get(site.output)
    frame: Frame = site.layout.out if site.layout is not None else ()
    for _ in range(8):
        if t is None or any(o is t for o in view.graph.outputs):
            return None
        readers = value_readers(t)
        if len(readers) != 1 or len(readers[0].outputs) != 1:
            return None
        n = readers[0]
        if n.op == "Transpose" and n.inputs[0] is t:
            frame = tuple(frame[p] for p in n.attrs.get("perm", list(range(len(frame)))[::-1]))
        elif n.op == "Unsqueeze" and n.inputs[0] is t:
            axis = _axis(view, n, len(frame) + 1)
            if axis is None:
                return None
            frame = _insert(frame, axis, ())
        elif n.op == "Concat":
            axis = int(n.attrs.get("axis", 0)) % len(frame)
            return n, n.inputs.index(t), frame[:axis] + ((atom, *frame[axis]),) + frame[axis + 1:]
        else:
            return None
        t = n.outputs[0]
    return None


# ---------------------------------------------------------------- grouping
def _signature(site: AttentionSite) -> tuple:
    """Everything of a site but its own tensors: equal across the heads of one attention."""
    lay = site.layout
    assert lay is not None
    steps = tuple((s.op, s.operand, s.value, s.frame) for s in site.mask_steps)
    return (lay.q, lay.k, lay.v, lay.out, lay.batch, lay.heads, lay.kv_heads, lay.scale, lay.batch_broadcast, steps,
            site.kind, site.dtype, site.products_dtype, site.cache, site.past_key, site.past_value, site.logits_cast,
            site.mask, site.causal, site.window, site.softcap, site.head_size, site.v_head_size, site.rank)


def _mergeable(site: AttentionSite) -> bool:
    return (site.source == "pattern" and site.layout is not None and not site.graph and site.rope is None
            and site.qk_output is None and site.quant is None and not site.layout.batch_broadcast)


def _head_atom(site: AttentionSite) -> str:
    lay = site.layout
    assert lay is not None
    used = {a for f in (lay.q, lay.k, lay.v, lay.out) for g in f for a in g}
    return next(a for a in ("h", *(f"h{i}" for i in range(1, 99))) if a not in used)


def _operand(view: GraphView, names: list[str], frame: Frame, atom: str, heads: int) -> Operand | None:
    """The merged operand of the heads' tensors `names` (frame `frame` each), else None."""
    if len(set(names)) == 1:
        return Operand(names[0], frame, False)
    pieces = [_piece(view, view.tensors[n], frame, atom) for n in names]
    if any(p is None for p in pieces):
        return None
    first = pieces[0]
    assert first is not None
    length = first.stop - first.start
    source = view.tensors[first.source]
    for h, p in enumerate(pieces):
        assert p is not None
        if (p.source, p.axis, p.frame) != (first.source, first.axis, first.frame) \
                or (p.start, p.stop) != (h * length, (h + 1) * length):
            return None  # not the same tensor's pieces, or not in head order, or of unequal lengths
    if length < 1 or _dim(view, source, first.axis) != heads * length:
        return None  # the pieces do not cover the axis exactly
    return Operand(first.source, first.frame, True, first.how)


def _proof(view: GraphView, group: list[AttentionSite], pack: gs.Node, out_frame: Frame, atom: str
           ) -> HeadsMerge | None:
    heads = len(group)
    lay = group[0].layout
    assert lay is not None
    ops = [_operand(view, [getattr(s.layout, x) for s in group], getattr(lay, x[0]), atom, heads)
           for x in ("query", "key", "value")]
    q, k, v = ops
    if q is None or k is None or v is None or not q.split or k.split != v.split:
        return None
    if k.split and group[0].cache != CacheKind.NONE:
        return None  # a cache per head: merging it is the partition's business (not proved here)
    return HeadsMerge(tuple(s.name for s in group), heads, atom, q, k, v, pack.outputs[0].name, out_frame)


def find_merges(view: GraphView, sites: list[AttentionSite]) -> list[HeadsMerge]:
    """Every set of single-head sites proved one attention (module doc)."""
    packs: dict[int, dict[int, tuple[AttentionSite, Frame]]] = defaultdict(dict)
    nodes: dict[int, gs.Node] = {}
    for s in sites:
        if not _mergeable(s):
            continue
        found = _pack(view, s, _head_atom(s))
        if found is not None:
            node, at, frame = found
            packs[id(node)][at] = (s, frame)
            nodes[id(node)] = node
    merges = []
    for key, placed in packs.items():
        node = nodes[key]
        if len(placed) < 2 or sorted(placed) != list(range(len(node.inputs))):
            continue  # every piece of the pack must be a site's output
        group = [placed[i][0] for i in range(len(node.inputs))]
        frames = {placed[i][1] for i in placed}
        atoms = {_head_atom(s) for s in group}
        if len(frames) != 1 or len(atoms) != 1 or len({_signature(s) for s in group}) != 1:
            continue
        proof = _proof(view, group, node, frames.pop(), atoms.pop())
        if proof is not None:
            merges.append(proof)
    return merges


# ---------------------------------------------------------------- the merged site
def merged_site(view: GraphView, proof: HeadsMerge, group: list[AttentionSite]) -> AttentionSite:
    """One site reading the unsplit tensors, written as one multi-head Attention op."""
    first = group[0]
    lay = first.layout
    assert lay is not None
    h = (proof.atom,)
    heads = h + tuple(lay.heads)
    kv = h + tuple(lay.kv_heads) if proof.key.split else tuple(lay.kv_heads)
    # the sizes read from the tensors the op now reads (not from the first head's, which go away), but a
    # static size stays static (a size-1 atom is known to be 1: a tensor lacking it lacks nothing)
    read = [(tuple(g), ("axis", op.tensor, i)) for op in (proof.query, proof.key, proof.value)
            for i, g in enumerate(op.frame) if g]
    static = [r for r in lay.dims if r[1][0] == "static"]
    recipes = [r for r in lay.dims if r[1][0] != "static"] + read + static + [((proof.atom,), ("static", proof.heads))]
    shape_reads = tuple(r for s in group if s.layout is not None for r in s.layout.shape_reads)
    layout = SiteLayout(proof.query.tensor, proof.key.tensor, proof.value.tensor, proof.query.frame, proof.key.frame,
                        proof.value.frame, proof.out_frame, lay.batch, heads, kv, tuple(recipes), shape_reads,
                        lay.scale, (), (), lay.qk_dtype)
    key_perm = _perm(proof.key.frame, target(tuple(lay.batch), kv, "k", "d"))
    return first.replace(
        query=proof.query.tensor, key=proof.key.tensor, value=proof.value.tensor, output=proof.output,
        q_heads=proof.heads * (first.q_heads or 1),
        kv_heads=proof.heads * (first.kv_heads or 1) if proof.key.split else first.kv_heads,
        key_perm=key_perm, k_layout=layout_of(list(key_perm) if key_perm else None), key_transposed=None,
        key_transposed_scale=1.0, rank=len(proof.query.frame), layout=layout, merged=proof.sites,
        notes=(*first.notes, proof.note()))


def _perm(src: Frame, dst: Frame) -> tuple[int, ...] | None:
    """The Transpose turning a 4-D operand of frame `src` into `dst` (None: it is `dst`, or not a permutation)."""
    if len(src) != 4 or len(dst) != 4 or sorted(src) != sorted(dst) or src == dst or len(set(src)) != 4:
        return None
    return tuple(src.index(g) for g in dst)


def merge_heads(view: GraphView, sites: list[AttentionSite]) -> tuple[list[AttentionSite], dict[str, list]]:
    """`sites` with every proved set of single-head sites replaced by its merged site (at the first head's
    place), and the single-head sites of each merged one by its name (to fall back on)."""
    by_name = {s.name: s for s in sites}
    merged: dict[str, AttentionSite] = {}
    parts: dict[str, list[AttentionSite]] = {}
    for proof in find_merges(view, sites):
        group = [by_name[n] for n in proof.sites]
        merged[proof.sites[0]] = merged_site(view, proof, group)
        parts[proof.sites[0]] = group
    gone = {n for g in parts.values() for s in g[1:] for n in [s.name]}
    return [merged.get(s.name, s) for s in sites if s.name not in gone], parts
