"""Sites IAttention cannot take, written back in TensorRT's implicit attention form for its own fusion.

A soft-capped attention (Gemma 2: cap * tanh(logits / cap) before the mask) has no IAttention: TensorRT's
ONNX parser rejects Attention's `softcap`, and IAttention has no such step. Such an Attention node becomes
what `trtattn normalize` writes for TensorRT's implicit fusion (Method 2 of its fused-attention guide): the
scale on Q, MatMul(Q, K^T), the soft-cap (pointwise ops the fusion covers), exactly one Add or Where for the
mask, Softmax, MatMul with V; grouped K/V heads repeated as ONNX Attention does ([h0, h0, h1, h1, ...]).
The plan names the site with the reason (trt/plan.py).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ...errors import TrtattnError
from ...graph.emit import Emitter
from ...site import SOFTCAP_WHY, attribute_softcap
from .op_fit import OpShape, guard_empty_rows, one_mask, to_bhnd

REASON = f"{SOFTCAP_WHY}: kept in TensorRT's implicit form (MatMul, Tanh, Softmax, MatMul) for its own fusion"


def softcapped(graph: gs.Graph) -> list[gs.Node]:
    return [n for n in graph.nodes if n.op == "Attention" and attribute_softcap(n.attrs)]


def expand_softcapped(graph: gs.Graph, sites: dict) -> list[tuple[str, str]]:
    """Rewrite every soft-capped Attention node of `graph` (sites: node -> AttentionSite) in place;
    returns (site name, node name) of each."""
    done = []
    for node in softcapped(graph):
        site = sites.get(node.name)
        if site is None or not site.q_heads or not site.kv_heads or not site.head_size:
            raise TrtattnError(f"Attention {node.name} is soft-capped and its heads are unknown: cannot write it out")
        _expand(graph, node, site)
        done.append((site.name, node.name))
    return done


def _expand(graph: gs.Graph, node: gs.Node, site) -> None:
    if len(node.inputs) > 4 and any(t.name for t in node.inputs[4:]) or len(node.outputs) > 1:
        raise TrtattnError(f"Attention {node.name}: a soft-capped attention with a cache, lengths or extra outputs")
    to_bhnd(graph, node, OpShape(site.rank, site.q_heads, site.kv_heads, site.head_size, None))
    given = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3].name else None
    _, folded = one_mask(graph, node, np.dtype(given.dtype) if given is not None and given.dtype is not None
                         else np.float32)
    if folded is not None or any(given is t for t in graph.inputs):  # rows left without keys: zeros, as ONNX says
        guard_empty_rows(graph, node, node.outputs[0].dtype or np.float32, given, folded)
    emit = Emitter(graph, f"trtattn/implicit/{site.name}")
    i64 = np.int64
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3].name else None
    dtype = node.outputs[0].dtype or np.float32
    scale = node.attrs.get("scale") or 1.0 / math.sqrt(site.head_size)
    cap = attribute_softcap(node.attrs)
    if site.q_heads != site.kv_heads:
        k, v = (_repeat_heads(emit, t, site.q_heads // site.kv_heads, dtype) for t in (k, v))
    scaled = emit("Mul", [q, emit.const(scale, dtype)], dtype=dtype, name="q_scale")
    logits = emit("MatMul", [scaled, emit("Transpose", [k], {"perm": [0, 1, 3, 2]}, dtype=dtype)], dtype=dtype,
                  name="logits")
    capped = emit("Mul", [emit("Tanh", [emit("Div", [logits, emit.const(cap, dtype)], dtype=dtype)], dtype=dtype),
                          emit.const(cap, dtype)], dtype=dtype, name="softcap")
    if node.attrs.get("is_causal"):  # fuse writes is_causal only where Q and K have one length: upper-left
        if mask is not None:
            raise TrtattnError(f"Attention {node.name} has a mask and is_causal")
        i = emit("Range", [emit.const(0, i64), emit.dim(q, 2), emit.const(1, i64)], dtype=i64)
        j = emit("Range", [emit.const(0, i64), emit.dim(k, 2), emit.const(1, i64)], dtype=i64)
        mask = emit("LessOrEqual", [emit("Unsqueeze", [j, emit.const([0], i64)], dtype=i64),
                                    emit("Unsqueeze", [i, emit.const([1], i64)], dtype=i64)], dtype=np.bool_)
    if mask is not None and mask.dtype == np.bool_:  # exactly one Where between the product and the Softmax
        capped = emit("Where", [mask, capped, emit.const(-np.inf, dtype)], dtype=dtype, name="mask")
    elif mask is not None:
        capped = emit("Add", [capped, mask], dtype=dtype, name="mask")
    probs = emit("Softmax", [capped], {"axis": -1}, dtype=dtype, name="probs")
    out = node.outputs[0]
    node.outputs.clear()
    node.inputs.clear()
    graph.nodes.remove(node)
    emit("MatMul", [probs, v], dtype=dtype, name="context")
    graph.nodes[-1].outputs = [out]


def _repeat_heads(emit: Emitter, t: gs.Tensor, groups: int, dtype) -> gs.Tensor:
    """[B, Nkv, S, H] -> [B, Nkv * groups, S, H], each head repeated `groups` times in a row."""
    i64 = np.int64
    wide = emit("Unsqueeze", [t, emit.const([2], i64)], dtype=dtype)  # [B, Nkv, 1, S, H]
    shape = emit("Concat", [emit.shape_slice(t, 0, 2), emit.const([groups], i64), emit.shape_slice(t, 2, 4)],
                 {"axis": 0}, dtype=i64)
    expanded = emit("Expand", [wide, shape], dtype=dtype)
    merged = emit("Concat", [emit.shape_slice(t, 0, 1), emit.const([-1], i64), emit.shape_slice(t, 2, 4)],
                  {"axis": 0}, dtype=i64)
    return emit("Reshape", [expanded, merged], dtype=dtype, name="repeat_heads")
