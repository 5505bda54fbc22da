"""Boolean masks: Where(cond, logits, fill) or Where(cond, fill, logits) with a -inf-like fill.

With a -inf fill M is the condition (True = may attend), or, once M is a float bias, Where(cond, M, fill).
A finite fill (HF's finfo.min, -1e4) *replaces* masked logits, so a row masked everywhere is uniform
(the mean of V); a boolean attn_mask gives 0 there (ONNX Runtime zeroes fully masked rows, and treats
only -inf and the dtype's lowest value as masked). Such a Where lowers to an additive bias far below any
logit instead: masked logits vanish as before, and a fully masked row stays uniform, as in the model."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ...site import MaskKind, MaskStep
from ..errors import MASKED_FILL, Unsupported
from .base import LogitOp, offset_after, scalar
from .chain import reaches_matmul


def replacing_fill(dtype) -> float:
    """A bias that swamps any logit yet is not the dtype's lowest value (which means -inf to ONNX Runtime)."""
    dtype = np.dtype(dtype)
    lowest = float(ml_dtypes.finfo(dtype).min)  # np.finfo knows no bf16
    return lowest / 1024 if dtype.itemsize >= 4 else lowest / 2


class Where(LogitOp):
    kind = "where"
    onnx_ops: tuple[str, ...] = ("Where",)  # the base's type: subclasses read none
    masks = True
    boolean = True
    implicit_ok = True

    def read(self, view, node):
        cond, a, b = node.inputs
        if reaches_matmul(view, a) and scalar(view, b) is not None:
            keep, fill, kind = a, scalar(view, b), "where"
        elif reaches_matmul(view, b) and scalar(view, a) is not None:
            keep, fill, kind = b, scalar(view, a), "where_not"
        else:
            raise Unsupported(f"Where {node.name} selects between two computed tensors")
        return MaskStep(kind, operand=cond.name, value=fill, node=node.name), keep

    def check(self, steps, i, units):
        """A fill that is not far below any logit masks only with an offset after it (TF's SelectV2 then
        `+ (1 - m) * -1e9`, mul_mask.py); alone, it replaces logits without masking them."""
        if steps[i].value > MASKED_FILL and not offset_after(steps, i, units):
            raise Unsupported(f"Where {steps[i].node} fills masked logits with {steps[i].value}, not a large "
                              "negative value")

    def condition(self, b, step):
        return b.operand(step, cast=False)

    def lower(self, b, step):
        c = self.condition(b, step)
        if np.isfinite(step.value):
            fill = b.emit.const(replacing_fill(b.dtype), b.dtype)
            b.to_float()
            base = b.m if b.m is not None else b.emit.const(0.0, b.dtype)
            b.m, b.kind = b.emit("Where", [c, base, fill], dtype=b.dtype, name="masked_fill"), MaskKind.ADDITIVE
            return
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
        return b.emit("Not", [b.operand(step, cast=False)], dtype=np.bool_)
