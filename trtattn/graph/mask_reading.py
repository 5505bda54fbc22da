"""How the model reads each mask input, measured: which of its axes go to the batch, the queries and the keys
of the logits it masks. Feeds (graph/feeds.py) then exercise the mask as the model reads it: a [batch, key]
padding mask (in either order) keeps a prefix of keys per batch row; a mask with a query axis ([B, 1, S, S],
[S, S]) is random with key 0 kept in every row; a float added to the logits is normal where kept, -1e4 where
not (a bias given as an input too: a scale wrongly applied to it shows). Read from names and dtypes alone, a
[B, 1, S, S] mask was fed all ones and an [S, B] one as if it were [B, S], so a rewrite that dropped or
transposed it passed verification.

Where the mask meets the logits: followed from the input through ops that carry its cells (layout ops, casts,
Not, comparisons and arithmetic with constants, And/Or, Trilu), the tensor an ONNX Attention takes as
attn_mask, a Where's condition choosing a fill, or an operand of an Add, Mul or Sub with something that is not
a constant, when that node's output reaches a Softmax over the logits' last axis through elementwise and
layout ops only (a hidden state reaches them through products: no mask). That tensor broadcasts from the right
against the logits (rank 4 for an Attention, else as inferred): [..., query, key]. It is evaluated (ONNX
Runtime, one session over the nodes it needs) with the input keeping every key, then with one cell toggled at
index 1 on every axis, then that cell moved one step along each axis: the logits axis the changed cells move
along is the one the input's axis goes to (the last: keys; the one before, of rank 3 or more: queries; any
other: batch or heads). Where a causal mask combined in clips the queries a key reaches, several axes move;
the one along which each toggle changes a single coordinate is the mask's. Every meeting must agree; an input
read no way, or several, keeps its static role (roles.py).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx

from ..timings import timed
from .roles import GraphUses, InputSpec, RoleKind, declared_roles
from .shapes import opset_of, tensor_types

KEY, QUERY, BATCH = "key", "query", "batch"
DROP = -1e4  # an additive mask's value at a masked key: exp of it is 0 in every float type
_CARRY = GraphUses.PASS + ("Not", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Xor", "Trilu")
_ARITH = ("Add", "Sub", "Mul", "Div")
_TO_LOGITS = ("Softmax", "LogSoftmax", "Add", "Sub", "Mul", "Div", "Where", "Cast", "Identity", "Reshape",
              "Transpose", "Unsqueeze", "Squeeze", "Expand", "Max", "Min", "Clip", "Tanh", "Neg")
_TO_SOFTMAX = 8  # nodes between a mask's meeting with the logits and their Softmax, at most
_CACHE: collections.OrderedDict = collections.OrderedDict()  # (model id, signature) -> (model, _Reader)


def mask_candidates(model: onnx.ModelProto, specs: list[InputSpec]) -> list[InputSpec]:
    """Inputs a mask may come in by, of rank 2 or more: bool or named a mask (what roles.py guesses is a padding
    mask), or a float the model may add to its logits. Roles the model's metadata declares stay (the zoo
    wrote them knowing the model), and so do roles already measured."""
    declared = declared_roles(model)
    return [s for s in specs if len(s.shape) >= 2 and s.name not in declared and "key_axis" not in s.role
            and (s.kind is RoleKind.PADDING_MASK or s.kind is RoleKind.FLOAT and s.dtype.kind == "f")]


@timed("read masks")
def read_masks(model: onnx.ModelProto, specs: list[InputSpec], feeds: dict[str, np.ndarray]) -> dict[str, dict]:
    """Input name -> its reading {"axes": [label per axis: key, query, batch, None for a unit axis],
    "additive": a float added to the logits} for each candidate the measurement reads one way. `feeds`:
    values of every input (the masks' are replaced). The session is made once per model; the readings are
    kept once taken, and taken again on the next feeds where the model did not run on these (dims searched)."""
    signature = tuple((s.name, tuple(map(str, s.shape)), s.kind) for s in specs)
    key = (id(model), len(model.graph.node), signature)
    if key not in _CACHE or _CACHE[key][0] is not model:
        _CACHE[key] = (model, _Reader(model, specs))
        while len(_CACHE) > 4:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return _CACHE[key][1].readings(feeds)


class _Reader:
    """One model's mask candidates, where they meet the logits and a session over the nodes that takes them
    there (module doc); the readings once the model runs on the feeds given."""

    def __init__(self, model: onnx.ModelProto, specs: list[InputSpec]):
        self.taken: dict[str, dict] | None = None
        self.run = None
        self.candidates = mask_candidates(model, specs)
        if not self.candidates:
            self.taken = {}
            return
        uses = GraphUses(model.graph, opset_of(model, 13))
        main = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
        found = {s.name: [m for m in _meetings(uses, s.name) if m[0] in main] for s in self.candidates}
        self.meetings = {n: m for n, m in found.items() if m}
        if not self.meetings:
            self.taken = {}
            return
        ranks = _logits_ranks(model, [m for found in self.meetings.values() for m in found])
        self.ranks = {n: {t: (ranks.get(logits) if logits else 4, axis) for t, _, logits, axis in m}
                      for n, m in self.meetings.items()}
        import onnx_graphsurgeon as gs

        from .evaluate import evaluator

        graph = gs.import_onnx(model)
        tensors = graph.tensors()
        self.names = sorted({m[0] for found in self.meetings.values() for m in found})
        try:
            self.run = evaluator(graph, [tensors[t] for t in self.names], model)
        except Exception:  # the cut-out does not load: no reading, the static roles stay
            self.taken = {}

    def readings(self, feeds: dict[str, np.ndarray]) -> dict[str, dict]:
        if self.taken is not None:
            return self.taken
        readings = {}
        for spec in self.candidates:
            if spec.name not in self.meetings or spec.name not in feeds:
                continue
            additive = all(m[1] == "additive" for m in self.meetings[spec.name]) and spec.dtype.kind == "f" \
                and "true_at" not in spec.role
            try:
                axes = _read(spec, feeds, self.run, self.names, self.ranks[spec.name], additive)
            except Exception:  # ONNX Runtime's errors have no common base class: the model does not run on
                return {}  # these feeds (a dims search's); the static roles stay, read again on the next
            if axes is not None:
                readings[spec.name] = {"axes": axes, "additive": additive}
        self.taken = readings
        return readings


def _meetings(uses: GraphUses, name: str) -> list[tuple[str, str, str | None, int]]:
    """(tensor, how, logits, softmax axis) where the cells of input `name` meet the logits (module doc): how is
    "additive" when the input's values reach an Add (or Attention's float mask) as they are, else "mask"; logits
    the tensor masked (None for an Attention, whose mask broadcasts to rank 4 and masks its last axis)."""
    found: list[tuple[str, str, str | None, int]] = []
    seen: set[tuple[str, bool]] = set()
    frontier = [(name, True)]  # tensor, its values the input's own (no op but layout on the way)
    while frontier:
        t, own = frontier.pop()
        if (t, own) in seen or len(seen) > 256:
            continue
        seen.add((t, own))
        for n, i in uses.consumers.get(t, ()):
            op, ins = n.op_type, n.input
            others = [x for j, x in enumerate(ins) if j != i and x]
            constant = all(uses.constant(x) is not None for x in others)
            if op == "Attention" and (n.domain or "") == "" and i == 3:
                found.append((t, "additive" if own else "mask", None, -1))
            elif op == "Where" and i == 0 and any(uses.is_fill(x) for x in ins[1:]):
                axis = _softmax_axis(uses, n)
                if axis is not None:
                    found.append((t, "mask", n.output[0], axis))
            elif op in _ARITH and not constant:
                axis = _softmax_axis(uses, n)
                if axis is not None:
                    found.append((t, "additive" if own and op == "Add" else "mask", n.output[0], axis))
                elif op in ("Add", "Mul"):  # two masks combined: follow the sum or product
                    frontier.append((n.output[0], False))
            elif op in _ARITH or op in _CARRY and (i == 0 or op in ("And", "Or", "Concat", "Xor")):
                frontier.extend((o, own and op in GraphUses.PASS) for o in n.output)
    return found


def _logits_ranks(model: onnx.ModelProto, meetings: list) -> dict[str, int]:
    """The rank of each logits tensor a mask meets (ONNX's shape inference; asked only when a mask of rank 2
    or 3 meets them there: [B, S] on [B, S] logits is a batch row's keys, on [B, N, S, S] a query's)."""
    wanted = {m[2] for m in meetings if m[2]}
    if not wanted:
        return {}
    return {name: len(shape) for name, (_, shape) in tensor_types(model).items() if name in wanted and shape}


def _softmax_axis(uses: GraphUses, node: onnx.NodeProto) -> int | None:
    """The axis of the Softmax `node`'s output reaches within _TO_SOFTMAX nodes, through ops that keep the
    logits' cells where they are (no product, no reduction: a hidden state is no mask); None if none."""
    frontier = [node]
    for _ in range(_TO_SOFTMAX):
        frontier = [r for n in frontier for o in n.output for r, _ in uses.consumers.get(o, ())
                    if r.op_type in _TO_LOGITS]
        for r in frontier:
            if r.op_type in ("Softmax", "LogSoftmax"):
                return next((a.i for a in r.attribute if a.name == "axis"), -1 if uses.opset >= 13 else 1)
        if not frontier:
            return None
    return None


