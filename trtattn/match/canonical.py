"""Canonical rules run before matching: a softmax written without a Softmax op becomes one.

Exporters and hand-written code spell the softmax many ways: ONNX's own Softmax function body after
inlining (Exp(x - ReduceMax(x)) / ReduceSum), `Exp(..) * Reciprocal(ReduceSum)`, `Exp(LogSoftmax(x))`,
`Exp(x - ReduceLogSumExp(x))`, LogSoftmax's body under an Exp, plain `Exp(x) / ReduceSum(Exp(x))`.
Each form is one rule in the style of onnxscript's rewriter: `pattern` matches the wiring from the
node that makes the probabilities, `check` proves it equals Softmax(x, axis) by axes (one axis, the
same one for every reduction, keepdims=1, the same x) or says why not, `rewrite` puts a Softmax in its
place. The Softmax writes the original probabilities tensor, so every name downstream is unchanged.

Exponentials normalised by a sum that no rule proves equal to a Softmax are returned as `Unproven`
with the reason: the matcher lists those that are attention-like (never silent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

_NEG_SHIFTS = ("ReduceMax",)  # x - ReduceMax(x) over the softmax axis: the "safe softmax" shift


@dataclass
class Found:
    """What a rule's pattern matched: the node making the probabilities, x, the axis (raw), the nodes
    the Softmax replaces, and the reductions whose axes the check compares."""

    anchor: gs.Node
    x: gs.Tensor  # the Softmax input (y, before the check looks at a shift)
    reductions: list[gs.Node]
    exps: list[gs.Node] = field(default_factory=list)
    axis: int | None = None  # set when the pattern reads it from a Softmax or LogSoftmax
    default_axis: bool = False  # that op has no axis attribute: its opset's default (check() resolves it)
    why: str | None = None  # the pattern found the shape but a part of it is not a softmax's


@dataclass
class Unproven:
    anchor: gs.Node  # the node making what looks like probabilities
    logits: gs.Tensor
    reason: str


@dataclass
class Canonical:
    counts: dict[str, int] = field(default_factory=dict)
    made: dict[str, str] = field(default_factory=dict)  # Softmax node name -> the rule that wrote it
    unproven: list[Unproven] = field(default_factory=list)


# ---------------------------------------------------------------- reading the graph
def _producer(t) -> gs.Node | None:
    return t.inputs[0] if isinstance(t, gs.Variable) and t.inputs else None


def _const(t) -> np.ndarray | None:
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    n = _producer(t)
    if n is not None and n.op == "Constant" and "value" in n.attrs:
        return np.asarray(n.attrs["value"].values)
    return None


def _reduce(n: gs.Node) -> tuple[list[int] | None, int]:
    """(axes or None for all, keepdims) of a Reduce* node, axes from the attribute or the input (opset 13/18+)."""
    keep = int(n.attrs.get("keepdims", 1))
    if len(n.inputs) > 1 and n.inputs[1].name:
        axes = _const(n.inputs[1])
        return (None if axes is None else [int(a) for a in axes.reshape(-1)]), keep
    axes = n.attrs.get("axes")
    return ([int(a) for a in axes] if axes is not None else None), keep


def _shift_of(y: gs.Tensor) -> tuple[gs.Tensor, gs.Node] | None:
    """(x, the ReduceMax) for y = x - ReduceMax(x): the "safe softmax" shift, removed when the check proves
    it runs over the softmax axis. Exp(y) / Sum(Exp(y)) is Softmax(y) whatever y is, so a shift over another
    axis stays, as part of the logits."""
    sub = _producer(y)
    if sub is not None and sub.op == "Sub":
        shift = _producer(sub.inputs[1])
        if shift is not None and shift.op in _NEG_SHIFTS and shift.inputs[0] is sub.inputs[0]:
            return sub.inputs[0], shift
    return None


def _same_exp(a: gs.Tensor, b: gs.Tensor) -> bool:
    """a and b are the same exponentials: one tensor, or two Exp nodes of one tensor."""
    if a is b:
        return True
    pa, pb = _producer(a), _producer(b)
    return pa is not None and pb is not None and pa.op == pb.op == "Exp" and pa.inputs[0] is pb.inputs[0]


def _inverse_of(t: gs.Tensor) -> gs.Tensor | None:
    """s for Reciprocal(s), 1 / s or Pow(s, -1)."""
    n = _producer(t)
    if n is None:
        return None
    if n.op == "Reciprocal":
        return n.inputs[0]
    if n.op == "Div" and (c := _const(n.inputs[0])) is not None and c.size == 1 and float(c.reshape(-1)[0]) == 1.0:
        return n.inputs[1]
    if n.op == "Pow" and (c := _const(n.inputs[1])) is not None and c.size == 1 and float(c.reshape(-1)[0]) == -1.0:
        return n.inputs[0]
    return None


# ---------------------------------------------------------------- rules
class Rule:
    name = ""
    anchors: tuple[str, ...] = ()

    def pattern(self, node: gs.Node) -> Found | None:
        raise NotImplementedError

    def check(self, found: Found, opset: int, rank_of) -> str | None:
        """None when the match equals Softmax(x, axis); else why it cannot be proven. Sets found.axis."""
        axes = []
        for r in found.reductions:
            got, keep = _reduce(r)
            if got is None:
                return f"{r.op} {r.name} reduces over every axis or axes not known before running"
            if len(got) != 1:
                return f"{r.op} {r.name} reduces over {len(got)} axes {got}, a softmax over one axis"
            if not keep:
                return f"{r.op} {r.name} has keepdims=0: the normalisation does not broadcast along its axis"
            axes.append(got[0])
        if found.axis is not None:
            axes.append(found.axis)
        rank = rank_of(found.x)
        if not axes:
            return "it names no axis"
        norm = {a % rank for a in axes} if rank is not None else set(axes)
        if len(norm) != 1:
            return (f"its reductions ({', '.join(r.name or r.op for r in found.reductions)}) run over different "
                    f"axes {sorted(set(axes))}")
        axis = axes[0]
        if opset < 13 and found.axis is None and not (axis == -1 or (rank is not None and axis == rank - 1)):
            return f"opset {opset}'s Softmax normalises every axis from its axis on, and this sums over axis {axis} only"
        found.axis = axis
        shift = _shift_of(found.x)
        if shift is not None:
            got, keep = _reduce(shift[1])
            if keep and got is not None and len(got) == 1 and (got[0] == axis or (
                    rank is not None and got[0] % rank == axis % rank)):
                found.x = shift[0]
        return None

    def rewrite(self, graph: gs.Graph, found: Found, index: dict) -> gs.Node:
        probs = found.anchor.outputs[0]
        if found.axis is None:  # check() sets it; a rewrite without one is a caller's bug
            raise ValueError(f"{found.anchor.op} {found.anchor.name}: rewritten before its axis was checked")
        sm = gs.Node("Softmax", name=f"{found.anchor.name or probs.name}_softmax",  # the anchor's scope: the site name
                     attrs={"axis": int(found.axis)}, inputs=[found.x], outputs=[])
        found.anchor.outputs.clear()
        sm.outputs.append(probs)
        graph.nodes[index[id(found.anchor)]] = sm
        found.anchor.inputs.clear()
        return sm


def _found_with_axis(anchor: gs.Node, x: gs.Tensor, reductions: list[gs.Node], op: gs.Node) -> Found:
    """A match whose axis is `op`'s (a Softmax or LogSoftmax) attribute, or its opset's default."""
    axis = op.attrs.get("axis")
    return Found(anchor, x, reductions, axis=None if axis is None else int(axis), default_axis=axis is None)


def _resolve_default_axis(found: Found, opset: int) -> None:
    if found.default_axis:  # Softmax and LogSoftmax default to axis 1 before opset 13, to the last axis since
        found.axis, found.default_axis = (1 if opset < 13 else -1), False


class ExpDivSum(Rule):
    """Exp(y) / ReduceSum(Exp(y)), y optionally x - ReduceMax(x): ONNX's Softmax body, safe softmax, plain."""

    name = "exp_div_sum"
    anchors = ("Div",)

    def pattern(self, node):
        return _normalised(node.inputs[0], node.inputs[1], node)


