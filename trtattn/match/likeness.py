"""Which softmaxes are attention-like, whatever sits around them (the never-silent rule).

A Softmax is attention-like when its input comes from a product (MatMul or Einsum) of two activations
and its output reaches a product with a third activation, through any ops but other products. Such a
Softmax that the matcher cannot fuse is listed as not fused, with why; any other Softmax (a classifier
head, a router, a softmax-weighted pooling) is ignored.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from .contraction import PRODUCTS, activations, attention_product

UP_HOPS, DOWN_HOPS = 48, 32  # Longformer's sliding chunks put ~30 ops between product and Softmax


def attention_like(view, sm: gs.Node) -> bool:
    return attention_like_between(view, sm.inputs[0], sm.outputs[0])


def attention_like_between(view, logits: gs.Tensor, probs: gs.Tensor) -> bool:
    """The same question for a normalisation written without a Softmax op (canonical.py: unproven)."""
    return _from_product(view, logits) and _to_product(view, probs)


def _from_product(view, t: gs.Tensor) -> bool:
    frontier, seen = [(t, 0)], set()
    while frontier:
        x, hops = frontier.pop()
        n = view.producer(x)
        if n is None or id(n) in seen or hops > UP_HOPS:
            continue
        seen.add(id(n))
        if n.op in PRODUCTS:
            if attention_product(view, n):
                return True
            continue
        if n.op in ("Softmax", "Shape", "Size"):
            continue
        frontier.extend((i, hops + 1) for i in n.inputs if isinstance(i, gs.Variable))
    return False


def _to_product(view, t: gs.Tensor) -> bool:
    act = activations(view)
    frontier, seen = [(t, 0)], set()
    while frontier:
        x, hops = frontier.pop()
        if hops > DOWN_HOPS:
            continue
        for c in view.consumers(x):
            if id(c) in seen or c.op in ("Shape", "Size"):
                continue
            seen.add(id(c))
            if c.op in PRODUCTS and len(c.inputs) == 2:
                other = c.inputs[1] if c.inputs[0] is x else c.inputs[0]
                if other is not x and act(other):
                    return True
                continue
            frontier.extend((o, hops + 1) for o in c.outputs)
    return False
