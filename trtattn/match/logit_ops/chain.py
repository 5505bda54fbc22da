"""Which operand of a binary op on the logits chain carries the logits (shared by the logit-op units)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ...graph.view import PASSTHROUGH, GraphView
from ..errors import NotAttention, Unsupported

CHAIN_OPS = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape"} | PASSTHROUGH


def reaches_matmul(view: GraphView, t: gs.Tensor, budget: int = 12) -> bool:
    """Does `t` come from a MatMul of two computed tensors through logit ops only?"""
    n = view.producer(t)
    if n is None or budget == 0:
        return False
    if n.op == "MatMul":
        return all(view.const(i) is None for i in n.inputs)
    if n.op not in CHAIN_OPS:
        return False
    return any(reaches_matmul(view, i, budget - 1) for i in n.inputs[:3] if isinstance(i, gs.Variable))


def split(view: GraphView, n: gs.Node):
    """(index of the logits operand, the other operand) of a binary op on the chain."""
    a, b = n.inputs[0], n.inputs[1]
    ra, rb = reaches_matmul(view, a), reaches_matmul(view, b)
    if ra and not rb:
        return 0, b
    if rb and not ra:
        return 1, a
    if ra and rb:
        raise Unsupported(f"{n.op} {n.name} combines two MatMul results")
    raise NotAttention(f"{n.op} {n.name} is not on a path from a MatMul")
