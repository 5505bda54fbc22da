"""A mask re-applied to the probabilities after the softmax (issue 18, class 12): P * mask01 (Keras 3, flax
zero fully masked rows), Where(cond, P, 0) or Where(cond, 0, P) (DeBERTa's XSoftmax masked_fill).

Such a step zeroes the probabilities where the mask is 0 without renormalising. Where the logits are
already masked there (the usual case: the same mask applied before the softmax) nothing changes, except
that a row masked everywhere becomes 0. Both are what a boolean mask with a -inf fill computes in the
fused op (ONNX Runtime's Attention and IAttention give 0 for a fully masked row), so the step lowers as
one: allowed = mask != 0. Where the mask zeroes probabilities the logits did not mask, the fused op
renormalises and the verification against the original fails and says so: never a silent change.
"""

from __future__ import annotations

import numpy as np
import onnx

from ...site import MaskStep
from .base import scalar
from .boolean import Where


class ProbsMul(Where):
    """P * m: allowed where m is not 0."""

    kind = "probs_mul"
    onnx_ops = ()  # read on the probabilities (read_probabilities below), not on the logits chain
    implicit_ok = False

    def condition(self, b, step):
        return b.emit("Cast", [b.operand(step, cast=False)], {"to": onnx.TensorProto.BOOL}, dtype=np.bool_)


class ProbsWhere(Where):
    """Where(cond, P, 0): allowed where cond."""

    kind = "probs_where"
    onnx_ops = ()
    implicit_ok = False


class ProbsWhereNot(Where):
    """Where(cond, 0, P): cond is True where the probability is zeroed."""

    kind = "probs_where_not"
    onnx_ops = ()
    implicit_ok = False

    def condition(self, b, step):
        return b.emit("Not", [b.operand(step, cast=False)], dtype=np.bool_)


def read_probabilities(view, node, probs) -> MaskStep | None:
    """The step for `node` reading the probabilities `probs` if it re-applies a mask, else None."""
    minus_inf = float("-inf")
    if node.op == "Mul" and len(node.inputs) == 2 and sum(i is probs for i in node.inputs) == 1:
        other = node.inputs[1] if node.inputs[0] is probs else node.inputs[0]
        if scalar(view, other) is None:
            return MaskStep(ProbsMul.kind, operand=other.name, value=minus_inf, node=node.name)
    if node.op == "Where" and len(node.inputs) == 3:
        cond, a, b = node.inputs
        if a is probs and b is not probs and scalar(view, b) == 0.0:
            return MaskStep(ProbsWhere.kind, operand=cond.name, value=minus_inf, node=node.name)
        if b is probs and a is not probs and scalar(view, a) == 0.0:
            return MaskStep(ProbsWhereNot.kind, operand=cond.name, value=minus_inf, node=node.name)
    return None
