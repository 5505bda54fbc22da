"""Layout ops between frames (match/axes.py): how the rewrite hands the fused op [batch, heads, seq, dim]
and gives the rest of the graph the layout it had.

    dims = Dims(emit, tensors, site.layout.dims)
    q = convert(emit, tensors[layout.query], layout.q, target, dims)

A conversion splits merged axes into atoms, drops unit axes, permutes, and merges into the target's
axes; only the ops a conversion needs are emitted (none for a tensor already in place, one Transpose
for BSNH). Masks may be broadcast (size 1 where the logits are not): `broadcast=True` expands them
only where an axis is split or merged, and leaves missing atoms as unit axes.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph.emit import Emitter

I64 = np.int64


class Dims:
    """Run-time sizes of a site's atoms and merged groups, as 1-D int64 tensors of one element."""

    def __init__(self, emit: Emitter, tensors: dict, recipes: tuple):
        self.emit, self.tensors = emit, tensors
        self.recipes = {tuple(g): r for g, r in recipes}
        self.built: dict[tuple, gs.Tensor] = {}

    def unit(self, atom: str) -> bool:
        """Whether the atom has size 1 in every run (a static 1): a tensor lacking it lacks nothing."""
        return tuple(self.recipes.get((atom,), ())) == ("static", 1)

    def of(self, group) -> gs.Tensor:
        group = tuple(group)
        if group not in self.built:
            self.built[group] = self._build(group)
        return self.built[group]

    def _build(self, group: tuple) -> gs.Tensor:
        e = self.emit
        if not group:
            return e.const([1], I64)
        recipe = self.recipes.get(group)
        if recipe is not None:
            return self._recipe(recipe)
        if len(group) > 1:
            out = self.of(group[:1])
            for a in group[1:]:
                out = e("Mul", [out, self.of((a,))], dtype=I64, name="dims")
            return out
        raise ValueError(f"the size of axis '{group[0]}' cannot be read from the tensors the fused op reads")

    def _recipe(self, r: tuple) -> gs.Tensor:
        e = self.emit
        if r[0] == "static":
            return e.const([r[1]], I64)
        if r[0] == "axis":
            return e.shape_slice(self.tensors[r[1]], r[2], r[2] + 1)
        if r[0] == "entry":  # a Reshape target's computed entry
            return e("Slice", [self.tensors[r[1]], e.const([r[2]], I64), e.const([r[2] + 1], I64)], dtype=I64,
                     name="dims")
        if r[0] == "part":
            divisor = e.const([r[2]], I64) if isinstance(r[2], int) else self._recipe(r[2])
            return e("Div", [self._recipe(r[1]), divisor], dtype=I64, name="dims")
        raise ValueError(f"unknown dim recipe {r}")

    def shape(self, frame) -> gs.Tensor:
        """The shape of a tensor of this frame (what a Shape node of it reads)."""
        return self.emit("Concat", [self.of(g) for g in frame], {"axis": 0}, dtype=I64, name="shape")


def convert(emit: Emitter, t: gs.Tensor, src, dst, dims: Dims, *, broadcast: bool = False) -> gs.Tensor:
    """`t`, whose axes hold the atoms of frame `src`, as a tensor of frame `dst`. A tensor a per-tensor
    DequantizeLinear makes is converted quantized and dequantized after: the Q/DQ stays right before its
    consumer (TensorRT's rule; ONNX Runtime's QDQ propagation also breaks on a Transpose after a DQ)."""
    src, dst = tuple(map(tuple, src)), tuple(map(tuple, dst))
    if src == dst:
        return t
    dq = t.inputs[0] if t.inputs else None
    if dq is not None and dq.op == "DequantizeLinear" and _per_tensor(dq):
        moved = _convert(emit, dq.inputs[0], src, dst, dims, broadcast)
        return emit("DequantizeLinear", [moved, *dq.inputs[1:]], dict(dq.attrs), dtype=t.dtype, name="dequantize")
    return _convert(emit, t, src, dst, dims, broadcast)


def _per_tensor(dq: gs.Node) -> bool:
    scale = dq.inputs[1] if len(dq.inputs) > 1 else None
    shape = scale.shape if scale is not None else None
    return shape is not None and int(np.prod(shape)) == 1 and "axis" not in dq.attrs


