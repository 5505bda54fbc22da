"""ONNX Runtime's com.microsoft GroupQueryAttention as the standard ONNX Attention op with past/present.

GroupQueryAttention takes Q [B, S, N*H], K and V [B, S, Nkv*H], past_key/past_value [B, Nkv, P, H], and
per row the total length (seqlens_k = total - 1) next to the batch's total_sequence_length. Its kernel
writes the present as the past rows' first `past_b` keys followed by the new ones, where the first prompt
(S == total_sequence_length) has no past and later steps have past_b = total_b - S; query i sees the past
keys and the new keys up to its own (causal from the bottom right) within the row's total.

The standard op's present is Concat(past, new) (its kv-cache update): the same cache when every row's
past fills past_key (P == total_b - S, a concatenated cache, and always on a first prompt with no past),
which is how a model built on concatenated caches calls it. The keys each query sees are read from
seqlens_k as the kernel reads them, in a boolean mask: past keys below past_b, new keys up to the query
and below the row's new length. Q, K and V packed in the query input are split; softcap is the standard
op's (both cap the logits before the mask); a sliding window (local_window_size) is part of the mask;
rotary inside the op (do_rotary) is the standard RotaryEmbedding on the new Q and K at the positions the
kernel gives them; attention_bias is read at the kernel's columns. A fixed window buffer (sliding_window_cache, GenAI's
Gemma 2/3 sliding layers: past and present are one buffer of at least W = local_window_size slots) is the
same op over the buffer with the mask in buffer slots, and the present gathered back into the buffer's slots
as the kernel keeps them (rewrite/window_cache.py). A smooth
softmax and sinks are not converted: the site is reported with the reason.

Under a shared buffer (`shared_buffer`, GenAI's past_present_share_buffer) past and present are one buffer of
P = max_length slots: the kernel writes the S new keys at slots [past_b, past_b + S) (past_b = seqlens_k + 1 - S,
0 on the first prompt), leaves every other slot as it was, and its present has max(P, total_sequence_length)
slots. The standard op's keys are then the P slots (the mask above already sees only the first past_b of them,
and rotary is at past_b + i, the absolute positions) and the S new keys; its present Concat(past, new) is
gathered into the buffer's layout (`_into_buffer`). That gather is the identity over a concatenated cache
(P = total - S, past_b = P), so the form is right under both contracts; it is asked for only where the runtime
shares the buffer, as the kv-cache form (routes/prepare/op_cache.py) reads the standard op's present itself.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import TrtattnError
from ..graph.dim_facts import head_size_by_contract
from ..graph.emit import Emitter
from ..graph.rotary import RotaryAttrs
from ..site import SOFTCAP_ATTRIBUTE, attribute_softcap
from . import window_cache
from .microsoft import causal_keep, is_read, optional_input, output_merged, split_heads

_NOT_CONVERTED = {"smooth_softmax": "uses a smooth softmax"}


def convert_group_query(graph: gs.Graph, node: gs.Node, prefix: str, shared_buffer: bool = False) -> gs.Node:
    """Replace a com.microsoft GroupQueryAttention node; returns the new Attention node. `shared_buffer`: its
    presents are written into the past's buffer (module doc)."""
    where = f"com.microsoft:GroupQueryAttention {node.name}"
    for attr, why in _NOT_CONVERTED.items():
        if node.attrs.get(attr, 0):
            raise TrtattnError(f"{where} {why}: not converted")
    q, k, v = node.inputs[0], optional_input(node, 1), optional_input(node, 2)
    if (k is None) != (v is None):
        raise TrtattnError(f"{where} has only one of key and value")
    if optional_input(node, 11) is not None:
        raise TrtattnError(f"{where} has attention sinks (head_sink): not converted")
    if len(node.outputs) > 3 and is_read(graph, node.outputs[3]):
        raise TrtattnError(f"{where} also outputs its QK product: not converted")
    past_k, past_v, seqlens, total_length = optional_input(node, 3), optional_input(node, 4), node.inputs[5], node.inputs[6]
    if (past_k is None) != (past_v is None):
        raise TrtattnError(f"{where} has only one of past_key and past_value")
    buffered = bool(node.attrs.get("sliding_window_cache", 0))  # a fixed window buffer: rewrite/window_cache.py
    if buffered and optional_input(node, 10) is not None:
        raise TrtattnError(f"{where} keeps a window buffer and has an attention_bias: not converted")
    slots = window_cache.window_size(node, past_k, where) if buffered else 0  # the window, W
    heads, kv_heads = int(node.attrs["num_heads"]), int(node.attrs["kv_num_heads"])
    head = _head_size(q, (k, v), past_k, heads, kv_heads)
    if head is None:
        raise TrtattnError(f"{where}: the head size is unknown (no static last dim on the query, key, value or "
                           "past_key)")
    dtype = np.dtype(q.dtype) if q.dtype is not None else np.dtype(np.float32)
    emit = Emitter(graph, prefix)
    if k is None:  # Q, K and V packed in one input
        parts = [gs.Variable(f"{prefix}/{p}", dtype=dtype) for p in "qkv"]
        graph.nodes.append(gs.Node("Split", f"{prefix}/split", {"axis": -1}, inputs=[
            q, emit.const([heads * head, kv_heads * head, kv_heads * head], np.int64)], outputs=parts))
        q, k, v = parts
    q4, k4, v4 = split_heads(emit, q, heads, head, dtype), split_heads(emit, k, kv_heads, head, dtype), \
        split_heads(emit, v, kv_heads, head, dtype)
    row_past, row_new = _row_lengths(emit, q4, seqlens, total_length)
    cycle = window_cache.period(emit, past_k, slots) if buffered else None
    if node.attrs.get("do_rotary", 0):
        q4, k4 = _rotary(emit, node, q4, k4, row_past, head, dtype)
    size = int(node.attrs.get("local_window_size", -1))
    window = size if size > 0 else None
    # without a window the causal part is the standard op's is_causal (bottom-right with a past: j <= P + i),
    # and the mask says only which keys each row has: causal + padding, as the kv-cache form reads it
    # a window buffer's mask is in buffer slots: its v valid slots stand where the absolute past would
    seen_past = window_cache.resident(emit, row_past, slots, cycle) if buffered else row_past
    keep = _keep(emit, q4, past_k, seen_past, row_new, window)
    bias = optional_input(node, 10)
    mask = keep if bias is None else emit(
        "Where", [keep, _bias_at_keys(emit, bias, q4, past_k, row_past), emit.const(np.finfo(dtype).min, dtype)],
        dtype=dtype, name="attention_bias")
    scale = node.attrs.get("scale") or 1.0 / math.sqrt(head)
    inputs = [q4, k4, v4, emit.full_query_rows(mask, q4)]
    presents = []
    if past_k is not None:
        inputs += [past_k, past_v]
        written = buffered or shared_buffer  # the present is the op's concatenation written into the buffer
        presents = [o if is_read(graph, o) and not written else gs.Variable(f"{prefix}/present_{p}", dtype=dtype)
                    for o, p in zip(list(node.outputs[1:3]) + [None, None], "kv")]
    y = gs.Variable(f"{prefix}/Attention_out", dtype=dtype)
    attrs = {"scale": float(scale), **({"is_causal": 1} if window is None else {})}
    if cap := attribute_softcap(node.attrs):  # capped before the mask, as the kernel and the standard op both do
        attrs[SOFTCAP_ATTRIBUTE] = cap
    attention = gs.Node("Attention", f"{prefix}/Attention", attrs, inputs=inputs, outputs=[y, *presents])
    graph.nodes.append(attention)
    if buffered:  # the buffer written back: the keys it keeps of the standard op's concatenation
        kept = window_cache.resident(emit, emit("Add", [row_past, row_new], dtype=np.int64), slots, cycle)
        for concat, o, past in zip(presents, node.outputs[1:3], (past_k, past_v)):
            if is_read(graph, o):
                window_cache.write_back(emit, concat, o, past, seen_past, row_new, kept, dtype)
    elif shared_buffer and past_k is not None:
        for concat, o, past in zip(presents, node.outputs[1:3], (past_k, past_v)):
            if is_read(graph, o):
                _into_buffer(emit, concat, o, past, total_length, row_past, dtype)
    if past_k is None and any(is_read(graph, o) for o in node.outputs[1:3]):  # no past: the present is the new K/V
        for o, t in zip(node.outputs[1:3], (k4, v4)):
            if is_read(graph, o):
                emit("Identity", [t], dtype=dtype, name="present")
                graph.nodes[-1].outputs = [o]
    output_merged(emit, graph, node, y, dtype)
    return attention


