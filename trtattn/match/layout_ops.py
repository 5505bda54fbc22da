"""One rule per layout op: how it moves the atoms of a frame (axes.py), forward (input frame -> output
frame) and backward (output -> input).

    Same        Identity, Dropout, float/no-op Cast, Q/DQ, one-input Concat, an Expand that expands
                nothing: the frame as it is
    Transpose   the axes permuted
    Reshape     atoms regrouped by static sizes and dim names (axes.regroup); where inference left a
                fresh symbol (unk__N) or no dim, by sizes measured at two runs (graph/measure.py), and by
                the names again where those sizes cannot be placed; a constant target that fixes a
                position's size is noted (a length written into the graph)
    Flatten     the axes before and after `axis` merged (forward); regrouped by dims (backward)
    Unsqueeze   unit axes inserted / removed       Squeeze   the reverse

Also here: what a Reshape target holds where it is computed (partial_ints) and a tensor's rank where
shape inference gave up (rank_of).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph.dim_names import is_free
from ..graph.measure import Sizes, measured
from .axes import Atoms, Frame, Unfollowable, atoms_of, regroup, show


class Rule:
    ops: tuple[str, ...] = ()

    def applies(self, view, node: gs.Node) -> bool:
        return True

    def forward(self, view, node: gs.Node, frame: Frame, atoms: Atoms) -> Frame:
        raise NotImplementedError

    def backward(self, view, node: gs.Node, frame: Frame, atoms: Atoms) -> Frame:
        raise NotImplementedError


class Same(Rule):
    ops = ("Identity", "Dropout", "QuantizeLinear", "DequantizeLinear", "Cast", "Concat", "Expand")

    def applies(self, view, node):
        if node.op == "Cast":
            return view.is_noop_cast(node) or view.is_float_cast(node)
        if node.op == "Concat":
            return len(node.inputs) == 1
        if node.op == "Expand":
            return is_noop_expand(view, node)
        return True

    def forward(self, view, node, frame, atoms):
        return frame

    backward = forward


class Transpose(Rule):
    ops = ("Transpose",)

    @staticmethod
    def _perm(node, rank):
        return list(node.attrs.get("perm", reversed(range(rank))))

    def forward(self, view, node, frame, atoms):
        return tuple(frame[p] for p in self._perm(node, len(frame)))

    def backward(self, view, node, frame, atoms):
        out = [()] * len(frame)
        for i, p in enumerate(self._perm(node, len(frame))):
            out[p] = frame[i]
        return tuple(out)


class Reshape(Rule):
    ops = ("Reshape",)

    def forward(self, view, node, frame, atoms):
        named_in, named_out = view.shape(node.inputs[0]), reshape_dims(view, node)
        dims_in, dims_out = _reshape_dims(view, node, named_in, named_out)
        atoms.note_symbolic(frame, named_in)
        out = _regroup(atoms, frame, (dims_in, dims_out), (named_in, named_out), _what(node))
        atoms.note_symbolic(out, named_out)
        _note_constants(view, node, out, atoms)
        _note_entries(view, node, out, atoms)
        return out

    def backward(self, view, node, frame, atoms):
        _note_constants(view, node, frame, atoms)
        named_in, named_out = view.shape(node.inputs[0]), reshape_dims(view, node)
        dims_in, dims_out = _reshape_dims(view, node, named_in, named_out)
        atoms.note_symbolic(frame, named_out)
        out = _regroup(atoms, frame, (dims_out, dims_in), (named_out, named_in), _what(node))
        atoms.note_symbolic(out, named_in)
        _note_entries(view, node, frame, atoms)
        return out


class Flatten(Rule):
    ops = ("Flatten",)

    def forward(self, view, node, frame, atoms):
        axis = node.attrs.get("axis", 1) % max(len(frame), 1)
        return (sum(frame[:axis], ()), sum(frame[axis:], ()))

    def backward(self, view, node, frame, atoms):
        dims_in, dims_out = _reshape_dims(view, node, view.shape(node.inputs[0]), view.shape(node.outputs[0]))
        return regroup(atoms, frame, dims_out, dims_in, _what(node))


class Unsqueeze(Rule):
    ops = ("Unsqueeze",)

    def forward(self, view, node, frame, atoms):
        return _insert_units(node, frame, _axes(view, node), len(frame) + len(_axes(view, node) or ()))

    def backward(self, view, node, frame, atoms):
        return _remove_units(node, frame, _axes(view, node), atoms)


class Squeeze(Rule):
    ops = ("Squeeze",)

    def _squeezed(self, view, node, rank_in):
        axes = _axes(view, node)
        if axes is None:  # every axis of size 1
            shape = view.shape(node.inputs[0])
            if shape is None or len(shape) != rank_in:
                raise Unfollowable(f"{_what(node)}: which axes it removes is unknown")
            axes = [i for i, d in enumerate(shape) if d == 1]
        return axes

    def forward(self, view, node, frame, atoms):
        axes = [a % len(frame) for a in self._squeezed(view, node, len(frame))]
        for a in axes:
            for atom in atoms.resolve((frame[a],))[0]:
                if atoms.known(atom) not in (1, None):
                    raise Unfollowable(f"{_what(node)} removes an axis of size {atoms.known(atom)}")
                atoms.size[atom] = 1  # a squeezed axis has size 1
        return tuple(g for i, g in enumerate(frame) if i not in axes)

    def backward(self, view, node, frame, atoms):
        shape = view.shape(node.inputs[0])
        axes = self._squeezed(view, node, len(shape) if shape is not None else -1)
        return _insert_units(node, frame, axes, len(frame) + len(axes))


RULES: dict[str, Rule] = {op: r for r in (Same(), Transpose(), Reshape(), Flatten(), Unsqueeze(), Squeeze())
                          for op in r.ops}


def rule(view, node: gs.Node) -> Rule | None:
    """The rule of a layout op, or None when `node` is not one."""
    r = RULES.get(node.op)
    return r if r is not None and r.applies(view, node) else None


def is_layout(view, node: gs.Node) -> bool:
    return rule(view, node) is not None


def forward(view, node: gs.Node, frame: Frame, atoms: Atoms) -> Frame:
    """The frame of node's first output from the frame of its first input."""
    r = rule(view, node)
    if r is None:
        raise Unfollowable(f"{_what(node)} is not a layout op")
    return r.forward(view, node, frame, atoms)


