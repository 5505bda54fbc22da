"""Masks and biases on the logits.

The matcher records every op between the first MatMul and the Softmax as a MaskStep. Together
they say: logits = scale * Q.K^T + M, where M is built from the steps' operands. `materialize`
builds M as graph nodes (shared by the fuse and normalise back ends):

- Add / Sub of a tensor: M += / -= tensor (relative position bias, ALiBi, additive masks);
- Where(cond, logits, fill) with a -inf-like fill: a boolean mask (True = attend), or
  Where(cond, M, fill) once M is a float tensor;
- Mul / Div by a scalar after a bias: M scales with the logits;
- Reshape of the logits (Swin's 5-D view for the shifted-window mask): M is expanded to the
  logits' shape first, then reshaped with them.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..site import MaskKind, MaskStep


def kind_of(steps: tuple[MaskStep, ...] | list[MaskStep]) -> MaskKind:
    effective = [s for s in steps if s.op != "scale"]
    if not effective:
        return MaskKind.NONE
    if all(s.op in ("where", "where_not") for s in effective):
        return MaskKind.BOOLEAN
    return MaskKind.ADDITIVE


def logit_scale(steps) -> float:
    scale = 1.0
    for s in steps:
        if s.op == "scale":
            scale *= s.value
    return scale


class _Emitter:
    """Adds nodes to a graph with unique, readable names."""

    def __init__(self, graph: gs.Graph, prefix: str):
        self.graph = graph
        self.prefix = prefix
        self.count = 0

    def __call__(self, op: str, inputs: list, attrs: dict | None = None, dtype=None, name: str | None = None) -> gs.Variable:
        self.count += 1
        base = f"{self.prefix}/{name or op}_{self.count}"
        out = gs.Variable(base + "_out", dtype=dtype)
        self.graph.nodes.append(gs.Node(op, base, attrs or {}, inputs=inputs, outputs=[out]))
        return out

    def const(self, value, dtype) -> gs.Constant:
        self.count += 1
        return gs.Constant(f"{self.prefix}/c_{self.count}", np.asarray(value, dtype=dtype))


def _np(dtype) -> np.dtype:
    return np.dtype(dtype) if dtype is not None else np.dtype(np.float32)


def materialize(graph: gs.Graph, tensors: dict[str, gs.Tensor], steps, prefix: str, dtype,
                score_shape: gs.Tensor | None = None):
    """Build M from the steps. Returns (tensor or None, MaskKind)."""
    emit = _Emitter(graph, prefix)
    dt = _np(dtype)
    m, kind = None, MaskKind.NONE
    shape = score_shape  # the logits' shape at the current step (needed only around a Reshape)

    def to_float():
        nonlocal m, kind
        if kind == MaskKind.BOOLEAN:
            m = emit("Where", [m, emit.const(0.0, dt), emit.const(np.finfo(dt).min, dt)], dtype=dt, name="bool_to_bias")
            kind = MaskKind.ADDITIVE

    def operand(step):
        t = tensors[step.operand]
        if step.op in ("add", "sub") and t.dtype is not None and _np(t.dtype) != dt:
            t = emit("Cast", [t], {"to": _onnx_type(dt)}, dtype=dt)
        return t

    for step in steps:
        if step.op == "scale":
            if kind == MaskKind.ADDITIVE:  # (x*a + M)*s = x*(a*s) + M*s
                m = emit("Mul", [m, emit.const(step.value, dt)], dtype=dt)
        elif step.op in ("add", "sub"):
            b = operand(step)
            if m is None:
                m = b if step.op == "add" else emit("Neg", [b], dtype=dt)
            else:
                to_float()
                m = emit("Add" if step.op == "add" else "Sub", [m, b], dtype=dt)
            kind = MaskKind.ADDITIVE
        elif step.op in ("where", "where_not"):
            c = tensors[step.operand]
            if step.op == "where_not":
                c = emit("Not", [c], dtype=np.bool_)
            if m is None:
                m, kind = c, MaskKind.BOOLEAN
            elif kind == MaskKind.BOOLEAN:
                m = emit("And", [m, c], dtype=np.bool_)
            else:
                m = emit("Where", [c, m, emit.const(step.value, dt)], dtype=dt)
        elif step.op == "reshape":
            if shape is None:
                raise ValueError("a Reshape on the logits needs the logits' shape")
            if m is None:
                m = emit("ConstantOfShape", [shape], {"value": gs.Constant("zero", np.zeros(1, dt))}, dtype=dt)
                kind = MaskKind.ADDITIVE
            else:
                m = emit("Expand", [m, shape], dtype=np.bool_ if kind == MaskKind.BOOLEAN else dt)
            m = emit("Reshape", [m, tensors[step.operand]], dtype=np.bool_ if kind == MaskKind.BOOLEAN else dt)
            shape = emit("Shape", [m], dtype=np.int64)
        else:
            raise ValueError(f"unknown mask step {step.op}")
    return m, kind


def shape_slice(emit: _Emitter, t: gs.Tensor, start: int, end: int) -> gs.Tensor:
    """Shape(t)[start:end] as a 1-D int64 tensor."""
    shape = emit("Shape", [t], dtype=np.int64)
    return emit("Slice", [shape, emit.const([start], np.int64), emit.const([end], np.int64)], dtype=np.int64)


def score_shape(emit: _Emitter, q: gs.Tensor, key: gs.Tensor, rank: int, key_seq_axis: int) -> gs.Tensor:
    """Shape of Q . K^T built from the operands' shapes: Q's [..., Sq] and the key's sequence
    length (axis rank-1 of K^T, rank-2 of a BNSH key)."""
    return emit("Concat", [shape_slice(emit, q, 0, rank - 1), shape_slice(emit, key, key_seq_axis, key_seq_axis + 1)],
                {"axis": 0}, dtype=np.int64)


def full_query_rows(emit: _Emitter, mask: gs.Tensor, q: gs.Tensor) -> gs.Tensor:
    """The mask expanded to Q's length on its query axis (Q is [B, N, Sq, H]): ONNX Runtime's
    Attention wants that axis at full length, though the spec allows broadcasting."""
    target = emit("Concat", [emit.const([1, 1], np.int64), shape_slice(emit, q, 2, 3), emit.const([1], np.int64)],
                  {"axis": 0}, dtype=np.int64)
    return emit("Expand", [mask, target], dtype=mask.dtype, name="mask_rows")


def _onnx_type(dt: np.dtype) -> int:
    import onnx

    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt))
