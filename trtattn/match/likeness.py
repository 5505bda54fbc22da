"""Which softmaxes are attention-like, whatever sits around them (the never-silent rule).

A Softmax is attention-like when it normalises over positions of the input and its probabilities reach a
product with an activation (V), through any ops but other products. Upstream, the nearest product on
each path computes the logits: a product of two activations is attention's; a product of an activation
with weights is attention's (a learned query) only when the softmax axis is not the weights' own free
axis, and a linear layer (Gemm and kin) is a classifier head's or a router's. Such a Softmax that the
matcher cannot fuse is listed as not fused, with why; any other Softmax (a classifier head, a router) is
ignored.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph.dependence import value_operands, value_readers
from .contraction import LINEAR, PRODUCTS, activations, attention_product, input_product
from .normalised import over_weights

UP_HOPS, DOWN_HOPS = 48, 32  # Longformer's sliding chunks put ~30 ops between product and Softmax


def attention_like(view, sm: gs.Node) -> bool:
    return _from_product(view, sm.inputs[0], sm) and _to_product(view, sm.outputs[0])


def attention_like_between(view, logits: gs.Tensor, probs: gs.Tensor) -> bool:
    """The same question for a normalisation written without a Softmax op (canonical.py: unproven). With no
    Softmax to read the axis from, a product with weights counts as attention's: listed, never silent."""
    return _from_product(view, logits, None) and _to_product(view, probs)


def _from_product(view, logits: gs.Tensor, sm: gs.Node | None) -> bool:
    frontier, seen = [(logits, 0)], set()
    while frontier:
        x, hops = frontier.pop()
        n = view.producer(x)
        if n is None or id(n) in seen or hops > UP_HOPS:
            continue
        seen.add(id(n))
        if n.op in PRODUCTS:
            if attention_product(view, n):
                return True
            if input_product(view, n) and (sm is None or not over_weights(view, sm, n)):
                return True  # a learned query: the softmax runs over the input's positions
            continue
        if n.op in LINEAR or n.op == "Softmax":
            continue  # a linear layer's outputs are the weights' axis: a classifier head, a router
        frontier.extend((i, hops + 1) for i in value_operands(n) if isinstance(i, gs.Variable))
    return False


def _to_product(view, t: gs.Tensor) -> bool:
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
                if other is not x and act(other):
                    return True
                continue
            frontier.extend((o, hops + 1) for o in c.outputs)
    return False
