"""The scaled-dot-product core: MatMul(Q, K^T) -> logit ops -> Softmax -> MatMul(P, V).

Anchored on each Softmax. Upstream, the logits may pass through scale (Mul/Div by a scalar),
masks and biases (Add, Sub, Where with a -inf-like fill), Reshape (Swin adds its shifted-window
mask in a 5-D view), Cast and Identity. Downstream, the probabilities may pass through Cast,
Identity, Dropout and torch's NaN guard (Where(IsNaN(p), 0, p)) before the MatMul with V.

A Softmax without that skeleton is not attention (a classifier head, a softmax feeding a
reduction or a graph output) and is never matched.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..site import MaskStep
from .graph import PASSTHROUGH, GraphView

# A Where fill at or below this masks a logit out (finfo(float16).min is -65504).
MASKED_FILL = -1.0e4


class NotAttention(Exception):
    """This Softmax is not an attention softmax."""


class Unsupported(Exception):
    """This Softmax is an attention softmax but something around it cannot be fused."""


@dataclass
class Core:
    softmax: gs.Node
    bmm1: gs.Node
    bmm2: gs.Node
    steps: list[MaskStep]  # in graph order, from BMM1 to the Softmax
    probs_nodes: list[gs.Node]  # pass-through nodes between Softmax and BMM2
    logits_cast: int | None = None  # a float Cast on the logits (softmax computed in another precision)


def softmax_axis_is_last(view: GraphView, sm: gs.Node) -> bool:
    rank = view.rank(sm.inputs[0])
    axis = sm.attrs.get("axis", -1 if view.opset >= 13 else 1)
    if rank is None:
        return axis == -1
    if view.opset < 13:
        # before opset 13 Softmax flattens from `axis`: equivalent only when axis is the last dim
        return axis in (-1, rank - 1)
    return axis % rank == rank - 1


def find_core(view: GraphView, sm: gs.Node) -> Core:
    bmm2, probs_nodes = _follow_probabilities(view, sm)
    bmm1, steps, cast = _walk_logits(view, sm.inputs[0])
    if not softmax_axis_is_last(view, sm):
        raise Unsupported(f"Softmax {sm.name} normalises over axis {sm.attrs.get('axis')}, not the key axis")
    return Core(sm, bmm1, bmm2, steps, probs_nodes, cast)


# ---------------------------------------------------------------- downstream
def _is_nan_guard(view: GraphView, where: gs.Node, t: gs.Tensor) -> bool:
    """Where(IsNaN(t), 0, t): torch's guard for fully masked rows."""
    if where.op != "Where" or len(where.inputs) != 3 or where.inputs[2] is not t:
        return False
    cond = view.producer(where.inputs[0])
    fill = view.scalar(where.inputs[1])
    return cond is not None and cond.op == "IsNaN" and cond.inputs[0] is t and fill == 0.0


def _follow_probabilities(view: GraphView, sm: gs.Node):
    t = sm.outputs[0]
    passed: list[gs.Node] = []
    for _ in range(8):
        if t.name in view.outputs:
            raise NotAttention(f"the probabilities {t.name} are a graph output")
        consumers = view.consumers(t)
        guards = [c for c in consumers if c.op == "IsNaN"]
        main = [c for c in consumers if c.op != "IsNaN"]
        if len(main) != 1:
            ops = ", ".join(sorted({c.op for c in main})) or "nothing"
            raise NotAttention(f"the probabilities feed {len(main)} nodes ({ops})")
        c = main[0]
        for g in guards:  # an IsNaN is allowed only as the condition of the guard below
            if [x for x in g.outputs[0].outputs if x is not c] or not _is_nan_guard(view, c, t):
                raise NotAttention(f"the probabilities feed IsNaN {g.name} outside a NaN guard")
        if c.op in PASSTHROUGH or view.is_float_cast(c) or _is_nan_guard(view, c, t):
            passed.append(c)
            t = c.outputs[0]
            continue
        if c.op == "MatMul" and c.inputs[0] is t:
            return c, passed
        raise NotAttention(f"the probabilities feed {c.op} {c.name}, not a MatMul with V")
    raise NotAttention("the probabilities pass through too many nodes")


