"""Which softmaxes are attention-like, whatever sits around them (the never-silent rule): one decision,
`likeness`, with the reason when it is not.

A Softmax is attention-like when it normalises over positions of the input and its probabilities reach a
product with an activation (V) that does not itself depend on them, through any ops but other products (a
pseudo-inverse iterating on the probabilities, Nystromformer's middle kernel, weighs nothing of the input).
Upstream, the nearest product on each path computes the logits: a product of two activations is attention's;
a product of an activation with weights is attention's (a learned query) only when the softmax axis is not
the weights' own free axis and the weighted sums stay one per query (linear attention's softmax of K over
positions is a feature map: Q'(K'^T V) sums over its "queries", K's features); a linear layer (Gemm and kin)
is a classifier head's or a router's. Such a Softmax that the matcher cannot fuse is listed as not fused,
with why; any other Softmax is ignored with the reason, the same in every layer."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..graph.dependence import value_operands, value_readers
from .contraction import LINEAR, PRODUCTS, activations, attention_product, input_product
from .errors import OverWeights
from .normalised import over_weights

UP_HOPS, DOWN_HOPS = 48, 32  # Longformer's sliding chunks put ~30 ops between product and Softmax


@dataclass(frozen=True)
class Likeness:
    """Whether a softmax is attention-like (listed when not fused) and, when it is not, why (ignored with it)."""

    attention: bool
    reason: str = ""


def likeness(view, sm: gs.Node) -> Likeness:
    """The one decision for a Softmax (module doc)."""
    return _decide(view, sm.inputs[0], sm.outputs[0], sm)


def judged(view, sm: gs.Node, error: Exception) -> Likeness:
    """The decision for a Softmax the matcher did not take (`error`: why): over a weight's axis as the frames
    read it (core.py: OverWeights) it is not attention, else as `likeness` decides, with the matcher's why."""
    if isinstance(error, OverWeights):
        return Likeness(False, str(error))
    verdict = likeness(view, sm)
    return verdict if verdict.attention else Likeness(False, f"{verdict.reason} ({error})")


def attention_like(view, sm: gs.Node) -> bool:
    return likeness(view, sm).attention


def attention_like_between(view, logits: gs.Tensor, probs: gs.Tensor) -> bool:
    """The same question for a normalisation written without a Softmax op (canonical.py: unproven). With no
    Softmax to read the axis from, a product with weights counts as attention's: listed, never silent."""
    return _decide(view, logits, probs, None).attention


def _decide(view, logits: gs.Tensor, probs: gs.Tensor, sm: gs.Node | None) -> Likeness:
    product = _from_product(view, logits, sm)
    if product is None:
        return Likeness(False, "no product of a query and keys computes its logits (a classifier head, a router, "
                               "a softmax over features)")
    weighed = _to_product(view, probs)
    if weighed is None:
        return Likeness(False, "its probabilities weigh no values of the input independent of themselves (a "
                               "pseudo-inverse iteration, a reduction)")
    if not attention_product(view, product):
        summed = _summed_over_queries(view, weighed, probs)
        if summed is not None:
            return Likeness(False, f"the logits are a linear layer's ({product.op} {product.name}) and the sums "
                                   f"its probabilities weigh are summed over its queries by {summed.op} {summed.name} "
                                   "(linear attention's Q'(K'^T V), a softmax over features): not attention")
    return Likeness(True)


def _from_product(view, logits: gs.Tensor, sm: gs.Node | None) -> gs.Node | None:
    """The product computing attention's logits above `logits` (module doc), else None."""
    frontier, seen = [(logits, 0)], set()
    while frontier:
        x, hops = frontier.pop()
        n = view.producer(x)
        if n is None or id(n) in seen or hops > UP_HOPS:
            continue
        seen.add(id(n))
        if n.op in PRODUCTS:
            if attention_product(view, n):
                return n
            if input_product(view, n) and (sm is None or not over_weights(view, sm, n)):
                return n  # a learned query: the softmax runs over the input's positions
            continue
        if n.op in LINEAR or n.op == "Softmax":
            continue  # a linear layer's outputs are the weights' axis: a classifier head, a router
        frontier.extend((i, hops + 1) for i in value_operands(n) if isinstance(i, gs.Variable))
    return None


def _to_product(view, t: gs.Tensor) -> gs.Node | None:
    """The first product the probabilities `t` reach with an activation that does not itself depend on
    them (a V of the input: a pseudo-inverse iterates on the probabilities themselves), else None."""
    act = activations(view)
    frontier, seen = [(t, 0)], set()
    while frontier:
        x, hops = frontier.pop()
        if hops > DOWN_HOPS:
            continue
        for c in value_readers(x):
            if id(c) in seen:
                continue
            seen.add(id(c))
            if c.op in PRODUCTS and len(c.inputs) == 2:
                other = c.inputs[1] if c.inputs[0] is x else c.inputs[0]
                if other is not x and act(other) and not _depends_on(view, other, t):
                    return c
                continue
            frontier.extend((o, hops + 1) for o in c.outputs)
    return None


def _depends_on(view, t: gs.Tensor, source: gs.Tensor) -> bool:
    frontier, seen = [(t, 0)], set()
    while frontier:
        x, hops = frontier.pop()
        if x is source:
            return True
        n = view.producer(x)
        if n is None or id(n) in seen or hops > UP_HOPS:
            continue
        seen.add(id(n))
        frontier.extend((i, hops + 1) for i in n.inputs if isinstance(i, gs.Variable))
    return False


def _summed_over_queries(view, product: gs.Node, probs: gs.Tensor) -> gs.Node | None:
    """A MatMul reading the output of `product` (a MatMul whose first operand is made from the probabilities
    `probs`: its rows are the queries) as its second operand: it sums over those queries."""
    if product.op != "MatMul" or not product.outputs or not _depends_on(view, product.inputs[0], probs):
        return None
    return next((c for c in value_readers(product.outputs[0])
                 if c.op == "MatMul" and len(c.inputs) == 2 and c.inputs[1] is product.outputs[0]
                 and c.inputs[0] is not product.outputs[0]), None)