def backward(view, node: gs.Node, frame: Frame, atoms: Atoms) -> Frame:
    """The frame of node's first input from the frame of its output."""
    r = rule(view, node)
    if r is None:
        raise Unfollowable(f"{_what(node)} is not a layout op")
    return r.backward(view, node, frame, atoms)


# ---------------------------------------------------------------- helpers of the rules
def _reshape_dims(view, node: gs.Node, dims_in: list | None, dims_out: list | None) -> tuple:
    """The dims a regrouping op reads and writes; measured at two runs (graph/measure.py) when inference
    left either side a fresh symbol or nothing: such a name says nothing about what a dim is made of."""
    if not (_fresh(dims_in) or _fresh(dims_out)):
        return dims_in, dims_out
    got_in, got_out = measured(view, node.inputs[0]), measured(view, node.outputs[0])
    if got_in is None or got_out is None:
        return dims_in, dims_out
    return got_in, got_out


def _regroup(atoms: Atoms, frame: Frame, dims: tuple, named: tuple, what: str) -> Frame:
    """regroup by `dims` (measured where inference left fresh symbols), or by the dims inference `named` where
    the measured sizes cannot be placed, or where a length is 1 at both runs (_unit_at_both_runs) and some
    atom's size is unknown (_some_size_unknown): numbers that are ambiguous or contradictory where the names
    are not (a length the graph folds into the batch is one). What matched before sizes were measured still
    matches, and a failure is the names' failure."""
    (dims_from, dims_to), (named_from, named_to) = dims, named
    if dims == named or (_unit_at_both_runs(dims_from, named_from) or _unit_at_both_runs(dims_to, named_to)) \
            and _some_size_unknown(atoms, frame, dims_from):
        return regroup(atoms, frame, named_from, named_to, what)
    trial = atoms.copy()
    try:
        out = regroup(trial, frame, dims_from, dims_to, what)
    except Unfollowable:
        return regroup(atoms, frame, named_from, named_to, what)
    atoms.adopt(trial)
    return out


