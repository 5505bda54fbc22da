"""Logit transforms between the first MatMul and the Softmax, one unit per kind (see base.py).

    step, logits = read(view, node)        # the unit that takes this node, or None
    unit(step).masks / .scales / ...       # what a step is, asked of its unit
    m, kind = materialize(graph, tensors, steps, prefix, dtype)   # M as graph nodes

Adding a kind is one module with a LogitOp subclass, registered in UNITS below, and its test.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...site import MaskKind, MaskStep
from .base import LogitOp, MaskBuilder
from .bias import Add, Sub
from .boolean import Where, WhereNot
from .mul_mask import MulMask
from .probs_mask import ProbsMul, ProbsWhere, ProbsWhereNot, masked_rows, read_probabilities, renormalisation
from .reshape import Reshape
from .scale import HeadScale, Scale
from .sink import Sink
from .softcap import Softcap

# in the order `read` tries them on a node type (the soft-cap's outer Mul, then a product with a mask
# from the input, before a plain or per-head scale)
UNITS: dict[str, LogitOp] = {u.kind: u for u in (Softcap(), MulMask(), Scale(), HeadScale(), Add(), Sub(), Where(),
                                                  WhereNot(), Reshape(), ProbsMul(), ProbsWhere(), ProbsWhereNot(),
                                                  Sink())}
_BY_ONNX_OP: dict[str, list[LogitOp]] = {}
for _u in UNITS.values():
    for _op in _u.onnx_ops:
        _BY_ONNX_OP.setdefault(_op, []).append(_u)


def unit(step: MaskStep) -> LogitOp:
    try:
        return UNITS[step.op]
    except KeyError:
        raise ValueError(f"unknown logit op {step.op}") from None


def read(view, node: gs.Node) -> tuple[MaskStep, gs.Tensor] | None:
    """The step for a node on the logits chain, and the tensor the chain continues from; None when no
    unit reads this node type."""
    for u in _BY_ONNX_OP.get(node.op, ()):
        found = u.read(view, node)
        if found is not None:
            return found
    return None


def check(steps) -> None:
    """Each unit's say on where its steps stand (a soft-cap after a mask cannot be lowered)."""
    steps = list(steps)
    units = [unit(s) for s in steps]
    for i, u in enumerate(units):
        u.check(steps, i, units)


def softcap(steps) -> float | None:
    caps = [s.value for s in steps if s.op == "softcap"]
    return caps[-1] if caps else None


def masking(steps) -> list[MaskStep]:
    return [s for s in steps if unit(s).masks or unit(s).layout]


def kind_of(steps) -> MaskKind:
    effective = masking(steps)
    if not effective:
        return MaskKind.NONE
    if all(unit(s).boolean for s in effective):
        return MaskKind.BOOLEAN
    return MaskKind.ADDITIVE


def logit_scale(steps) -> float:
    scale = 1.0
    for s in steps:
        if unit(s).scales:
            scale *= s.value
    return scale


def has_layout_change(steps) -> bool:
    return any(unit(s).layout for s in steps)


def fill_value(steps) -> float | None:
    """The value a boolean step writes into masked logits (the last one's), if any."""
    fills = [s.value for s in steps if unit(s).boolean]
    return fills[-1] if fills else None


def materialize(graph: gs.Graph, tensors: dict, steps, prefix: str, dtype, score_shape: gs.Tensor | None = None):
    """Build M (logits = scale * Q.K^T + M) from the steps. Returns (tensor or None, MaskKind)."""
    b = MaskBuilder(graph, tensors, prefix, dtype, score_shape)
    for step in steps:
        unit(step).lower(b, step)
    if b.softcap is not None:  # M alone cannot carry it: the caller would drop the tanh
        raise ValueError(f"the logits are soft-capped (cap {b.softcap:g}): that is not a mask")
    if b.q_scales:  # M alone cannot carry it either: it scales the logits per head
        raise ValueError("the logits are scaled per head: that is not a mask (it goes on Q)")
    return b.m, b.kind


def build(graph: gs.Graph, tensors: dict, steps, prefix: str, dtype, convert):
    """M in the attention's score frame, each operand brought there by `convert(tensor, step)`; layout
    steps are the frames' business. Returns the builder: .m, .kind, .softcap."""
    b = MaskBuilder(graph, tensors, prefix, dtype)
    b.convert = convert
    for step in steps:
        if not unit(step).layout:
            unit(step).lower(b, step)
    if b.kind == MaskKind.ADDITIVE and any(s.op in ("add", "sub") for s in steps):
        b.m = _finite_floor(b)
    return b


def _finite_floor(b: MaskBuilder) -> gs.Tensor:
    """A bias that masks with the dtype's lowest value: a row it masks everywhere is uniform in the model
    (every logit equal), while ONNX Runtime's Attention reads the lowest value as -inf and zeroes such a
    row. Finite values below the replacing fill go up to it (nothing else changes: those logits vanish as
    before); -inf stays -inf (a fully masked row is then 0, as under torch's NaN guard)."""
    from .boolean import replacing_fill

    e, m = b.emit, b.m
    floor = e("Max", [m, e.const(replacing_fill(b.dtype), b.dtype)], dtype=b.dtype, name="mask_floor")
    return e("Where", [e("IsInf", [m], {"detect_positive": 0}, dtype=np.bool_), m, floor], dtype=b.dtype,
             name="keep_minus_inf")


__all__ = ["LogitOp", "MaskBuilder", "UNITS", "unit", "read", "check", "masking", "kind_of", "logit_scale",
           "has_layout_change", "fill_value", "softcap", "materialize", "build", "read_probabilities",
           "renormalisation", "masked_rows"]