class ExpMulReciprocalSum(Rule):
    """Exp(y) * Reciprocal(ReduceSum(Exp(y))) (also 1/sum or Pow(sum, -1)), either operand order."""

    name = "exp_mul_reciprocal_sum"
    anchors = ("Mul",)

    def pattern(self, node):
        for e, inv in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            s = _inverse_of(inv)
            if s is not None and (found := _normalised(e, s, node)) is not None:
                return found
        return None


class ExpLogSoftmax(Rule):
    """Exp(LogSoftmax(x, axis)): same axis semantics as Softmax in every opset."""

    name = "exp_logsoftmax"
    anchors = ("Exp",)

    def pattern(self, node):
        ls = _producer(node.inputs[0])
        if ls is None or ls.op != "LogSoftmax":
            return None
        return _found_with_axis(node, ls.inputs[0], [], ls)

    def check(self, found, opset, rank_of):
        return None  # LogSoftmax's axis, or its default (Softmax's at the same opset), is the Softmax's


class ExpSubLogSumExp(Rule):
    """Exp(x - ReduceLogSumExp(x)), and Exp(y - Log(ReduceSum(Exp(y)))): LogSoftmax's body under an Exp."""

    name = "exp_sub_logsumexp"
    anchors = ("Exp",)

    def pattern(self, node):
        sub = _producer(node.inputs[0])
        if sub is None or sub.op != "Sub":
            return None
        y, lse = sub.inputs
        r = _producer(lse)
        if r is not None and r.op == "ReduceLogSumExp":
            if r.inputs[0] is not y:
                return Found(node, y, [r], why=f"ReduceLogSumExp {r.name} reads another tensor than the logits")
            return Found(node, y, [r])
        if r is not None and r.op == "Log" and (s := _producer(r.inputs[0])) is not None and s.op == "ReduceSum":
            if not _same_exp(s.inputs[0], _exp_of(y)):
                return Found(node, y, [s], why=f"ReduceSum {s.name} sums other exponentials than Exp of the logits")
            return Found(node, y, [s])
        return None


