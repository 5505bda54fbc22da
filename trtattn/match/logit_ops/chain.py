"""Which operand of a binary op on the logits chain carries the logits (shared by the logit-op units).

The logits are the product of two activations (contraction.attention_product), or of an activation and
a learned query when no operand reaches such a product; the chain from it
to the Softmax runs through logit ops and layout ops. An operand that does not reach such a product
is a mask or a bias, even when it is itself a product of an activation with weights (DeBERTa's
content-to-position term).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ...graph.view import PASSTHROUGH, GraphView
from ..contraction import PRODUCTS, attention_product, input_product
from ..errors import NotAttention, Unsupported

CHAIN_OPS = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape", "Tanh", "Transpose", "Flatten", "Squeeze",
             "Unsqueeze", "Expand", "QuantizeLinear", "DequantizeLinear", "Neg"} | PASSTHROUGH


def reaches_matmul(view: GraphView, t: gs.Tensor, budget: int = 24, product=attention_product) -> bool:
    """Does `t` come from a product of two activations (or what `product` accepts) through logit and
    layout ops only?"""
    stack, seen = [(t, budget)], set()
    while stack:
        x, b = stack.pop()
        n = view.producer(x)
        if n is None or b == 0 or id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in PRODUCTS:
            if product(view, n):
                return True
            continue
        if n.op in CHAIN_OPS:
            data = n.inputs[:1] if n.op in ("Reshape", "Expand", "Squeeze", "Unsqueeze") else n.inputs[:3]
            stack.extend((i, b - 1) for i in data if isinstance(i, gs.Variable))
    return False


def split(view: GraphView, n: gs.Node):
    """(index of the logits operand, the other operand) of a binary op on the chain."""
    a, b = n.inputs[0], n.inputs[1]
    ra, rb = reaches_matmul(view, a), reaches_matmul(view, b)
    if not ra and not rb:  # a learned query: the logits are the one side from a product with weights
        ra, rb = (reaches_matmul(view, x, product=input_product) for x in (a, b))
    if ra and not rb:
        return 0, b
    if rb and not ra:
        return 1, a
    if ra and rb:
        raise Unsupported(f"{n.op} {n.name} combines two attention products")
    raise NotAttention(f"{n.op} {n.name} is not on a path from a product of activations")