# ---------------------------------------------------------------- upstream
_CHAIN_OPS = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape"} | PASSTHROUGH


def _reaches_matmul(view: GraphView, t: gs.Tensor, budget: int = 12) -> bool:
    """Does `t` come from a MatMul of two computed tensors through logit ops only?"""
    n = view.producer(t)
    if n is None or budget == 0:
        return False
    if n.op == "MatMul":
        return all(view.const(i) is None for i in n.inputs)
    if n.op not in _CHAIN_OPS:
        return False
    return any(_reaches_matmul(view, i, budget - 1) for i in n.inputs[:3] if isinstance(i, gs.Variable))


def _walk_logits(view: GraphView, t: gs.Tensor):
    steps: list[MaskStep] = []
    cast = None
    for _ in range(24):
        n = view.producer(t)
        if n is None:
            raise NotAttention(f"the Softmax input {t.name} does not come from a MatMul")
        if n.op == "MatMul":
            if any(view.const(i) is not None for i in n.inputs):
                raise NotAttention(f"the logits come from MatMul {n.name} with a constant (a linear layer)")
            steps.reverse()
            return n, steps, cast
        if n.op in PASSTHROUGH or view.is_noop_cast(n):
            t = n.inputs[0]
        elif view.is_float_cast(n):
            cast = cast if cast is not None else n.attrs["to"]  # the one nearest the Softmax
            t = n.inputs[0]
        elif n.op in ("Mul", "Div"):
            chain, other = _split(view, n)
            value = view.scalar(other)
            if value is None:
                raise Unsupported(f"{n.op} {n.name} multiplies the logits by a tensor, not a scalar")
            if n.op == "Div":
                if chain != 0:
                    raise Unsupported(f"Div {n.name} divides by the logits")
                value = 1.0 / value
            steps.append(MaskStep("scale", value=value, node=n.name))
            t = n.inputs[chain]
        elif n.op == "Add":
            chain, other = _split(view, n)
            steps.append(MaskStep("add", operand=other.name, node=n.name))
            t = n.inputs[chain]
        elif n.op == "Sub":
            if not _reaches_matmul(view, n.inputs[0]):
                raise Unsupported(f"Sub {n.name} subtracts the logits from a tensor")
            steps.append(MaskStep("sub", operand=n.inputs[1].name, node=n.name))
            t = n.inputs[0]
        elif n.op == "Where":
            cond, a, b = n.inputs
            if _reaches_matmul(view, a) and view.scalar(b) is not None:
                keep, fill, op = a, view.scalar(b), "where"
            elif _reaches_matmul(view, b) and view.scalar(a) is not None:
                keep, fill, op = b, view.scalar(a), "where_not"
            else:
                raise Unsupported(f"Where {n.name} selects between two computed tensors")
            if fill > MASKED_FILL:
                raise Unsupported(f"Where {n.name} fills masked logits with {fill}, not a large negative value")
            steps.append(MaskStep(op, operand=cond.name, value=fill, node=n.name))
            t = keep
        elif n.op == "Reshape":
            steps.append(MaskStep("reshape", operand=n.inputs[1].name, node=n.name))
            t = n.inputs[0]
        else:
            if n.op == "Tanh" or n.op == "Softcap":
                raise Unsupported(f"logit soft-capping ({n.op} {n.name}) is not supported yet")
            raise NotAttention(f"the logits come from {n.op} {n.name}")
    raise NotAttention("too many ops between the MatMul and the Softmax")


def _split(view: GraphView, n: gs.Node):
    """(index of the logits operand, the other operand) of a binary op on the chain."""
    a, b = n.inputs[0], n.inputs[1]
    ra, rb = _reaches_matmul(view, a), _reaches_matmul(view, b)
    if ra and not rb:
        return 0, b
    if rb and not ra:
        return 1, a
    if ra and rb:
        raise Unsupported(f"{n.op} {n.name} combines two MatMul results")
    raise NotAttention(f"{n.op} {n.name} is not on a path from a MatMul")
