"""A Reshape of the logits (Swin adds its shifted-window mask in a 5-D view): M is expanded to the
logits' shape first, then reshaped with them."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...site import MaskKind, MaskStep
from .base import LogitOp


class Reshape(LogitOp):
    kind = "reshape"
    onnx_ops = ("Reshape",)
    layout = True
    probe_ok = False

    def read(self, view, node):
        return MaskStep(self.kind, operand=node.inputs[1].name, node=node.name), node.inputs[0]

    def lower(self, b, step):
        if b.shape is None:
            raise ValueError("a Reshape on the logits needs the logits' shape")
        e = b.emit
        dtype = np.bool_ if b.kind == MaskKind.BOOLEAN else b.dtype
        if b.m is None:
            b.m = e("ConstantOfShape", [b.shape], {"value": gs.Constant("zero", np.zeros(1, b.dtype))}, dtype=b.dtype)
            b.kind, dtype = MaskKind.ADDITIVE, b.dtype
        else:
            b.m = e("Expand", [b.m, b.shape], dtype=dtype)
        b.m = e("Reshape", [b.m, b.tensors[step.operand]], dtype=dtype)
        b.shape = e("Shape", [b.m], dtype=np.int64)