def _into_buffer(emit: Emitter, concat, out, past, total_length, row_past, dtype) -> None:
    """`out` [B, Nkv, max(P, total), H]: the buffer `past` [B, Nkv, P, H] with the S new keys at slots
    [past_b, past_b + S) of each row (`row_past` [B]: past_b), gathered from the standard op's present `concat`
    (the P slots then the S new keys). A slot at or beyond P that no new key fills is unspecified in the kernel
    (outside the buffer): it repeats a key of `concat`."""
    i64 = np.int64
    p = emit.dim(past, 2)
    s = emit("Sub", [emit.dim(concat, 2), p], dtype=i64)
    slots = emit("Max", [p, emit.cast(emit("Reshape", [total_length, emit.const([], i64)], dtype=total_length.dtype),
                                      i64)], dtype=i64)
    t = emit("Range", [emit.const(0, i64), slots, emit.const(1, i64)], dtype=i64)  # [L]
    start = emit("Unsqueeze", [row_past, emit.const([1], i64)], dtype=i64)  # [B, 1]
    n = emit("Sub", [t, start], dtype=i64)  # [B, L]: the new key a slot holds, where 0 <= n < S
    is_new = emit("And", [emit("GreaterOrEqual", [n, emit.const(0, i64)], dtype=np.bool_),
                          emit("Less", [n, s], dtype=np.bool_)], dtype=np.bool_)
    last = emit("Sub", [emit.dim(concat, 2), emit.const(1, i64)], dtype=i64)
    at = emit("Where", [is_new, emit("Add", [p, n], dtype=i64),
                        emit("Min", [emit("Expand", [t, emit("Shape", [n], dtype=i64)], dtype=i64), last], dtype=i64)],
              dtype=i64)  # [B, L]: a new key n at P + n, any other slot at itself
    at = emit("Unsqueeze", [at, emit.const([1, 3], i64)], dtype=i64)  # [B, 1, L, 1]
    shape = emit("Concat", [emit.shape_slice(past, 0, 2), emit("Unsqueeze", [slots, emit.const([0], i64)], dtype=i64),
                            emit.shape_slice(past, 3, 4)], {"axis": 0}, dtype=i64)
    emit("GatherElements", [concat, emit("Expand", [at, shape], dtype=i64)], {"axis": 2}, dtype=dtype,
         name="present_in_buffer")
    emit.graph.nodes[-1].outputs = [out]