def keep_value(spec: InputSpec, keep: np.ndarray, additive: bool) -> np.ndarray:
    """Booleans True at the keys kept -> the input's values, in its convention."""
    if additive:
        return np.where(keep, 0.0, DROP).astype(spec.dtype)
    return (~keep if spec.true_at_padding else keep).astype(spec.dtype)


def _read(spec: InputSpec, feeds: dict, run, names: list[str], meeting: dict[str, tuple[int | None, int]],
          additive: bool) -> list | None:
    """A label per axis of the input (module doc), None where the axis has size 1; None when unread. The cells
    toggled sit off the edges (index 1) and each axis steps both ways, so a causal mask combined in does not
    hide every toggle."""
    shape = feeds[spec.name].shape
    keep = np.ones(shape, bool)

    def changed(cell: tuple | None) -> dict:
        toggled = keep.copy()
        if cell is not None:
            toggled[cell] = False
        values = run({**feeds, spec.name: keep_value(spec, toggled, additive)})
        return {n: v for n, v in zip(names, values) if n in meeting}

    base = changed(None)
    ranks = {}  # the logits' rank where the Softmax is over their last axis (unknown: the mask's own)
    for n, (rank, axis) in meeting.items():
        rank = rank or max(np.ndim(base[n]), 2)
        if axis in (-1, rank - 1):
            ranks[n] = rank
    base = {n: v for n, v in base.items() if n in ranks}
    origin = tuple(min(1, d - 1) for d in shape)
    at_origin = {n: _where(base[n], v, ranks[n]) for n, v in changed(origin).items() if n in ranks}
    labels: list = [None] * len(shape)
    for a in (a for a in range(len(shape)) if shape[a] > 1):
        found: set = set()
        for index in (origin[a] + 1, origin[a] - 1):
            if found or not 0 <= index < shape[a]:
                continue
            cell = origin[:a] + (index,) + origin[a + 1:]
            moved = {n: _where(base[n], v, ranks[n]) for n, v in changed(cell).items() if n in ranks}
            found = {_label(at_origin[n], moved[n]) for n in base if at_origin[n] is not None and moved[n] is not None}
        if len(found) != 1 or None in found:
            return None
        labels[a] = found.pop()
    return labels if labels.count(KEY) == 1 else None