class ShiftedSoftmax(Rule):
    """Softmax(x - ReduceMax(x)) over the same axis: the shift changes nothing (gpt-oss, hand-written code)."""

    name = "softmax_of_shifted"
    anchors = ("Softmax",)

    def pattern(self, node):
        shift = _shift_of(node.inputs[0])
        if shift is None:
            return None
        return _found_with_axis(node, node.inputs[0], [shift[1]], node)

    def check(self, found, opset, rank_of):
        got, keep = _reduce(found.reductions[0])
        rank = rank_of(found.x)
        axis = found.axis
        if opset < 13:  # the Softmax normalises every axis from its axis on: only the last one is one axis
            if rank is None or axis % rank != rank - 1:
                return "an opset < 13 Softmax over several axes"
        same = got is not None and len(got) == 1 and (got[0] == axis or (rank is not None and got[0] % rank == axis % rank))
        return None if keep and same else "left as it is"  # another shift: part of the logits, not rewritten

    def rewrite(self, graph, found, index):
        shift = _shift_of(found.x)
        if shift is None:  # pattern() found it: the graph changed between pattern and rewrite
            raise ValueError(f"{found.anchor.op} {found.anchor.name}: its input is no longer x - ReduceMax(x)")
        found.anchor.inputs[0] = shift[0]
        return found.anchor


def _exp_of(y: gs.Tensor) -> gs.Tensor | None:
    return next((c.outputs[0] for c in y.outputs if c.op == "Exp"), None)


def _normalised(e: gs.Tensor, s: gs.Tensor, anchor: gs.Node) -> Found | None:
    """e / s with e = Exp(y) and s = ReduceSum of the same exponentials."""
    exp, total = _producer(e), _producer(s)
    if exp is None or exp.op != "Exp" or total is None or total.op != "ReduceSum":
        return None
    found = Found(anchor, exp.inputs[0], [total], exps=[exp])
    if not _same_exp(total.inputs[0], e):
        found.why = f"ReduceSum {total.name} sums other values than the exponentials {e.name} it divides"
    return found


RULES: list[Rule] = [ExpDivSum(), ExpMulReciprocalSum(), ExpLogSoftmax(), ExpSubLogSumExp(), ShiftedSoftmax()]
_BY_OP: dict[str, list[Rule]] = {}
for _r in RULES:
    for _op in _r.anchors:
        _BY_OP.setdefault(_op, []).append(_r)


# ---------------------------------------------------------------- applying them
def canonicalize(graph: gs.Graph, opset: int, rank_of=lambda t: None) -> Canonical:
    """Rewrite every proven softmax form in `graph` (not its subgraphs) into a Softmax, in place; the
    nodes it replaced and nothing else reads are removed. `rank_of(tensor)` tells negative and positive axes
    apart. Returns counts per rule, the rule behind each Softmax it made (by name), and the unproven forms."""
    out = Canonical()
    claimed: set[int] = set()
    for node in list(graph.nodes):
        if not node.outputs:
            continue  # replaced by an earlier rewrite
        for rule in _BY_OP.get(node.op, ()):
            found = rule.pattern(node)
            if found is None:
                continue
            _resolve_default_axis(found, opset)
            why = found.why or rule.check(found, opset, rank_of)
            claimed.update(id(e) for e in found.exps)
            if why is not None and isinstance(rule, ShiftedSoftmax):
                break  # a Softmax already: the matcher reads the shift as part of the logits
            if why is not None:
                out.unproven.append(Unproven(node, found.x, f"a softmax written without a Softmax op that "
                                                            f"cannot be proven one: {why}"))
                break
            old = _cone(found.anchor)
            made = rule.rewrite(graph, found, {id(n): i for i, n in enumerate(graph.nodes)})
            out.made[made.name] = rule.name
            _remove_dead(graph, old, keep=made.inputs[0])
            out.counts[rule.name] = out.counts.get(rule.name, 0) + 1
            break
    out.unproven += _stray_normalisations(graph, claimed) + _integer_normalisations(graph)
    return out


