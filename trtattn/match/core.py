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

from ..graph.view import PASSTHROUGH, GraphView
from ..site import MaskStep
from . import logit_ops
from .errors import NotAttention, Unsupported


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
            continue
        if view.is_float_cast(n):
            cast = cast if cast is not None else n.attrs["to"]  # the one nearest the Softmax
            t = n.inputs[0]
            continue
        found = logit_ops.read(view, n)
        if found is None:
            if n.op == "Tanh" or n.op == "Softcap":
                raise Unsupported(f"logit soft-capping ({n.op} {n.name}) is not supported yet")
            raise NotAttention(f"the logits come from {n.op} {n.name}")
        step, t = found
        steps.append(step)
    raise NotAttention("too many ops between the MatMul and the Softmax")