def _last(tensor) -> int | None:
    shape = tensor.shape if tensor is not None else None
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def _head_size(q, kv: tuple, past_k, heads: int, kv_heads: int) -> int | None:
    """The head size by the op's contract (graph/dim_facts.head_size_by_contract), else the past's last axis (a
    query computed by an op shape inference does not know, such as a query/key norm in the default domain, leaves
    its width unwritten)."""
    widths = [w for w in map(_last, kv) if w is not None]
    head, _ = head_size_by_contract(_last(q), widths[0] if widths else None, heads, kv_heads, kv[0] is None)
    return head if head is not None else _last(past_k)


def _row_lengths(emit: Emitter, q4, seqlens, total_length):
    """Each row's past and new lengths [B] as the kernel reads seqlens_k: row b's total is seqlens_k[b] + 1;
    on a first prompt (S == total_sequence_length) it has no past, else its past is total - S keys."""
    i64 = np.int64
    s = emit.dim(q4, 2)
    row_total = emit("Add", [emit.cast(seqlens, i64), emit.const(1, i64)], dtype=i64)
    first = emit("Equal", [emit.cast(total_length, i64), s], dtype=np.bool_)
    row_past = emit("Where", [first, emit.const(0, i64), emit("Sub", [row_total, s], dtype=i64)], dtype=i64)
    return row_past, emit("Sub", [row_total, row_past], dtype=i64)


def _rotary(emit: Emitter, node: gs.Node, q4, k4, row_past, head: int, dtype):
    """do_rotary: the standard RotaryEmbedding on the new Q and K ([B, N, S, H]) with the op's cos/sin
    tables, at the positions the kernel gives the new tokens (position_ids when given, else each row's past
    length + i); rotary_interleaved as the standard op's interleaved, a table narrower than the head as
    its rotary_embedding_dim."""
    cos, sin = optional_input(node, 7), optional_input(node, 8)
    if cos is None or sin is None:
        raise TrtattnError(f"com.microsoft:GroupQueryAttention {node.name} applies rotary embedding without "
                           "cos_cache and sin_cache: not converted")
    i64 = np.int64
    positions = optional_input(node, 9)
    if positions is None:
        new = emit("Range", [emit.const(0, i64), emit.dim(q4, 2), emit.const(1, i64)], dtype=i64)
        positions = emit("Add", [emit("Unsqueeze", [row_past, emit.const([1], i64)], dtype=i64),
                                 emit("Unsqueeze", [new, emit.const([0], i64)], dtype=i64)], dtype=i64)
    half = cos.shape[-1] if cos.shape and isinstance(cos.shape[-1], int) else None
    rotated = 2 * half if half is not None and 2 * half < head else head
    attrs = RotaryAttrs.for_head(bool(node.attrs.get("rotary_interleaved", 0)), rotated, head).as_attrs()
    return tuple(emit("RotaryEmbedding", [t, cos, sin, emit.cast(positions, i64)], attrs, dtype=dtype, name=f"{x}_rotary")
                 for x, t in (("q", q4), ("k", k4)))


