"""The products of an attention as labelled contractions, and which tensors are activations.

A MatMul or an Einsum is read as: each operand's axes labelled, the output's axes labelled. A label
in both operands and the output is a batch axis; in both operands only, a contracted axis; in one
operand and the output, that operand's free axis. Attention's first product contracts the head dim
and leaves the query and key positions free; its second contracts the key positions.

An *activation* is a tensor whose values depend on a graph input (not only on its shape): the
logits are usually the product of two activations. One operand may be weights (a learned query: attention
pooling, object queries, latent arrays); whether such a product is attention is decided by axes in
core.py (the softmax must normalise over the free axis of the activation operand, the input's positions),
not here. On a logits chain that holds both, the product of two activations is the logits and a product
of an activation with weights (DeBERTa's content-to-position term, XLNet's position term) is a bias.
"""

from __future__ import annotations

import weakref
from collections.abc import Set
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..graph.dependence import value_operands
from .errors import Unsupported
from .layout_ops import rank_of

PRODUCTS = {"MatMul", "Einsum"}
# other ops that contract an operand with weights (a linear layer): the nearest such op computes the logits
LINEAR = {"Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "Conv"}


@dataclass
class Contraction:
    node: gs.Node
    operands: tuple[gs.Tensor, gs.Tensor]
    labels: tuple[tuple[str, ...], tuple[str, ...]]  # per operand axis
    out: tuple[str, ...]  # per output axis

    def free(self, i: int) -> list[str]:
        other = set(self.labels[1 - i])
        return [x for x in self.labels[i] if x not in other and x in self.out]

    @property
    def contracted(self) -> list[str]:
        return [x for x in self.labels[0] if x in self.labels[1] and x not in self.out]

    @property
    def batch(self) -> list[str]:
        return [x for x in self.out if x in self.labels[0] and x in self.labels[1]]

    def summed(self) -> list[str]:
        """Labels of one operand only that do not reach the output (a reduction inside the product)."""
        return [x for i in (0, 1) for x in self.labels[i] if x not in self.labels[1 - i] and x not in self.out]


def read(view, node: gs.Node) -> Contraction:
    """The labelled contraction of a two-operand MatMul or Einsum; Unsupported when it is not one."""
    if node.op == "MatMul":
        a, b = node.inputs[:2]
        ra, rb = rank_of(view, a), rank_of(view, b)
        if ra is None or rb is None:
            raise Unsupported(f"MatMul {node.name}: the ranks of its operands are unknown")
        if ra < 2 or rb < 2:
            raise Unsupported(f"MatMul {node.name} has a 1-D operand")
        if ra != rb:
            raise Unsupported(f"MatMul {node.name} broadcasts a rank-{min(ra, rb)} operand over rank {max(ra, rb)}")
        batch = tuple(f"B{i}" for i in range(ra - 2))
        return Contraction(node, (a, b), (batch + ("M", "K"), batch + ("K", "N")), batch + ("M", "N"))
    if node.op == "Einsum" and len(node.inputs) == 2:
        eq = str(node.attrs.get("equation", "")).replace(" ", "")
        if "->" not in eq:
            raise Unsupported(f"Einsum {node.name} has an implicit output ('{eq}')")
        lhs, out = eq.split("->")
        terms = lhs.split(",")
        if len(terms) != 2:
            raise Unsupported(f"Einsum {node.name} is not a product of two operands")
        ranks = [rank_of(view, t) for t in node.inputs]
        labels = [_expand(t, r, node) for t, r in zip(terms, ranks)]
        ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t and r is not None),
                  default=0)
        out_labels = _expand(out, len(out.replace("...", "")) + ell, node)
        for lab in labels:
            if len(set(lab)) != len(lab):
                raise Unsupported(f"Einsum {node.name} takes a diagonal ('{eq}')")
        return Contraction(node, tuple(node.inputs[:2]), (tuple(labels[0]), tuple(labels[1])), tuple(out_labels))
    raise Unsupported(f"{node.op} {node.name} is not a product of two tensors")


def _expand(term: str, rank: int | None, node) -> list[str]:
    """Einsum subscripts as labels; '...' becomes one label per broadcast axis."""
    if "..." not in term:
        return list(term)
    if rank is None:
        raise Unsupported(f"Einsum {node.name}: '...' over an operand of unknown rank")
    head, tail = term.split("...")
    return list(head) + [f"_{i}" for i in range(rank - len(head) - len(tail))] + list(tail)


class Activations:
    """Which tensors depend on the values of a graph input (or, in a subgraph, of anything outside it)."""

    def __init__(self, graph: gs.Graph, sources: set[str], constants: Set[str] = frozenset()):
        self.graph = graph
        self.sources = sources
        self.constants = constants  # tensors from outside that hold weights, not values (a subgraph's)
        self._memo: dict[str, bool] = {}

    def __call__(self, t: gs.Tensor) -> bool:
        memo = self._memo
        stack = [(t, False)]
        while stack:  # iterative post-order: deep graphs must not hit the recursion limit
            x, ready = stack.pop()
            if x.name in memo:
                continue
            if ready:
                memo[x.name] = self._value(x)
                continue
            stack.append((x, True))
            n = x.inputs[0] if isinstance(x, gs.Variable) and x.inputs else None
            if n is not None:
                stack.extend((i, False) for i in value_operands(n) if i.name and i.name not in memo)
        return memo[t.name]

    def _value(self, x: gs.Tensor) -> bool:
        if isinstance(x, gs.Constant):
            return False
        if x.name in self.sources:
            return True
        n = x.inputs[0] if x.inputs else None
        if n is None:
            return x.name not in self.constants  # from outside this graph: a value unless known weights
        if n.op == "Constant":
            return False
        if n.op in ("Loop", "If", "Scan"):
            return True  # what a subgraph computes is not followed: assume it reads values
        return any(self._memo.get(i.name, False) for i in value_operands(n) if i.name)


_ACTIVATIONS: weakref.WeakKeyDictionary[object, Activations] | None = None  # view -> Activations, weakly keyed


def activations(view, constants: set[str] | None = None) -> Activations:
    """The activation test of a view's graph (built once per view; `constants` on the first call: inputs
    that hold weights, as the outer scope's initializers a subgraph reads)."""
    global _ACTIVATIONS
    if _ACTIVATIONS is None:
        _ACTIVATIONS = weakref.WeakKeyDictionary()
    if view not in _ACTIVATIONS:
        constants = set(constants or ())
        _ACTIVATIONS[view] = Activations(view.graph, set(view.inputs) - constants, constants)
    return _ACTIVATIONS[view]


def attention_product(view, node: gs.Node | None) -> bool:
    """A MatMul or Einsum of two activations (what attention's logits and output are)."""
    if node is None or node.op not in PRODUCTS or len(node.inputs) != 2:
        return False
    act = activations(view)
    return all(act(i) for i in node.inputs)


def input_product(view, node: gs.Node | None) -> bool:
    """A MatMul or Einsum with at least one activation operand (its other operand may be weights)."""
    if node is None or node.op not in PRODUCTS or len(node.inputs) != 2:
        return False
    act = activations(view)
    return any(act(i) for i in node.inputs)
