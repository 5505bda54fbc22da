"""The interface of a logit-op unit, and the builder its lowering writes into.

Between the first MatMul and the Softmax the logits pass through ops that scale, mask, bias or
reshape them. Each kind is one unit (a LogitOp subclass in its own module) that says
- how it is matched: `read(view, node)` turns an ONNX node on the chain into a MaskStep and names the
  input that carries the logits on (None: not this unit's node); `check(steps, i, units)` rejects an order
  the lowering cannot express;
- what it is: `scales` (multiplies the logits), `masks` (contributes to the mask/bias M), `boolean`,
  `layout` (changes the logits' layout), `implicit_ok` (TensorRT's implicit fusion accepts it as the one
  masking op between BMM1 and the Softmax), `probe_ok` (the probe can build M through it);
- how it lowers: `lower(builder, step)` adds its part of M (logits = scale * Q.K^T + M) as graph nodes,
  which feeds the ONNX Attention's attn_mask, TensorRT's IAttention mask, and the normalised form;
- `iattention_why`: None when IAttention can express it, else the reason (a soft-cap, say).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_graphsurgeon as gs

from ...graph.emit import Emitter
from ...graph.measure import scalar_value
from ...site import MaskKind, MaskStep


def scalar(view, t: gs.Tensor) -> float | None:
    """A scalar constant, also through a DequantizeLinear of a quantized constant or of a QuantizeLinear of
    one (a statically quantized model quantizes its constants too): the value the model computes with. A scalar
    of the shape arithmetic folding could not follow is evaluated (graph/measure.value)."""
    v = scalar_value(view, t)
    if v is not None:
        return v
    dq = view.producer(t)
    if dq is None or dq.op != "DequantizeLinear":
        return None
    s_dq = view.scalar(dq.inputs[1])
    zero = view.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    zp = int(zero.reshape(-1)[0]) if zero is not None and zero.size == 1 else 0
    stored = view.const(dq.inputs[0])
    if s_dq is not None and stored is not None and stored.size == 1:
        return float((int(stored.reshape(())) - zp) * s_dq)
    q = view.producer(dq.inputs[0])
    if q is None or q.op != "QuantizeLinear" or s_dq is None:
        return None
    x, s_q = view.scalar(q.inputs[0]), view.scalar(q.inputs[1])
    if x is None or s_q is None or s_q == 0:
        return None
    info = np.iinfo(zero.dtype) if zero is not None and zero.dtype.kind in "iu" else np.iinfo(np.uint8)
    quantized = min(max(int(np.rint(x / s_q)) + zp, info.min), info.max)
    return float((quantized - zp) * s_dq)


def offset_after(steps, i: int, units) -> bool:
    """An additive step (Add / Sub of a tensor) after steps[i]: what masks the logits a step set to a value
    that is not far below the others (mul_mask.py, a finite-fill Where)."""
    return any(u.kind in ("add", "sub") for u in units[i + 1:])


class MaskBuilder:
    """M under construction: a tensor (or None) and its kind; `shape` is the logits' shape at the
    current step where a layout op needs it."""

    def __init__(self, graph: gs.Graph, tensors: dict, prefix: str, dtype, shape: gs.Tensor | None = None):
        self.emit = Emitter(graph, prefix)
        self.tensors = tensors
        self.dtype = np.dtype(dtype) if dtype is not None else np.dtype(np.float32)
        self.m: gs.Tensor | None = None
        self.kind = MaskKind.NONE
        self.shape = shape
        self.softcap: float | None = None  # set by a soft-cap step: the Attention's softcap attribute
        self.sink: gs.Tensor | None = None  # set by a sink step: the logit of one extra key with zero K and V
        self.convert = None  # (tensor, step) -> the tensor in the attention's score frame (fuse sets it)
        self.q_scales: list[gs.Tensor] = []  # per-head factors for Q, in the score frame (scale.HeadScale)

    def to_float(self, fill: float | None = None) -> None:
        """A boolean M becomes additive: 0 where allowed, `fill` elsewhere (None: the dtype's lowest value)."""
        if self.kind == MaskKind.BOOLEAN:
            e = self.emit
            fill = float(ml_dtypes.finfo(self.dtype).min) if fill is None else fill  # np.finfo knows no bf16
            self.m = e("Where", [self.m, e.const(0.0, self.dtype), e.const(fill, self.dtype)],
                       dtype=self.dtype, name="bool_to_bias")
            self.kind = MaskKind.ADDITIVE

    def operand(self, step: MaskStep, cast: bool = True) -> gs.Tensor:
        t = self.tensors[step.operand]
        if self.convert is not None:
            t = self.convert(t, step)
        return self.emit.cast(t, self.dtype) if cast and t.dtype is not None else t


class LogitOp:
    kind = ""  # the MaskStep.op this unit reads and lowers
    onnx_ops: tuple[str, ...] = ()  # node types `read` is asked about
    scales = False
    masks = False
    boolean = False
    layout = False
    implicit_ok = False
    probe_ok = True
    iattention_why: str | None = None

    def read(self, view, node: gs.Node) -> tuple[MaskStep, gs.Tensor] | None:
        """(the step, the input carrying the logits on) if this unit takes `node`, else None."""
        raise NotImplementedError

    def check(self, steps: list[MaskStep], i: int, units: list[LogitOp]) -> None:
        """Raise Unsupported if steps[i] cannot stand where it is among the others (their units: `units`);
        by default a step may stand anywhere."""

    def lower(self, b: MaskBuilder, step: MaskStep) -> None:
        raise NotImplementedError