def _bias_at_keys(emit: Emitter, bias, q4, past_k, row_past):
    """attention_bias [B or 1, N or 1, S, T] read at the keys' places: the kernel's column for a new key n is
    the row's past length + n (its present is compacted), the standard op's key is at P + n."""
    if past_k is None:
        return bias  # no past: the same columns
    i64 = np.int64
    p, columns = emit.dim(past_k, 2), emit.dim(bias, 3)
    j = emit("Range", [emit.const(0, i64), emit("Add", [p, emit.dim(q4, 2)], dtype=i64), emit.const(1, i64)],
             dtype=i64)
    rows = emit("Unsqueeze", [row_past, emit.const([1], i64)], dtype=i64)  # [B, 1]
    at = emit("Where", [emit("Less", [j, p], dtype=np.bool_), j, emit("Add", [rows, emit("Sub", [j, p], dtype=i64)],
                                                                      dtype=i64)], dtype=i64)  # [B, P + S]
    at = emit("Min", [at, emit("Sub", [columns, emit.const(1, i64)], dtype=i64)], dtype=i64)  # masked keys: any column
    at = emit("Unsqueeze", [at, emit.const([1, 2], i64)], dtype=i64)  # [B, 1, 1, P + S]
    shape = emit("Concat", [emit.shape_slice(q4, 0, 1), emit.shape_slice(bias, 1, 3), emit.shape_slice(at, 3, 4)],
                 {"axis": 0}, dtype=i64)
    rows_bias = emit("Expand", [bias, emit("Concat", [emit.shape_slice(q4, 0, 1), emit.shape_slice(bias, 1, 4)],
                                           {"axis": 0}, dtype=i64)], dtype=bias.dtype)
    return emit("GatherElements", [rows_bias, emit("Expand", [at, shape], dtype=i64)], {"axis": 3}, dtype=bias.dtype,
                name="bias_at_keys")


def _keep(emit: Emitter, q4, past_k, row_past, row_new, window: int | None):
    """Booleans, True where a query sees a key: the row's past keys (below row_past) and its new keys below
    its new length, [B, 1, 1, P + S] (the op's is_causal adds n <= i); with a sliding window
    (local_window_size w), [B, 1, S, P + S] with the causal part in it: query i sees new keys n <= i and
    it sees the last w keys up to its own, as ONNX Runtime's kernel does (measured: w keys, not w + 1):
    positions above past + i - w (a past key j is at j, a new key n at past + n)."""
    i64 = np.int64
    s = emit.dim(q4, 2)
    p = emit.dim(past_k, 2) if past_k is not None else emit.const(0, i64)

    def per_row(t):  # [B] -> [B, 1, 1, 1]
        return emit("Unsqueeze", [t, emit.const([1, 2, 3], i64)], dtype=i64)

    keys = emit("Add", [p, s], dtype=i64)
    j = emit("Range", [emit.const(0, i64), keys, emit.const(1, i64)], dtype=i64)  # [P + S]
    n = emit("Sub", [j, p], dtype=i64)  # a new key's index (negative for the past)
    past_seen = emit("And", [emit("Less", [j, p], dtype=np.bool_),
                             emit("Less", [j, per_row(row_past)], dtype=np.bool_)], dtype=np.bool_)
    new_seen = emit("And", [emit("GreaterOrEqual", [n, emit.const(0, i64)], dtype=np.bool_),
                            emit("Less", [n, per_row(row_new)], dtype=np.bool_)], dtype=np.bool_)
    if window is None:
        return emit("Or", [past_seen, new_seen], dtype=np.bool_, name="keys_seen")  # [B, 1, 1, P + S]; is_causal
    new_seen = emit("And", [new_seen, causal_keep(emit, s, keys, p)], dtype=np.bool_)  # [S, P + S]: j <= P + i
    i = emit("Unsqueeze", [emit("Range", [emit.const(0, i64), s, emit.const(1, i64)], dtype=i64),
                           emit.const([1], i64)], dtype=i64)  # [S, 1]
    reach = emit("Sub", [i, emit.const(window - 1, i64)], dtype=i64)  # the oldest key seen, as a new key's index
    past_seen = emit("And", [past_seen, emit("GreaterOrEqual", [j, emit("Add", [reach, per_row(row_past)], dtype=i64)],
                                             dtype=np.bool_)], dtype=np.bool_)
    new_seen = emit("And", [new_seen, emit("GreaterOrEqual", [n, reach], dtype=np.bool_)], dtype=np.bool_)
    return emit("Or", [past_seen, new_seen], dtype=np.bool_, name="keys_seen")
