"""Scale: Mul or Div of the logits by a scalar (BART's scores * scaling, BERT's / sqrt(d))."""

from __future__ import annotations

from ...site import MaskKind, MaskStep
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
        if value is None:
            raise Unsupported(f"{node.op} {node.name} multiplies the logits by a tensor, not a scalar")
        if node.op == "Div":
            if chain != 0:
                raise Unsupported(f"Div {node.name} divides by the logits")
            value = 1.0 / value
        return MaskStep(self.kind, value=value, node=node.name), node.inputs[chain]

    def lower(self, b, step):
        if b.kind == MaskKind.ADDITIVE:  # (x*a + M)*s = x*(a*s) + M*s
            b.m = b.emit("Mul", [b.m, b.emit.const(step.value, b.dtype)], dtype=b.dtype)
