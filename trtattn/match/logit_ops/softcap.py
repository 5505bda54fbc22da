"""Soft-capping: cap * tanh(logits / cap) (Gemma 2's attn_logit_softcapping), written Mul(Tanh(Div(x, cap)),
cap) or with Mul by 1/cap. Lowers to ONNX Attention's `softcap` attribute, which applies it after the
scale and before the mask: a site that masks or biases before the cap, or scales after it, is not that."""

from __future__ import annotations

from ...site import MaskStep
from ..errors import Unsupported
from .base import LogitOp, scalar

_TOL = 1e-5


class Softcap(LogitOp):
    kind = "softcap"
    onnx_ops = ("Mul",)  # the outer Mul by the cap; tried before Scale
    iattention_why = "IAttention has no logit soft-cap"

    def read(self, view, node):
        for tanh_at in (0, 1):
            cap = scalar(view, node.inputs[1 - tanh_at])
            inner = view.producer(node.inputs[tanh_at])
            if cap is None or cap <= 0 or inner is None or inner.op != "Tanh":
                continue
            div = view.producer(inner.inputs[0])
            if div is None or div.op not in ("Div", "Mul"):
                continue
            for x_at in (0, 1) if div.op == "Mul" else (0,):
                s = scalar(view, div.inputs[1 - x_at])
                if s is None or s == 0:
                    continue
                inv = 1.0 / s if div.op == "Div" else s
                if abs(inv * cap - 1.0) < _TOL:
                    return MaskStep(self.kind, value=float(cap), node=node.name), div.inputs[x_at]
            raise Unsupported(f"Tanh {inner.name} on the logits is not a soft-cap: it divides by another value "
                              f"than the {cap:g} it multiplies by")
        return None

    def check(self, steps, i, units):
        if any(u.masks or u.layout for u in units[:i]):
            raise Unsupported(f"the soft-cap at {steps[i].node} comes after a mask or bias (Attention caps first)")
        if any(u.scales or u.kind == self.kind for u in units[i + 1:]):
            raise Unsupported(f"the logits are scaled again after the soft-cap at {steps[i].node}")

    def lower(self, b, step):
        b.softcap = step.value
