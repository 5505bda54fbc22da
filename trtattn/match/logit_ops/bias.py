"""Additive masks and biases: Add or Sub of a tensor (padding masks as 0 / -inf, relative position
biases, ALiBi). M += tensor, or M -= tensor."""

from __future__ import annotations

from ...site import MaskKind, MaskStep
from ..errors import Unsupported
from .base import LogitOp
from .chain import reaches_matmul, split


class Add(LogitOp):
    kind = "add"
    onnx_ops = ("Add",)
    masks = True
    implicit_ok = True

    def read(self, view, node):
        chain, other = split(view, node)
        return MaskStep(self.kind, operand=other.name, node=node.name), node.inputs[chain]

    def lower(self, b, step):
        t = b.operand(step)
        if b.m is None:
            b.m = t
        else:
            b.to_float()
            b.m = b.emit("Add", [b.m, t], dtype=b.dtype)
        b.kind = MaskKind.ADDITIVE


class Sub(LogitOp):
    kind = "sub"
    onnx_ops = ("Sub",)
    masks = True

    def read(self, view, node):
        if not reaches_matmul(view, node.inputs[0]):
            raise Unsupported(f"Sub {node.name} subtracts the logits from a tensor")
        return MaskStep(self.kind, operand=node.inputs[1].name, node=node.name), node.inputs[0]

    def lower(self, b, step):
        t = b.operand(step)
        if b.m is None:
            b.m = b.emit("Neg", [t], dtype=b.dtype)
        else:
            b.to_float()
            b.m = b.emit("Sub", [b.m, t], dtype=b.dtype)
        b.kind = MaskKind.ADDITIVE
