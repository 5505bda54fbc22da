"""Boolean masks: Where(cond, logits, fill) or Where(cond, fill, logits) with a -inf-like fill.
M is the condition (True = may attend), or, once M is a float bias, Where(cond, M, fill)."""

from __future__ import annotations

import numpy as np

from ...site import MaskKind, MaskStep
from ..errors import MASKED_FILL, Unsupported
from .base import LogitOp
from .chain import reaches_matmul


class Where(LogitOp):
    kind = "where"
    onnx_ops = ("Where",)
    masks = True
    boolean = True
    implicit_ok = True

    def read(self, view, node):
        cond, a, b = node.inputs
        if reaches_matmul(view, a) and view.scalar(b) is not None:
            keep, fill, kind = a, view.scalar(b), "where"
        elif reaches_matmul(view, b) and view.scalar(a) is not None:
            keep, fill, kind = b, view.scalar(a), "where_not"
        else:
            raise Unsupported(f"Where {node.name} selects between two computed tensors")
        if fill > MASKED_FILL:
            raise Unsupported(f"Where {node.name} fills masked logits with {fill}, not a large negative value")
        return MaskStep(kind, operand=cond.name, value=fill, node=node.name), keep

    def condition(self, b, step):
        return b.tensors[step.operand]

    def lower(self, b, step):
        c = self.condition(b, step)
        if b.m is None:
            b.m, b.kind = c, MaskKind.BOOLEAN
        elif b.kind == MaskKind.BOOLEAN:
            b.m = b.emit("And", [b.m, c], dtype=np.bool_)
        else:
            b.m = b.emit("Where", [c, b.m, b.emit.const(step.value, b.dtype)], dtype=b.dtype)


class WhereNot(Where):
    """Where(cond, fill, logits): the condition is True where the logit is masked out."""

    kind = "where_not"
    onnx_ops = ()  # read by Where, which tells the two apart
    implicit_ok = False

    def condition(self, b, step):
        return b.emit("Not", [b.tensors[step.operand]], dtype=np.bool_)