def _where(base: np.ndarray, toggled: np.ndarray, rank: int) -> np.ndarray | None:
    """Coordinates of the cells that changed, broadcast from the right to logits of `rank` and put on the axes of
    [batch, heads, query, key] (logits of rank 2 have no query axis); None: none did, or the ranks do not fit."""
    base, toggled = np.asarray(base), np.asarray(toggled)
    if base.shape != toggled.shape or not base.ndim <= rank <= 4 or rank < 2:
        return None
    where = np.argwhere(base != toggled)
    if not len(where):
        return None
    where = np.concatenate([np.zeros((len(where), rank - base.ndim), np.int64), where], axis=1)
    if rank == 2:  # [batch, key]
        where = np.stack([where[:, 0], 0 * where[:, 0], 0 * where[:, 0], where[:, 1]], axis=1)
    return np.concatenate([np.zeros((len(where), 4 - len(where[0])), np.int64), where], axis=1)


def reads_key_flags(base: np.ndarray, changed: np.ndarray, cell: tuple[int, int], shape: tuple[int, int]) -> bool:
    """Did dropping the token at `cell` = (b, j) of a [batch, key] input of `shape` change an Attention's attn_mask
    ([B, N, Sq, Skv] as it broadcasts from the right) at batch row b and key j only, and at every query row when j
    is the first key? What routes/prepare/mask_axes.py asks of the forms' masks, measured as the feeds' are."""
    where = _where(base, changed, 4)
    if where is None:
        return False
    dims = (1,) * (4 - np.ndim(base)) + np.shape(base)
    if dims[0] != shape[0] or dims[3] != shape[1]:
        return False
    b, j = cell
    confined = bool((where[:, 0] == b).all() and (where[:, 3] == j).all())
    return confined and (j != 0 or set(where[:, 2].tolist()) == set(range(dims[2])))


def _label(origin: np.ndarray | None, moved: np.ndarray | None) -> str | None:
    """Which logits axis moved between the cells changed by the origin's toggle and by another's: the one axis
    whose coordinates differ, or of several (a causal mask combined in clips the queries a key reaches) the one
    where each toggle changed a single coordinate."""
    if origin is None or moved is None:
        return None
    axes = [k for k in range(4) if set(origin[:, k]) != set(moved[:, k])]
    if len(axes) > 1:
        axes = [k for k in axes if len(set(origin[:, k])) == len(set(moved[:, k])) == 1]
    if len(axes) != 1:
        return None
    return KEY if axes[0] == 3 else QUERY if axes[0] == 2 else BATCH


def measured_role(spec: InputSpec, reading: dict) -> dict:
    """The role a reading gives: a padding mask with its batch and key axes when those are its only axes,
    else a mask (additive or not) with its key axis."""
    axes = reading["axes"]
    key = axes.index(KEY)
    kept = {k: v for k, v in spec.role.items() if k in ("true_at", "side")}
    if reading["additive"]:
        return {"kind": RoleKind.ADDITIVE_MASK, "key_axis": key}
    if sorted(a for a in axes if a) == [BATCH, KEY] and spec.kind is not RoleKind.FLOAT:
        return {**kept, "kind": RoleKind.PADDING_MASK, "key_axis": key, "batch_axis": axes.index(BATCH)}
    return {**kept, "kind": RoleKind.MASK, "key_axis": key}
