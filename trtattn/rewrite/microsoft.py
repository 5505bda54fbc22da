"""ONNX Runtime's contrib attention ops (what its transformer optimizer writes) as the standard
ONNX Attention op, so that ORT-optimised models build into IAttention like any other.

com.microsoft Attention: one projection [D, Dq + Dk + Dv] (+ bias) of the hidden state, split and
    reshaped into heads; mask_index as per-row lengths [B] (right padding) or a raw [B, T] mask;
    an optional attention_bias; unidirectional = causal. Masked logits get mask_filter_value
    (default -10000) added, exactly as the contrib kernel does.
com.microsoft MultiHeadAttention: Q/K/V [B, S, D] (+ a packed bias), or K/V already in heads [B, N, T, H]
    (a cross-attention's cache, computed once), key_padding_mask [B, T], attention_bias, unidirectional.
com.microsoft QAttention (ONNX Runtime's quantize_dynamic over an optimized Attention): the same
    attention after an int8/uint8 projection, written as the integer product ONNX Runtime computes
    (MatMulInteger, int32 accumulation, times input_scale * weight_scale), so that the quantized layers
    after it see the same values.
With a cache (Attention's past [2, B, N, P, H] and present; MultiHeadAttention's past_key/past_value
[B, N, P, H] and present_key/present_value) the standard op takes the past and returns the present
(Concat(past, new) on the sequence axis, which is what both contrib kernels write), masks and
lengths span past + new keys, and unidirectional is causal from the bottom right (query i sees the
past and new keys up to i). GroupQueryAttention: rewrite/group_query.py. A cache in a shared buffer
(past_present_share_buffer, past_sequence_length), packed QKV formats and rotary inside the op are
not converted: the site is reported with the reason instead.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import TrtattnError
from ..graph.emit import Emitter
from ..graph.shapes import symbolic_shapes
from ..match.fused_ops import MICROSOFT_OPS

DEFAULT_FILTER = -10000.0


def optional_input(n: gs.Node, i: int):
    return n.inputs[i] if len(n.inputs) > i and n.inputs[i].name else None


def split_heads(emit: Emitter, t, heads: int, head: int, dtype):
    """[B, S, N*H] -> [B, N, S, H]"""
    r = emit("Reshape", [t, emit.const([0, 0, heads, head], np.int64)], dtype=dtype)
    return emit("Transpose", [r], {"perm": [0, 2, 1, 3]}, dtype=dtype)


def merge_heads(emit: Emitter, y, dtype):
    """[B, N, S, H] -> [B, S, N*H]"""
    t = emit("Transpose", [y], {"perm": [0, 2, 1, 3]}, dtype=dtype)
    return emit("Reshape", [t, emit.const([0, 0, -1], np.int64)], dtype=dtype)


def output_merged(emit: Emitter, graph: gs.Graph, node: gs.Node, y, dtype) -> None:
    """The contrib `node` detached, its first output now made by merging the heads of `y` ([B, N, S, H])."""
    out = node.outputs[0]
    node.outputs.clear()
    node.inputs.clear()
    merge_heads(emit, y, dtype)
    graph.nodes[-1].outputs = [out]


EMBED_OPS = ("EmbedLayerNormalization", "QEmbedLayerNormalization")


def _mask_rank(mask) -> int | None:
    """The rank of a mask_index: the contrib embedding ops' second output is per-row lengths [B] by their
    spec (symbolic shape inference gives QEmbedLayerNormalization's the input's [B, S])."""
    producer = mask.inputs[0] if mask.inputs else None
    if producer is not None and producer.domain == "com.microsoft" and producer.op in EMBED_OPS \
            and len(producer.outputs) > 1 and producer.outputs[1] is mask:
        return 1
    return len(mask.shape) if mask.shape is not None else None


def _key_padding(emit: Emitter, mask, total, filter_value: float, dtype):
    """mask_index / key_padding_mask -> additive [B, 1, 1, T] (0 where attended, filter where not); `total`:
    the number of keys T (past + new), a 0-D int64 tensor."""
    rank = _mask_rank(mask)
    if rank == 1:  # per-row lengths: key j attended iff j < length[b]
        j = emit("Range", [emit.const(0, np.int64), total, emit.const(1, np.int64)], dtype=np.int64)
        lengths = emit("Cast", [mask], {"to": 7}, dtype=np.int64)
        keep = emit("Less", [emit("Unsqueeze", [j, emit.const([0], np.int64)], dtype=np.int64),
                             emit("Unsqueeze", [lengths, emit.const([1], np.int64)], dtype=np.int64)], dtype=np.bool_)
    elif rank == 2:  # raw mask [B, T]: 0 = padding
        keep = emit("Not", [emit("Equal", [mask, emit.const(np.zeros((), dtype=mask.dtype or np.int32), mask.dtype or np.int32)],
                                 dtype=np.bool_)], dtype=np.bool_)
    else:
        raise TrtattnError(f"mask of rank {rank} on a com.microsoft attention op is not converted (per-row lengths "
                           "[B] and raw [B, T] masks are)")
    keep = emit("Unsqueeze", [keep, emit.const([1, 2], np.int64)], dtype=np.bool_)
    return emit("Where", [keep, emit.const(0.0, dtype), emit.const(filter_value, dtype)], dtype=dtype, name="key_padding")


def causal_keep(emit: Emitter, queries, total, past):
    """[Sq, T] booleans: key j attended by query i iff j <= past + i (bottom-right aligned: the past keys
    and the new ones up to the query's own); 0-D int64 lengths."""
    zero, one = emit.const(0, np.int64), emit.const(1, np.int64)
    i = emit("Add", [emit("Range", [zero, queries, one], dtype=np.int64), past], dtype=np.int64)
    j = emit("Range", [zero, total, one], dtype=np.int64)
    return emit("LessOrEqual", [emit("Unsqueeze", [j, emit.const([0], np.int64)], dtype=np.int64),
                                emit("Unsqueeze", [i, emit.const([1], np.int64)], dtype=np.int64)], dtype=np.bool_)


def _causal(emit: Emitter, queries, total, past, filter_value: float, dtype):
    """unidirectional, as the contrib kernels apply it: key j attended iff j <= i + past length."""
    keep = causal_keep(emit, queries, total, past)
    return emit("Where", [keep, emit.const(0.0, dtype), emit.const(filter_value, dtype)], dtype=dtype, name="causal")


def _refuse_shared_buffer(node: gs.Node, past_length_input: int) -> None:
    if node.attrs.get("past_present_share_buffer", 0) or optional_input(node, past_length_input) is not None:
        raise TrtattnError(f"com.microsoft:{node.op} {node.name} keeps its cache in a shared buffer "
                           "(past_present_share_buffer / past_sequence_length): not converted")


def is_read(graph: gs.Graph, t) -> bool:
    """Whether an output is read: by a node, or as a graph output."""
    return t is not None and bool(t.name) and (bool(t.outputs) or any(o is t for o in graph.outputs))


def _quantized_projection(emit: Emitter, node: gs.Node):
    """QAttention's projection as ONNX Runtime computes it: an integer product with int32 accumulation
    (MatMulInteger, as quantize_dynamic writes every other linear layer of such a model), scaled by
    input_scale * weight_scale (per tensor or per column), plus the bias. Returns (qkv, width, bias dtype,
    mask_index). QAttention's inputs: input, weight, bias, input_scale, weight_scale, mask_index,
    input_zero_point, weight_zero_point, past."""
    if optional_input(node, 8) is not None:
        raise TrtattnError(f"com.microsoft:QAttention {node.name} has a past input: not converted")
    x, weight, bias = node.inputs[0], node.inputs[1], optional_input(node, 2)
    x_scale, w_scale, mask = node.inputs[3], node.inputs[4], optional_input(node, 5)
    x_zero, w_zero = optional_input(node, 6), optional_input(node, 7)
    dtype = np.dtype(np.float32) if bias is None or bias.dtype is None else np.dtype(bias.dtype)
    inputs = [x, weight, x_zero or gs.Variable.empty(), w_zero or gs.Variable.empty()]
    while not inputs[-1].name:  # trailing optional inputs left out
        inputs.pop()
    acc = emit("MatMulInteger", inputs, dtype=np.int32)
    scale = emit("Mul", [x_scale, w_scale], dtype=dtype, name="projection_scale")
    qkv = emit("Mul", [emit("Cast", [acc], {"to": _onnx_type(dtype)}, dtype=dtype), scale], dtype=dtype)
    if bias is not None:
        qkv = emit("Add", [qkv, bias], dtype=dtype)
    width = weight.shape[1] if weight.shape else None
    return qkv, width, dtype, mask


def _onnx_type(dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class _Operands(NamedTuple):
    """A contrib op's operands as the standard op takes them, before the heads are split."""

    q: Any
    k: Any
    v: Any
    mask: Any
    attention_bias: Any
    past_k: Any
    past_v: Any
    head_q: int
    head_v: int
    dtype: Any


def _projected(emit: Emitter, graph: gs.Graph, node: gs.Node, prefix: str, x, dtype, heads: int) -> _Operands:
    """Attention / QAttention: Q, K and V projected from one input by one packed weight, split in three."""
    past_k = past_v = None
    if node.op == "QAttention":
        qkv, width, dtype, mask = _quantized_projection(emit, node)
        attention_bias = None
    else:
        weight, bias, mask = node.inputs[1], optional_input(node, 2), optional_input(node, 3)
        past = optional_input(node, 4)
        if past is not None:  # [2, B, N, P, H]: the past key and value stacked
            _refuse_shared_buffer(node, 6)
            past_k, past_v = (emit("Gather", [past, emit.const(i, np.int64)], {"axis": 0}, dtype=dtype)
                              for i in (0, 1))
        elif is_read(graph, node.outputs[1] if len(node.outputs) > 1 else None):
            raise TrtattnError(f"com.microsoft:Attention {node.name} returns a present cache without a past "
                               "input: not converted")
        attention_bias = optional_input(node, 5)
        width = weight.shape[1] if weight.shape else None
        qkv = emit("MatMul", [x, weight], dtype=dtype)
        if bias is not None:
            qkv = emit("Add", [qkv, bias], dtype=dtype)
    sizes = list(node.attrs.get("qkv_hidden_sizes", [])) or ([width // 3] * 3 if width else None)
    if not sizes:
        raise TrtattnError(f"com.microsoft:{node.op} {node.name}: the projection width is unknown")
    parts = [gs.Variable(f"{prefix}/{p}", dtype=dtype) for p in "qkv"]
    graph.nodes.append(gs.Node("Split", f"{prefix}/split", {"axis": -1},
                               inputs=[qkv, emit.const(sizes, np.int64)], outputs=parts))
    q, k, v = parts
    head_q, head_v = sizes[0] // heads, sizes[2] // heads
    return _Operands(q, k, v, mask, attention_bias, past_k, past_v, head_q, head_v, dtype)


def _separate(emit: Emitter, graph: gs.Graph, node: gs.Node, prefix: str, dtype, heads: int) -> _Operands:
    """MultiHeadAttention: Q, K and V given apart (K/V in BNSH already for a cross-attention's cache)."""
    q, k, v = node.inputs[:3]
    bias, mask, attention_bias = optional_input(node, 3), optional_input(node, 4), optional_input(node, 5)
    bnsh = len(k.shape or []) == 4  # K/V already in heads: a cross-attention's cache, computed once
    if bnsh and (bias is not None or optional_input(node, 6) is not None):
        raise TrtattnError(f"com.microsoft:MultiHeadAttention {node.name} takes K/V in BNSH with a bias or a past: "
                           "not converted")
    past_k, past_v = optional_input(node, 6), optional_input(node, 7)
    if (past_k is None) != (past_v is None):
        raise TrtattnError(f"com.microsoft:MultiHeadAttention {node.name} has only one of past_key and past_value")
    if past_k is not None:
        _refuse_shared_buffer(node, 8)
    elif any(is_read(graph, o) for o in node.outputs[1:3]):
        raise TrtattnError(f"com.microsoft:MultiHeadAttention {node.name} returns a present cache without a "
                           "past input: not converted")
    width = q.shape[-1] if q.shape and isinstance(q.shape[-1], int) else None
    if width is None:
        raise TrtattnError(f"com.microsoft:MultiHeadAttention {node.name}: the hidden size is unknown")
    if bnsh:
        v_width = v.shape[1] * v.shape[3] if v.shape and all(isinstance(d, int) for d in (v.shape[1], v.shape[3])) \
            else width
    elif bias is not None:  # one [Dq + Dk + Dv] bias for the three projections
        parts = [gs.Variable(f"{prefix}/bias_{p}", dtype=dtype) for p in "qkv"]
        v_width = (bias.shape[0] - 2 * width) if bias.shape else width
        graph.nodes.append(gs.Node("Split", f"{prefix}/split_bias", {"axis": 0},
                                   inputs=[bias, emit.const([width, width, v_width], np.int64)], outputs=parts))
        q, k, v = (emit("Add", [t, b], dtype=dtype) for t, b in zip((q, k, v), parts))
    else:
        v_width = width
    head_q, head_v = width // heads, v_width // heads
    return _Operands(q, k, v, mask, attention_bias, past_k, past_v, head_q, head_v, dtype)


def convert(graph: gs.Graph, node: gs.Node, prefix: str) -> gs.Node:
    """Replace a com.microsoft Attention / MultiHeadAttention / QAttention node; returns the new Attention node.
    (GroupQueryAttention: group_query.convert_group_query.)"""
    if node.op not in ("Attention", "MultiHeadAttention", "QAttention"):
        raise TrtattnError(f"converting com.microsoft:{node.op} to the standard Attention op is not supported")
    if node.attrs.get("do_rotary", 0):
        raise TrtattnError(f"com.microsoft:{node.op} {node.name} applies rotary embedding inside: not converted")
    emit = Emitter(graph, prefix)
    heads = int(node.attrs["num_heads"])
    filter_value = float(node.attrs.get("mask_filter_value", DEFAULT_FILTER))
    x = node.inputs[0]
    dtype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)
    if node.op in ("Attention", "QAttention"):
        ops = _projected(emit, graph, node, prefix, x, dtype, heads)
    else:
        ops = _separate(emit, graph, node, prefix, dtype, heads)
    q, k, v, mask, attention_bias, past_k, past_v, head_q, head_v, dtype = ops
    extra = node.outputs[3:] if node.op == "MultiHeadAttention" else node.outputs[2:]
    if any(is_read(graph, o) for o in extra):
        raise TrtattnError(f"com.microsoft:{node.op} {node.name} also outputs its QK product: not converted")
    q4 = split_heads(emit, q, heads, head_q, dtype)
    if node.op == "MultiHeadAttention" and len(k.shape or []) == 4:  # BNSH already
        k4, v4 = k, v
    else:
        k4, v4 = split_heads(emit, k, heads, head_q, dtype), split_heads(emit, v, heads, head_v, dtype)
    past_len = emit.dim(past_k, 2) if past_k is not None else emit.const(0, np.int64)
    total = emit("Add", [past_len, emit.dim(k4, 2)], dtype=np.int64) if past_k is not None else emit.dim(k4, 2)
    additive = None
    if mask is not None:
        additive = _key_padding(emit, mask, total, filter_value, dtype)
    # unidirectional alone is the standard op's is_causal (bottom-right with a past, as the kernel's); next to
    # a mask the kernel's filter value is added instead, so that a row with no key left averages as it does
    in_op = bool(node.attrs.get("unidirectional", 0)) and mask is None and attention_bias is None
    if node.attrs.get("unidirectional", 0) and not in_op:
        causal = _causal(emit, emit.dim(q4, 2), total, past_len, filter_value, dtype)
        additive = causal if additive is None else emit("Add", [additive, causal], dtype=dtype)
    if attention_bias is not None:
        additive = attention_bias if additive is None else emit("Add", [additive, attention_bias], dtype=dtype)
    scale = node.attrs.get("scale") or 1.0 / math.sqrt(head_q)
    inputs = [q4, k4, v4]
    if additive is not None or past_k is not None:
        inputs.append(emit.full_query_rows(additive, q4) if additive is not None else gs.Variable.empty())
    presents: list = []
    if past_k is not None:
        inputs += [past_k, past_v]
        if node.op == "MultiHeadAttention":
            presents = [o if is_read(graph, o) else gs.Variable(f"{prefix}/present_{p}", dtype=dtype)
                        for o, p in zip(list(node.outputs[1:3]) + [None, None], "kv")]
        else:
            presents = [gs.Variable(f"{prefix}/present_{p}", dtype=dtype) for p in "kv"]
    y = gs.Variable(f"{prefix}/Attention_out", dtype=dtype)
    attention = gs.Node("Attention", f"{prefix}/Attention", {"scale": float(scale), **({"is_causal": 1} if in_op else {})},
                        inputs=inputs, outputs=[y, *presents])
    graph.nodes.append(attention)
    if node.op != "MultiHeadAttention" and past_k is not None and is_read(graph, node.outputs[1]):
        stacked = [emit("Unsqueeze", [p, emit.const([0], np.int64)], dtype=dtype) for p in presents]
        emit("Concat", stacked, {"axis": 0}, dtype=dtype, name="present")
        graph.nodes[-1].outputs = [node.outputs[1]]
    output_merged(emit, graph, node, y, dtype)
    return attention


def with_contrib_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Converting com.microsoft ops needs the ranks of their masks, which only ONNX Runtime's
    symbolic shape inference knows (ONNX's does not know contrib ops)."""
    contrib = [n for n in model.graph.node if n.domain == "com.microsoft" and n.op_type in MICROSOFT_OPS]
    if not contrib:
        return model
    try:
        inferred = symbolic_shapes(model)
    except Exception:
        return model
    if inferred is None:
        return model
    # Only the attention ops' inputs: symbolic inference types some contrib outputs wrongly (the float
    # output of EmbedLayerNormalization as int32), and a wrong type breaks the rewritten model.
    wanted = {name for n in contrib for name in n.input if name}
    known = {v.name for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.initializer)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.value_info.extend(v for v in inferred.graph.value_info if v.name in wanted and v.name not in known)
    return out
