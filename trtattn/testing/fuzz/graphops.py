"""The registry of mutation kinds and the onnx-graphsurgeon helpers they share.

A kind is one small function registered with `@kind(name, preserving=..., variants=...)`; it edits a
freshly imported gs.Graph around one site (`ctx.site`) and raises NotApplicable when the site lacks
what it rewrites (no scale, no mask, shapes that do not allow it). Whole-model kinds take and return
an onnx.ModelProto.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .sites import Facts, Site

F32_MIN = float(np.finfo(np.float32).min)
INT64_MAX = np.iinfo(np.int64).max


class NotApplicable(Exception):
    """The site has nothing this mutation rewrites."""


@dataclass(frozen=True)
class Kind:
    name: str
    preserving: bool
    variants: tuple[str, ...]
    fn: Callable
    whole_model: bool = False
    doc: str = ""
    precision: str = "fp32"  # what the mutant computes its products in: the oracle's tolerance follows it


KINDS: dict[str, Kind] = {}


def kind(name: str, *, preserving: bool, variants, whole_model: bool = False, precision: str = "fp32"):
    def register(fn):
        if name in KINDS:
            raise ValueError(f"mutation kind '{name}' registered twice")
        KINDS[name] = Kind(name, preserving, tuple(variants), fn, whole_model, (fn.__doc__ or "").strip(), precision)
        return fn
    return register


def need(condition, why: str) -> None:
    if not condition:
        raise NotApplicable(why)


class Ctx:
    """One mutation of one site: the graph, the site's anchors in it, the source's runtime facts."""

    def __init__(self, graph: gs.Graph, site: Site, facts: Facts, variant: str, tag: str, source: onnx.ModelProto):
        self.graph, self.site, self.facts, self.variant, self.source = graph, site, facts, variant, source
        self.opset = graph.opset
        self.prefix, self.n = f"fuzz/{site.index}/{tag}", 0

    # -- building
    def fresh(self, base: str) -> str:
        self.n += 1
        return f"{self.prefix}/{base}_{self.n}"

    def op(self, op: str, inputs: list, outputs: int = 1, **attrs):
        outs = [gs.Variable(self.fresh(f"{op}_out")) for _ in range(outputs)]
        self.graph.nodes.append(gs.Node(op, self.fresh(op), attrs, list(inputs), outs))
        return outs[0] if outputs == 1 else outs

    def const(self, value, dtype=np.float32) -> gs.Constant:
        return gs.Constant(self.fresh("const"), np.asarray(value, dtype=dtype))

    def ints(self, values) -> gs.Constant:
        return self.const(values, np.int64)

    def unsqueeze(self, x, axes):
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)])
        return self.op("Unsqueeze", [x], axes=list(axes))

    def reduce_sum(self, x, axes, keepdims=1):
        if self.opset >= 13:
            return self.op("ReduceSum", [x, self.ints(axes)], keepdims=keepdims)
        return self.op("ReduceSum", [x], axes=list(axes), keepdims=keepdims)

    def slice(self, x, start, end, axis):
        return self.op("Slice", [x, self.ints([start]), self.ints([end]), self.ints([axis])])

    def shape_of(self, x, start=0, end=INT64_MAX):
        return self.slice(self.op("Shape", [x]), start, end, 0)

    # -- site facts
    def rank(self, t) -> int:
        s = self.facts.shape(t)
        need(s is not None, f"no runtime shape for {t.name}")
        return len(s or ())

    def dtype_is_f32(self, t) -> bool:
        return self.facts.dtypes.get(t.name) == np.float32

    def path_nodes(self) -> list[gs.Node]:
        s = self.site
        return [*s.pre, s.softmax, *s.post, s.bmm2]

    def edge(self, name: str) -> tuple[gs.Node, gs.Tensor]:
        """(consumer, tensor) of one edge of the site: q, k (K as bmm1 reads it), v, logits (bmm1's
        output), scores (the softmax input), probs (the softmax output) or p (what BMM2 reads)."""
        s = self.site
        if name == "q":
            return s.bmm1, s.bmm1.inputs[0]
        if name == "k":
            return s.bmm1, s.bmm1.inputs[1]
        if name == "v":
            return s.bmm2, s.bmm2.inputs[s.v_slot]
        if name == "p":  # the probabilities as BMM2 reads them (after a NaN guard, a Cast)
            return s.bmm2, s.bmm2.inputs[s.probs_slot]
        if name == "scores":
            return s.softmax, s.softmax.inputs[0]
        tensor = s.bmm1.outputs[0] if name == "logits" else s.softmax.outputs[0]
        path = self.path_nodes()
        consumer = next((c for c in tensor.outputs if any(c is p for p in path)), None)
        need(consumer is not None, f"the {name} reach no node of the site")
        return consumer, tensor

    def insert(self, edge: str, make: Callable) -> None:
        """Put make(tensor) between an edge's tensor and its consumer in the site."""
        consumer, tensor = self.edge(edge)
        replace_input(consumer, tensor, make(tensor))

    def bypass(self, node: gs.Node, keep: int) -> None:
        """Remove `node`: its consumers read its input `keep` instead."""
        out, src = node.outputs[0], node.inputs[keep]
        need(out not in self.graph.outputs, f"{node.name}'s output is a graph output")
        for c in list(out.outputs):
            replace_input(c, out, src)
        node.inputs.clear()
        node.outputs.clear()
        self.site.pre[:] = [n for n in self.site.pre if n is not node]
        self.site.post[:] = [n for n in self.site.post if n is not node]

    def path_operand(self, node: gs.Node) -> int:
        """Which input of a node between bmm1 and the softmax carries the logits."""
        for j, t in enumerate(node.inputs):
            if reaches(t, self.site.bmm1):
                return j
        raise NotApplicable(f"{node.name} is not on the logits' path")

    def masks(self) -> list[tuple[gs.Node, int]]:
        """(node, operand) of each mask or bias on the logits, nearest the softmax first: an Add's
        activation operand or a Where's condition."""
        out = []
        for n in reversed(self.site.pre):
            if n.op == "Add" and not isinstance(n.inputs[1 - self.path_operand(n)], gs.Constant):
                out.append((n, 1 - self.path_operand(n)))
            elif n.op == "Where":
                out.append((n, 0))
        return out

    def scales(self) -> list[tuple[gs.Node, int, float]]:
        """(node, activation operand, factor) of each Mul/Div by a scalar on the logits, Q or K."""
        s, out = self.site, []
        before_masks = s.pre[:next((i for i, n in enumerate(s.pre) if n.op in ("Add", "Sub", "Where")), len(s.pre))]
        candidates = [(n, self.path_operand(n)) for n in before_masks if n.op in ("Mul", "Div")]
        for t in (s.bmm1.inputs[0], s.bmm1.inputs[1]):
            if t.inputs and t.inputs[0].op in ("Mul", "Div") and len(t.outputs) == 1:
                n = t.inputs[0]
                c = [j for j, x in enumerate(n.inputs) if scalar(self.facts, x) is None]
                if len(c) == 1:
                    candidates.append((n, c[0]))
        for n, j in candidates:
            value = scalar(self.facts, n.inputs[1 - j])
            if value is None or (n.op == "Div" and j != 0) or value == 0:
                continue
            out.append((n, j, value if n.op == "Mul" else 1.0 / value))
        return out


def reaches(t: gs.Tensor, target: gs.Node, depth: int = 24) -> bool:
    """Whether `target` produces `t` or one of its ancestors within `depth` nodes."""
    frontier, seen = [t], set()
    for _ in range(depth):
        nxt = []
        for x in frontier:
            if not x.inputs or id(x) in seen:
                continue
            seen.add(id(x))
            n = x.inputs[0]
            if n is target:
                return True
            if n.op not in ("Shape", "Size"):  # a mask built from the logits' shape does not carry them
                nxt += [i for i in n.inputs if not isinstance(i, gs.Constant)]
        frontier = nxt
    return False


def replace_input(node: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    for i, t in enumerate(node.inputs):
        if t is old:
            node.inputs[i] = new


def scalar(facts: Facts, t) -> float | None:
    v = facts.value(t)
    if v is None or v.size != 1 or not np.issubdtype(v.dtype, np.floating):
        return None
    return float(v.reshape(()))