def _cone(anchor: gs.Node) -> list[gs.Node]:
    """The anchor's ancestors within a few hops: the nodes a rewrite may leave unread."""
    seen: list[gs.Node] = []
    stack = [(anchor, 0)]
    while stack:
        n, depth = stack.pop()
        for t in n.inputs:
            p = _producer(t)
            if p is not None and depth < 6 and all(p is not s for s in seen):
                seen.append(p)
                stack.append((p, depth + 1))
    return seen


def _remove_dead(graph: gs.Graph, nodes: list[gs.Node], keep: gs.Tensor) -> None:
    outputs = {id(t) for t in graph.outputs}
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.outputs and all(not o.outputs and id(o) not in outputs and o is not keep for o in n.outputs):
                n.inputs.clear()
                n.outputs.clear()
                changed = True
    graph.nodes = [n for n in graph.nodes if n.outputs]


def _stray_normalisations(graph: gs.Graph, claimed: set[int]) -> list[Unproven]:
    """Exponentials divided by (or multiplied with the inverse of) a sum over them that no rule matched:
    softmax-like, not provably a softmax (a sum plus epsilon, a mean, several axes...)."""
    found = []
    for exp in graph.nodes:
        if exp.op != "Exp" or id(exp) in claimed or not exp.outputs:
            continue
        e = exp.outputs[0]
        if not any(c.op == "ReduceSum" for c in e.outputs):
            continue
        users = [c for c in e.outputs if c.op in ("Div", "Mul")]
        if users:
            found.append(Unproven(users[0], exp.inputs[0], "a softmax written without a Softmax op that cannot be "
                                  f"proven one: Exp {exp.name} is normalised by {users[0].op} {users[0].name}, "
                                  "not by the sum of the same exponentials over one axis"))
    return found


_INTEGER_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                  onnx.TensorProto.INT64}


def _integer_normalisations(graph: gs.Graph) -> list[Unproven]:
    """Values divided by their own sum in integers (I-BERT's quant mode: an integer polynomial in place of
    Exp, normalised by an integer division): probabilities no Softmax computes, for the matcher to list where
    they are attention-like. Integers: a Cast to an integer type above the sum, within a few ops."""
    found = []
    for div in graph.nodes:
        if div.op != "Div" or len(div.inputs) != 2:
            continue
        total = _producer(div.inputs[1])
        while total is not None and total.op in ("Unsqueeze", "Cast", "Identity"):
            total = _producer(total.inputs[0])
        if total is None or total.op != "ReduceSum" or not _derived(div.inputs[0], total.inputs[0]):
            continue
        cast = _integer_cast_above(total.inputs[0])
        if cast is not None:
            found.append(Unproven(div, total.inputs[0], f"an integer softmax (Cast {cast.name} to integers, then an "
                                  f"integer exponential normalised by Div {div.name}, as I-BERT's quant mode "
                                  "computes it): a fused attention computes its softmax in floats, so it stays "
                                  "as written"))
    return found


def _derived(t: gs.Tensor, source: gs.Tensor, hops: int = 3) -> bool:
    """`t` is `source`, or made from it by a few elementwise ops with constants (a scale before the division)."""
    for _ in range(hops + 1):
        if t is source:
            return True
        n = _producer(t)
        if n is None or n.op not in ("Mul", "Cast", "Identity") or not n.inputs:
            return False
        t = next((i for i in n.inputs if not isinstance(i, gs.Constant)), n.inputs[0])
    return False


def _integer_cast_above(t: gs.Tensor, hops: int = 12) -> gs.Node | None:
    frontier, seen = [(t, 0)], set()
    while frontier:
        x, depth = frontier.pop()
        n = _producer(x)
        if n is None or id(n) in seen or depth > hops:
            continue
        seen.add(id(n))
        if n.op == "Cast" and n.attrs.get("to") in _INTEGER_TYPES:
            return n
        frontier.extend((i, depth + 1) for i in n.inputs if isinstance(i, gs.Variable))
    return None


__all__ = ["RULES", "Canonical", "Unproven", "canonicalize"]