def _convert(emit: Emitter, t: gs.Tensor, src, dst, dims: Dims, broadcast: bool) -> gs.Tensor:
    dtype = t.dtype
    one = emit.const([1], I64)
    if len(src) == len(dst) and all(len(g) <= 1 for g in src) and all(len(g) <= 1 for g in dst):
        perm = _perm(_named_units(src, src), _named_units(src, dst))
        if perm is not None:  # the same axes permuted (BSNH -> BNSH): one Transpose
            return emit("Transpose", [t], {"perm": perm}, dtype=dtype, name="to_frame")
    want = [a for g in dst for a in g]
    cur = list(src)
    # 1. merged axes split into one axis per atom (a broadcast axis is expanded before it is split)
    if any(len(g) > 1 for g in cur):
        if broadcast:
            t = emit("Expand", [t, _concat(emit, t, [dims.of(g) if len(g) > 1 else one for g in cur])],
                     dtype=dtype, name="expand")
        parts = []
        for i, g in enumerate(cur):
            parts += [dims.of((a,)) for a in g] if len(g) > 1 else [i]
        t = emit("Reshape", [t, _concat(emit, t, parts)], dtype=dtype, name="split")
        cur = [x for g in cur for x in ([(a,) for a in g] if len(g) > 1 else [g])]
    # 2. unit axes dropped, and atoms the target does not hold (size 1 there)
    drop = [i for i, g in enumerate(cur) if not g or g[0] not in want]
    if drop:
        t = emit("Squeeze", [t, emit.const(drop, I64)], dtype=dtype, name="squeeze")
    cur = [g[0] for i, g in enumerate(cur) if i not in drop]
    # 3. the atoms in the target's order
    order = [a for a in want if a in cur]
    perm = [cur.index(a) for a in order]
    if perm != list(range(len(perm))):
        t = emit("Transpose", [t], {"perm": perm}, dtype=dtype, name="permute")
    cur = order
    missing = [a for a in want if a not in cur]
    if [a for a in missing if not dims.unit(a)] and not broadcast:  # of size 1 always: where its axis goes, 1
        raise ValueError(f"a tensor of axes {src} lacks {missing} to be laid out as {dst}")
    if cur == want and all(len(g) == 1 for g in dst):
        return t
    # 4. merged into the target's axes; atoms a broadcast tensor lacks become unit axes
    merged = {a for g in dst if len(g) > 1 for a in g}
    if broadcast and merged:
        if missing:
            t = emit("Reshape", [t, _concat(emit, t, [cur.index(a) if a in cur else one for a in want])],
                     dtype=dtype, name="atoms")
            cur = want
        t = emit("Expand", [t, _concat(emit, t, [dims.of((a,)) if a in merged else one for a in cur])],
                 dtype=dtype, name="expand")
    parts = []
    for g in dst:
        if not g:
            parts.append(one)
        elif len(g) == 1:
            parts.append(cur.index(g[0]) if g[0] in cur else one)
        else:
            parts.append(_product(emit, [emit.shape_slice(t, cur.index(a), cur.index(a) + 1) if a in cur else one
                                         for a in g]))
    return emit("Reshape", [t, _concat(emit, t, parts)], dtype=dtype, name="merge")


def _concat(emit: Emitter, t: gs.Tensor, parts: list) -> gs.Tensor:
    """A shape: each part an axis of `t` (its dim there) or a 1-D dims tensor."""
    pieces = [emit.shape_slice(t, p, p + 1) if isinstance(p, int) else p for p in parts]
    return emit("Concat", pieces, {"axis": 0}, dtype=I64, name="shape")


def _named_units(src, frame) -> list:
    """A frame's axes, its unit axes named in order (the n-th unit of `frame` as src's n-th)."""
    names = iter(("#", i) for i, g in enumerate(src) if not g)
    return [g if g else next(names, ("#?",)) for g in frame]


def _product(emit: Emitter, dims: list) -> gs.Tensor:
    out = dims[0]
    for d in dims[1:]:
        out = emit("Mul", [out, d], dtype=I64, name="dims")
    return out


def _perm(src: list, dst: list) -> list[int] | None:
    try:
        return [src.index(g) for g in dst]
    except ValueError:
        return None
