"""q_prescale: the softmax scale goes onto Q right before the first MatMul.

TensorRT wants Q (or K) multiplied by the scale before BMM1 (or both by its square root) for
numerical stability; exporters write Div or Mul after BMM1, sqrt on Q and K, or nothing. The new
first MatMul is MatMul(Mul(Q, scale), K^T) with every other scale removed. With
fold_weights=True the scale goes into Q's projection weights and bias instead (no Mul at all),
when Q comes straight from a linear layer whose weights no one else reads.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph.emit import Emitter, float_dtype
from ...match.heads import SHAPE_OPS
from ...site import AttentionSite
from ...site_names import site_scope


def prescaled_logits(graph: gs.Graph, tensors: dict, site: AttentionSite, *, fold_weights: bool = False) -> tuple[gs.Tensor, str]:
    """Emit MatMul(Q * s, K^T) for `site`. Returns (logits tensor, where the scale went)."""
    emit = Emitter(graph, site_scope(site.name, "prescale"))
    q = tensors[site.query]
    kt = tensors[site.key_transposed]
    scale = site.scale / site.key_transposed_scale  # K^T may keep a factor applied before its Transpose
    dtype = float_dtype(site.dtype)
    placement = "none"
    if abs(scale - 1.0) > 1e-12:
        if fold_weights and fold_into_projection(graph, q, scale):
            placement = "q_weights"
        else:
            q = emit("Mul", [q, emit.const(scale, dtype)], dtype=dtype, name="q_scale")
            placement = "q"
    logits = emit("MatMul", [q, kt], dtype=dtype, name="qk")
    return logits, placement


def fold_into_projection(graph: gs.Graph, q: gs.Tensor, scale: float) -> bool:
    """Scale the weights (and bias) of the linear layer Q is reshaped from. False if Q does not
    come straight from one, or if its weights are shared (a fused QKV projection, tied weights)."""
    t = q
    for _ in range(8):
        n = t.inputs[0] if t.inputs else None
        if n is None:
            return False
        if n.op in SHAPE_OPS:
            if len(t.outputs) > 1:
                return False  # someone else reads the unscaled Q
            t = n.inputs[0]
            continue
        break
    else:
        return False
    if len(t.outputs) > 1:
        return False
    bias = None
    if n.op == "Add":
        consts = [i for i in n.inputs if isinstance(i, gs.Constant)]
        datas = [i for i in n.inputs if not isinstance(i, gs.Constant)]
        if len(consts) != 1 or len(datas) != 1 or not datas[0].inputs or datas[0].inputs[0].op != "MatMul":
            return False
        bias, n = consts[0], datas[0].inputs[0]
        if len(datas[0].outputs) > 1:
            return False
    if n.op != "MatMul" or not isinstance(n.inputs[1], gs.Constant):
        return False
    weight = n.inputs[1]
    if len(weight.outputs) > 1 or (bias is not None and len(bias.outputs) > 1):
        return False
    weight.values = (np.asarray(weight.values) * scale).astype(weight.values.dtype)
    if bias is not None:
        bias.values = (np.asarray(bias.values) * scale).astype(bias.values.dtype)
    return True