def _unit_at_both_runs(measured: list | None, named: list | None) -> bool:
    """A dim measured 1 at both runs that inference does not call 1: a length that is 1 at both probes, which
    the numbers cannot tell from a unit axis (they place it anywhere, or nowhere: 'cannot tell how [x0*x1*m, n]
    regroups into [8, 8, 1, 1]'), where the names can."""
    if measured is None or named is None or len(measured) != len(named):
        return False
    return any(isinstance(m, Sizes) and m.static and m[0] == 1 and n != 1 for m, n in zip(measured, named))


def _some_size_unknown(atoms: Atoms, frame: Frame, dims_from: list | None) -> bool:
    """An atom of `frame` whose size neither a shape nor a measure gives (after learning from `dims_from`): a
    length that may be 1, which the numbers cannot place. Where every size is known (a learned probe's one
    query, its batch of 1 expanded to the measured batch), the numbers place every atom and the names,
    fresh symbols, would place nothing (the probe's heads left merged into the batch: head size 32, not 8)."""
    trial = atoms.copy()
    trial.learn(frame, dims_from)
    runs = len(next((d for d in dims_from or () if isinstance(d, Sizes)), (None,)))
    return any(trial.sizes(a, runs) is None for a in atoms_of(trial.resolve(frame)))


def _fresh(dims: list | None) -> bool:
    return dims is None or any(d is None or (isinstance(d, str) and is_free(d)) or (isinstance(d, int) and d <= 0)
                               for d in dims)


def _what(node: gs.Node) -> str:
    return f"{node.op} {node.name}"


def _axes(view, node: gs.Node) -> list[int] | None:
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(node.inputs) > 1 and node.inputs[1].name:
        return view.ints(node.inputs[1])
    return None


def _insert_units(node: gs.Node, frame: Frame, axes, rank: int) -> Frame:
    if axes is None:
        raise Unfollowable(f"{_what(node)}: its axes are computed")
    axes = sorted(a % rank for a in axes)
    rest = iter(frame)
    return tuple(() if i in axes else next(rest) for i in range(rank))


def _remove_units(node: gs.Node, frame: Frame, axes, atoms: Atoms) -> Frame:
    if axes is None:
        raise Unfollowable(f"{_what(node)}: its axes are computed")
    axes = {a % len(frame) for a in axes}
    for a in axes:
        if any(atoms.known(x) != 1 for x in atoms.resolve((frame[a],))[0]):
            raise Unfollowable(f"{_what(node)}: the inserted axis holds {show((frame[a],))}")
    return tuple(g for i, g in enumerate(frame) if i not in axes)


def is_noop_expand(view, node: gs.Node) -> bool:
    shape = view.ints(node.inputs[1]) if len(node.inputs) > 1 else None
    src = view.shape(node.inputs[0])
    if shape is None or src is None or len(shape) > len(src):
        return False
    return all(s == 1 or s == d for s, d in zip(shape[::-1], src[::-1]))


def partial_ints(view, t: gs.Tensor, budget: int = 8) -> list | None:
    """A 1-D int tensor's values where constant, None where computed: a Reshape target written
    Concat(Unsqueeze(Gather(Shape(x), 0)), [-1], [16]) reads [None, -1, 16]."""
    values = view.ints(t)
    if values is not None:
        return values
    n = view.producer(t)
    if n is None or budget == 0:
        return None
    if n.op == "Concat":
        out = []
        for i in n.inputs:
            part = partial_ints(view, i, budget - 1)
            if part is None:
                shape = view.shape(i)
                if shape is None or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 0:
                    return None
                part = [None] * shape[0]
            out += part
        return out
    if n.op in ("Unsqueeze", "Reshape") and view.shape(t) == [1]:
        return [None]
    if n.op in ("Cast", "Identity"):
        return partial_ints(view, n.inputs[0], budget - 1)
    return None


