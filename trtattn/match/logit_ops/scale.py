"""Scale: Mul or Div of the logits by a scalar (BART's scores * scaling, BERT's / sqrt(d)), or by a
constant that varies over the heads only (HeadScale: cosine attention's learned temperature, Swin-v2's
exp(clamp(logit_scale)) of shape [heads, 1, 1]).

A scalar computed from shapes and constants (1 / sqrt(Cast(Shape(Q)[-1]))) is the constant it folds to
(GraphView folds a graph's shape arithmetic), and so is a scalar initializer that is also a graph input
(keep_initializers_as_inputs): the matcher takes its default, and the site says so.
"""

from __future__ import annotations

from ...site import MaskKind, MaskStep
from ..contraction import activations
from ..errors import Unsupported
from .base import LogitOp, scalar
from .chain import split


class Scale(LogitOp):
    kind = "scale"
    onnx_ops = ("Mul", "Div")
    scales = True

    def read(self, view, node):
        chain, other = split(view, node)
        value = scalar(view, other)
        if node.op == "Div" and chain != 0:
            raise Unsupported(f"Div {node.name} divides by the logits")
        if value is None:
            head = HeadScale.from_tensor(view, node, other)
            if head is None:
                raise Unsupported(f"{node.op} {node.name} multiplies the logits by a tensor, not a scalar")
            return head, node.inputs[chain]
        if node.op == "Div":
            value = 1.0 / value
        return MaskStep(self.kind, value=value, node=node.name), node.inputs[chain]

    def lower(self, b, step):
        if b.kind == MaskKind.ADDITIVE:  # (x*a + M)*s = x*(a*s) + M*s
            b.m = b.emit("Mul", [b.m, b.emit.const(step.value, b.dtype)], dtype=b.dtype)


class HeadScale(LogitOp):
    """The logits times (value 1) or divided by (value -1) a constant tensor whose last two axes (the query
    and key positions) have size 1; core.py checks by frames that its other axes are batch or heads. It
    is lowered onto Q (Q * s, the fused op's scale unchanged): `lower` scales M and hands s to the builder's
    q_scales for the rewrite to apply; a back end that only takes M (materialize) refuses it."""

    kind = "head_scale"
    onnx_ops = ()  # read through Scale, which takes the node first

    @staticmethod
    def from_tensor(view, node, other) -> MaskStep | None:
        shape = view.shape(other)
        if activations(view)(other) or not shape or any(not isinstance(d, int) for d in shape):
            return None
        if len(shape) < 3 or shape[-1] != 1 or shape[-2] != 1:
            return None
        return MaskStep(HeadScale.kind, operand=other.name, value=-1.0 if node.op == "Div" else 1.0, node=node.name)

    def lower(self, b, step):
        s = b.operand(step)
        if step.value == -1.0:
            s = b.emit("Reciprocal", [s], dtype=b.dtype)
        if b.m is not None:  # (x*a + M)*s = x*(a*s) + M*s
            b.to_float()
            b.m = b.emit("Mul", [b.m, s], dtype=b.dtype)
        b.q_scales.append(s)
