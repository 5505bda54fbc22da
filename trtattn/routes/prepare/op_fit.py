"""Each standard Attention node fitted to what IAttention takes, written as standard ONNX that ONNX Runtime
verifies against the original (ONNX's Attention-23/24/25 is the reference for every step):

- one head size: TensorRT's IAttention takes Q, K and V of one head size H. Where V's head size differs,
  the smaller side is zero-padded (V's extra columns are sliced off the output again; zero columns of Q
  and K add nothing to the logits, and the scale is pinned to the original head size first): exact.
- one mask: IAttention takes a causal kind or a mask, never both, and has no sliding window. is_causal
  together with attn_mask, and left/right windows, become one mask with ONNX's alignment (offset 0
  without a cache; nonpad_kv_seqlen[b] - Sq with per-row lengths, i.e. bottom-right).
- per-row lengths: nonpad_kv_seqlen is IAttention's key_value_lengths; is_causal alone over it is
  LOWER_RIGHT within each row's length (ONNX: offset nonpad_kv_seqlen[b] - Sq), recorded for the planner.

3-D attention [B, S, N*H] is split into heads first where a step needs 4-D operands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from ...errors import TrtattnError
from ...graph.emit import Emitter
from .lowering import AttentionLowering

WINDOW = ("left_window_size", "right_window_size")
MASK, PAST_KEY, PAST_VALUE, NONPAD = 3, 4, 5, 6


@dataclass
class OpShape:
    rank: int
    q_heads: int | None
    kv_heads: int | None
    head: int | None  # Q/K head size
    v_head: int | None


def opt(node: gs.Node, i: int) -> gs.Tensor | None:
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i].name else None


def op_shape(node: gs.Node, types: dict) -> OpShape:
    def shape(t):
        return types.get(t.name, (None, None))[1] or t.shape or []

    def static(s, i):
        return s[i] if len(s) > abs(i) and isinstance(s[i], int) and s[i] > 0 else None

    q, k, v = (shape(t) for t in node.inputs[:3])
    rank = len(q) or 4
    if rank == 4:
        return OpShape(4, static(q, 1), static(k, 1), static(q, 3), static(v, 3))
    nq, nkv = node.attrs.get("q_num_heads"), node.attrs.get("kv_num_heads")
    per = lambda s, n: static(s, 2) // n if static(s, 2) and n else None  # noqa: E731
    return OpShape(rank, nq, nkv, per(q, nq), per(v, nkv))


def window(node: gs.Node) -> tuple[int, int]:
    return tuple(int(node.attrs.get(w, -1)) for w in WINDOW)  # type: ignore[return-value]


def to_bhnd(graph: gs.Graph, node: gs.Node, shape: OpShape) -> None:
    """A 3-D [B, S, N*H] Attention node as 4-D [B, N, S, H]: Q/K/V split into heads, the output merged back."""
    if shape.rank == 4:
        return
    if not shape.q_heads or not shape.kv_heads:
        raise TrtattnError(f"Attention {node.name}: 3-D attention without q_num_heads/kv_num_heads")
    emit = Emitter(graph, f"trtattn/bhnd/{node.name}")
    i64 = np.int64
    for i, heads in ((0, shape.q_heads), (1, shape.kv_heads), (2, shape.kv_heads)):
        t = node.inputs[i]
        split = emit("Reshape", [t, emit.const([0, 0, heads, -1], i64)], dtype=t.dtype)
        node.inputs[i] = emit("Transpose", [split], {"perm": [0, 2, 1, 3]}, dtype=t.dtype, name="heads_first")
    out = node.outputs[0]
    y = gs.Variable(f"{out.name}/bhnd", dtype=out.dtype)
    node.outputs[0] = y
    merged = emit("Transpose", [y], {"perm": [0, 2, 1, 3]}, dtype=out.dtype)
    graph.nodes.append(gs.Node("Reshape", f"{emit.prefix}/merge_heads", inputs=[merged, emit.const([0, 0, -1], i64)],
                               outputs=[out]))
    for a in ("q_num_heads", "kv_num_heads"):
        node.attrs.pop(a, None)
    shape.rank = 4


def _pad_last(emit: Emitter, t: gs.Tensor, extra: int) -> gs.Tensor:
    return emit("Pad", [t, emit.const([0, 0, 0, 0, 0, 0, 0, extra], np.int64)], dtype=t.dtype, name="pad_head")


def one_head_size(graph: gs.Graph, node: gs.Node, shape: OpShape) -> str | None:
    """Q/K and V zero-padded to one head size (module doc); a note, or None when they have one already."""
    d, dv = shape.head, shape.v_head
    if d is None or dv is None or d == dv:
        return None
    to_bhnd(graph, node, shape)
    if node.attrs.get("scale") is None:  # the default scale follows Q's head size: pin it before padding Q
        node.attrs["scale"] = float(1.0 / math.sqrt(d))
    emit = Emitter(graph, f"trtattn/head_size/{node.name}")
    if dv < d:
        node.inputs[2] = _pad_last(emit, node.inputs[2], d - dv)
        out = node.outputs[0]
        y = gs.Variable(f"{out.name}/padded_head", dtype=out.dtype)
        node.outputs[0] = y
        i64 = np.int64
        graph.nodes.append(gs.Node("Slice", f"{emit.prefix}/v_head", inputs=[
            y, emit.const([0], i64), emit.const([dv], i64), emit.const([3], i64)], outputs=[out]))
    else:
        node.inputs[0] = _pad_last(emit, node.inputs[0], dv - d)
        node.inputs[1] = _pad_last(emit, node.inputs[1], dv - d)
    return f"Attention {node.name}: V head size {dv} and Q/K head size {d} zero-padded to {max(d, dv)} " \
           "(IAttention takes one head size)"


def one_mask(graph: gs.Graph, node: gs.Node, mask_dtype, offset: gs.Tensor | None = None
             ) -> tuple[str | None, gs.Tensor | None]:
    """is_causal with attn_mask, and sliding windows, folded into one mask with ONNX's alignment (`offset`
    [B]: each row's causal offset where it is not nonpad_kv_seqlen - Sq). (a note, the keys the folded
    conditions allow as booleans), or (None, None) when nothing needed folding."""
    causal = bool(node.attrs.get("is_causal", 0))
    left, right = window(node)
    mask, nonpad = opt(node, MASK), opt(node, NONPAD)
    if not (left >= 0 or right >= 0 or (causal and (mask is not None or offset is not None))):
        for w in WINDOW:
            node.attrs.pop(w, None)  # -1: no window
        return None, None
    emit = Emitter(graph, f"trtattn/mask/{node.name}")
    i64 = np.int64
    q, k = node.inputs[0], node.inputs[1]
    i = emit("Unsqueeze", [emit("Range", [emit.const(0, i64), emit.dim(q, 2), emit.const(1, i64)], dtype=i64),
                           emit.const([1], i64)], dtype=i64, name="query_positions")  # [Sq, 1]
    j = emit("Unsqueeze", [emit("Range", [emit.const(0, i64), emit.dim(k, 2), emit.const(1, i64)], dtype=i64),
                           emit.const([0], i64)], dtype=i64, name="key_positions")  # [1, Skv]
    if offset is None and nonpad is not None:  # per row: the query block ends at the row's last key
        offset = emit("Sub", [emit.cast(nonpad, i64), emit.dim(q, 2)], dtype=i64)
    if offset is not None:
        i = emit("Add", [i, emit("Unsqueeze", [offset, emit.const([1, 2, 3], i64)], dtype=i64)], dtype=i64,
                 name="query_positions_in_row")  # [B, 1, Sq, 1]
    diff = emit("Sub", [i, j], dtype=i64)  # query position minus key position
    conditions = []
    if causal:
        conditions.append(emit("GreaterOrEqual", [diff, emit.const(0, i64)], dtype=np.bool_, name="causal"))
    if left >= 0:
        conditions.append(emit("LessOrEqual", [diff, emit.const(left, i64)], dtype=np.bool_, name="left_window"))
    if right >= 0:
        conditions.append(emit("GreaterOrEqual", [diff, emit.const(-right, i64)], dtype=np.bool_, name="right_window"))
    allowed = conditions[0]
    for c in conditions[1:]:
        allowed = emit("And", [allowed, c], dtype=np.bool_)
    if mask is None:
        folded = allowed
    elif mask_dtype == np.bool_:
        folded = emit("And", [mask, allowed], dtype=np.bool_, name="mask_and_causal")
    else:
        folded = emit("Where", [allowed, mask, emit.const(-np.inf, mask_dtype)], dtype=mask_dtype,
                      name="mask_and_causal")
    while len(node.inputs) <= MASK:
        node.inputs.append(gs.Variable.empty())
    node.inputs[MASK] = folded
    node.attrs["is_causal"] = 0
    for w in WINDOW:
        node.attrs.pop(w, None)
    what = [x for x, on in (("is_causal", causal), ("attn_mask", mask is not None), (f"left window {left}", left >= 0),
                            (f"right window {right}", right >= 0)) if on]
    return (f"Attention {node.name}: {' + '.join(what)} as one mask (IAttention takes a causal kind or a mask, "
            "no window)", allowed)


def guard_empty_rows(graph: gs.Graph, node: gs.Node, out_dtype, mask: gs.Tensor | None,
                     folded: gs.Tensor | None) -> str:
    """Y = 0 on query rows that may attend no key (an all-masked row, a row length 0, a bottom-right causal
    frontier before the first key): ONNX defines them as zeros, TensorRT leaves them undefined. Decided on
    the model's own mask, what one_mask folded in (`folded`, booleans) and the lengths, never on a written
    -inf (a precision conversion may make it finite)."""
    emit = Emitter(graph, f"trtattn/empty_rows/{node.name}")
    i64 = np.int64
    q, k = node.inputs[0], node.inputs[1]
    nonpad = opt(node, NONPAD)
    conditions = [folded] if folded is not None else []
    if mask is not None:
        conditions.append(mask if mask.dtype == np.bool_ else emit(
            "Greater", [emit.cast(mask, np.float32), emit.const(-np.inf, np.float32)], dtype=np.bool_, name="not_masked"))
    if nonpad is not None:
        j = emit("Range", [emit.const(0, i64), emit.dim(k, 2), emit.const(1, i64)], dtype=i64, name="key_positions")
        lengths = emit("Unsqueeze", [emit.cast(nonpad, i64), emit.const([1, 2, 3], i64)], dtype=i64)  # [B, 1, 1, 1]
        conditions.append(emit("Less", [j, lengths], dtype=np.bool_, name="within_length"))
        if node.attrs.get("is_causal", 0):  # bottom-right within the row: j <= i + length - Sq
            i = emit("Unsqueeze", [emit("Range", [emit.const(0, i64), emit.dim(q, 2), emit.const(1, i64)], dtype=i64),
                                   emit.const([1], i64)], dtype=i64)
            frontier = emit("Sub", [emit("Add", [i, lengths], dtype=i64), emit.dim(q, 2)], dtype=i64)
            conditions.append(emit("LessOrEqual", [j, frontier], dtype=np.bool_, name="causal"))
    allowed = conditions[0]
    for c in conditions[1:]:
        allowed = emit("And", [allowed, c], dtype=np.bool_)
    keys = emit("ReduceMax", [emit.cast(allowed, np.int32), emit.const([-1], i64)], {"keepdims": 1}, dtype=np.int32)
    has_key = emit("Greater", [keys, emit.const(0, np.int32)], dtype=np.bool_, name="has_key")
    out = node.outputs[0]
    y = gs.Variable(f"{out.name}/attended", dtype=out.dtype)
    node.outputs[0] = y
    graph.nodes.append(gs.Node("Where", f"{emit.prefix}/zero_rows", inputs=[has_key, y, emit.const(0, out_dtype)],
                               outputs=[out]))
    return f"Attention {node.name}: query rows with no key to attend give zeros, as ONNX defines (TensorRT does not)"


def mask_4d(graph: gs.Graph, node: gs.Node, rank: int | None) -> str | None:
    """The node's mask as [.., .., Sq, Skv] with ones in front (IAttention takes a 4-D mask; ONNX broadcasts
    one of rank 1..4 from the right, so ones in front keep its meaning); any rank <= 4 when `rank` is None."""
    mask = opt(node, MASK)
    if mask is None or rank == 4:
        return None
    emit = Emitter(graph, f"trtattn/mask_4d/{node.name}")
    i64 = np.int64
    shape = emit("Concat", [emit.const([1, 1, 1, 1], i64), emit("Shape", [mask], dtype=i64)], {"axis": 0}, dtype=i64)
    last4 = emit("Slice", [shape, emit.const([-4], i64), emit.const([2 ** 62], i64)], dtype=i64)
    node.inputs[MASK] = emit("Reshape", [mask, last4], dtype=mask.dtype, name="mask_4d")
    return f"Attention {node.name}: its mask as 4-D (IAttention takes [B|1, N|1, Sq, Skv])"


def fit_ops(graph: gs.Graph, types: dict, nodes: list[str], offsets: dict[str, str] | None = None
            ) -> tuple[list[AttentionLowering], list[str]]:
    """Fit the named Attention nodes of `graph` in place (module doc); their lowering records (where
    nonpad_kv_seqlen gives per-row lengths) and notes. offsets: node -> the input holding its rows' causal
    offsets, where that is not nonpad_kv_seqlen - Sq (op_cache.py)."""
    by_name = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()
    offsets = offsets or {}
    lowerings, notes = [], []
    for name in nodes:
        node = by_name.get(name)
        if node is None or node.op != "Attention":
            continue
        if opt(node, PAST_KEY) is not None:
            raise TrtattnError(f"Attention {node.name} concatenates a past cache inside the op; the kv-cache form "
                               "takes it (the form is chosen so without --form)")
        shape = op_shape(node, types)
        mask = opt(node, MASK)
        mask_dtype = None
        if mask is not None:
            elem = types.get(mask.name, (None, None))[0]
            mask_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype(mask.dtype or np.float32)
        offset = tensors[offsets[name]] if name in offsets else None
        needs_4d = (shape.head != shape.v_head) or window(node) != (-1, -1) or \
            (node.attrs.get("is_causal", 0) and (mask is not None or offset is not None))
        if needs_4d:
            to_bhnd(graph, node, shape)
        given_mask = mask is not None and any(mask is t for t in graph.inputs)
        note = one_head_size(graph, node, shape)
        folding, folded = one_mask(graph, node, mask_dtype, offset)
        notes += [n for n in (note, folding) if n]
        nonpad = opt(node, NONPAD)
        if nonpad is not None or given_mask or folded is not None:  # rows that may be left without a key
            to_bhnd(graph, node, shape)
            elem = types.get(node.outputs[0].name, (None, None))[0] or types.get(node.inputs[0].name, (None, None))[0]
            notes.append(guard_empty_rows(graph, node, helper.tensor_dtype_to_np_dtype(elem) if elem else np.float32,
                                          mask, folded))
        unchanged = mask is not None and opt(node, MASK) is mask
        known = types.get(mask.name, (None, None))[1] if unchanged else None  # type: ignore[union-attr]
        notes += [n for n in (mask_4d(graph, node, len(known) if known is not None else None),) if n]
        if nonpad is not None:
            causal = "lower_right" if node.attrs.get("is_causal", 0) else "none"
            read = opt(node, MASK)  # the mask IAttention reads with the lengths, if any
            lowerings.append(AttentionLowering(node.name, (node.name,), causal, kv_lengths=nonpad.name,
                                               mask=read.name if read is not None else None))
    return lowerings, notes
