"""Attention sinks (issue 18, class 9; gpt-oss): a learned per-head logit column concatenated to the logits
before the softmax, and its probability column sliced off after.

That is attention over one extra key whose K and V are zero and whose logit is the sink: the fused op reads
K and V with a zero row appended and the mask with the sink column appended (rewrite/fuse.py), which both
the ONNX Attention op and IAttention's mask express. The step is read on the Concat; core.py checks that
the probabilities lose exactly that column before the product with V.
"""

from __future__ import annotations

from ...site import MaskStep
from ..errors import Unsupported
from .base import LogitOp
from .chain import reaches_matmul


class Sink(LogitOp):
    kind = "sink"
    onnx_ops = ("Concat",)
    implicit_ok = False
    iattention_why = None  # written as an extra key and a mask column: IAttention takes the fused op as it is

    def read(self, view, node):
        if len(node.inputs) != 2:
            return None
        rank = view.rank(node.outputs[0]) or view.rank(node.inputs[0])
        axis = int(node.attrs.get("axis", 0))
        if rank is None or axis % rank != rank - 1:
            return None  # not along the key axis (the last one: the softmax's)
        first, second = (reaches_matmul(view, t) for t in node.inputs)
        if first == second:
            return None
        chain = 0 if first else 1
        # value: where the sink column stands, 1 = after the keys, 0 = before
        return MaskStep(self.kind, operand=node.inputs[1 - chain].name, value=float(1 - chain), node=node.name), \
            node.inputs[chain]

    def check(self, steps, i, units):
        if i != len(steps) - 1 or any(s.op == self.kind for s in steps[:i]):
            raise Unsupported(f"the logits change after the sink column of {steps[i].node} is concatenated")

    def lower(self, b, step):
        b.sink = b.operand(step)  # the extra key's logit, in the score frame with a key axis of 1