def reshape_dims(view, node: gs.Node) -> list | None:
    """The output dims of a Reshape: its target where constant, else the inferred shape."""
    inferred = view.shape(node.outputs[0])
    target = partial_ints(view, node.inputs[1])
    if target is None:
        return inferred
    src = view.shape(node.inputs[0])
    allowzero = node.attrs.get("allowzero", 0)
    out = []
    for i, t in enumerate(target):
        if t is not None and (t > 0 or (t == 0 and allowzero)):
            out.append(t)
        elif t == 0:
            out.append(src[i] if src is not None and i < len(src) else None)
        else:
            out.append(inferred[i] if inferred is not None and len(inferred) == len(target) else None)
    return out


def _note_constants(view, node: gs.Node, out_frame: Frame, atoms: Atoms) -> None:
    """The atoms a Reshape's constant target gives a size of their own (a length written into the graph)."""
    target = partial_ints(view, node.inputs[1])
    if target is None or len(target) != len(out_frame):
        return
    for g, t in zip(atoms.resolve(out_frame), target):
        if len(g) == 1 and t is not None and t > 0:
            atoms.hard_coded.setdefault(g[0], (t, node.name))


def _note_entries(view, node: gs.Node, out_frame: Frame, atoms: Atoms) -> None:
    """The atoms alone on an axis whose size the Reshape's target computes at run time: that entry of the
    target is their size (what the rewrite reads when no tensor it keeps has them on an axis)."""
    target = partial_ints(view, node.inputs[1])
    if target is None or len(target) != len(out_frame):
        return
    for i, (g, t) in enumerate(zip(atoms.resolve(out_frame), target)):
        if len(g) == 1 and t is None:
            atoms.entries.setdefault(g[0], (node.inputs[1].name, i))


_SAME_RANK = {"Concat", "Softmax", "Identity", "Dropout", "Cast", "QuantizeLinear", "DequantizeLinear", "Neg",
              "Tanh", "Sqrt", "Exp", "Erf", "Relu", "LayerNormalization", "Add", "Sub", "Mul", "Div", "Where",
              "MatMul", "Pow", "Max", "Min", "Expand"}


def rank_of(view, t: gs.Tensor, budget: int = 48) -> int | None:
    """A tensor's rank: inferred, else worked out from the ops that make it (shape inference gives up
    on dims written -1 or '?')."""
    r = view.rank(t)
    if r is not None or budget == 0:
        return r
    n = view.producer(t)
    if n is None:
        return None
    if n.op == "Reshape":
        target = partial_ints(view, n.inputs[1])
        return len(target) if target is not None else None
    if n.op == "Transpose" and "perm" in n.attrs:
        return len(n.attrs["perm"])
    if n.op == "Flatten":
        return 2
    if n.op == "Einsum":
        eq = str(n.attrs.get("equation", "")).replace(" ", "")
        return len(eq.split("->")[1]) if "->" in eq and "..." not in eq else None
    if n.op in ("Unsqueeze", "Squeeze"):
        axes, inner = _axes(view, n), rank_of(view, n.inputs[0], budget - 1)
        if axes is None or inner is None:
            return None
        return inner + len(axes) if n.op == "Unsqueeze" else inner - len(axes)
    if n.op in _SAME_RANK:  # elementwise (broadcast: the largest rank), or like its first input
        ins = [i for i in n.inputs if i.name]
        ranks = [rank_of(view, i, budget - 1) for i in (ins[:1] if n.op == "Concat" else ins)]
        if n.op == "Expand":
            shape = view.shape(n.inputs[1])
            ranks.append(shape[0] if shape and isinstance(shape[0], int) else None)
        known = [r for r in ranks if r is not None]
        return None if not ranks or len(known) < len(ranks) else max(known)
    return None
