"""A mask applied by multiplication (issue 18, class 11): logits * mask01, then an offset that pushes the
positions where the mask is 0 far down: `logits * m + (1 - m) * -1e9` (tf2onnx from TF and Keras code,
hand-written paddle attention), or Where(m, logits, 0) + offset (TF's SelectV2).

Where m is 1 the logits pass unchanged; where m is 0 they become 0 + offset, far below any logit: the
same as masking them. The step lowers as a boolean mask (allowed = m != 0) that replaces the masked logits
with a value far below any logit, as a finite-fill Where does (boolean.py), and the offset stays an
additive bias after it. Without an offset after it the product zeroes logits without masking them: that
is refused here. Whether m is 0/1 is decided by the verification, which compares numbers: a mask of other
values fails it and the site is listed with the error.
"""

from __future__ import annotations

import numpy as np
import onnx

from ...graph.dependence import depends_on_input_values
from ...site import MaskStep
from ..errors import Unsupported
from .base import offset_after, scalar
from .boolean import Where
from .chain import split


class MulMask(Where):
    kind = "mul_mask"
    onnx_ops = ("Mul",)
    implicit_ok = False

    def read(self, view, node):
        chain, other = split(view, node)
        if scalar(view, other) is not None or view.const(other) is not None:
            return None  # a scale (scale.py), or a constant tensor (a per-head scale, not a mask)
        shape = view.shape(other)
        if shape is not None and (all(d == 1 for d in shape) or (shape and shape[-1] == 1)):
            # one number computed at run time (1 / sqrt of a shape), or a factor constant along the keys
            # (Swin-v2's per-head exp(logit_scale), [heads, 1, 1]): a scale, since a mask varies over the keys
            return None
        if shape is None and not depends_on_input_values(other, view.inputs, limit=64):
            return None  # nothing says it is a mask: scale.py says what it cannot read
        return MaskStep(self.kind, operand=other.name, value=0.0, node=node.name), node.inputs[chain]

    def check(self, steps, i, units):
        if not offset_after(steps, i, units):
            raise Unsupported(f"Mul {steps[i].node} multiplies the logits by a tensor with no offset after it "
                              "that masks where it is 0")

    def condition(self, b, step):
        return b.emit("Cast", [b.operand(step, cast=False)], {"to": onnx.TensorProto.BOOL}, dtype=np.bool_)
