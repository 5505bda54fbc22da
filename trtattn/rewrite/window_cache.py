"""GroupQueryAttention's fixed window buffer (sliding_window_cache=1, GenAI's Gemma 2/3 sliding layers) as the
standard Attention op over the buffer plus the new keys, and a gather that writes the buffer back.

The kernel's contract, measured on ONNX Runtime 1.32 (independent probes and chained decoding, keys tagged with
their positions) with a buffer of C >= W = local_window_size slots (the kernel refuses fewer; GenAI gives CPU
W + 16 or max_length):
- after L keys the buffer holds r(L) of them, left-aligned: r(L) = L below W, else W + (L - W) mod (C - W + 1):
  the kernel appends until the buffer is full, then compacts to the last W keys and appends again (with C = W,
  r = min(L, W)). Slot j of a past of past_len keys is absolute position past_len - r(past_len) + j (past_len:
  the row's absolute past, seqlens_k + 1 - S, also what rotary uses);
- query i (absolute past_len + i) sees the keys at absolute positions above past_len + i - W;
- the present [B, Nkv, C, H] is the last r(past_len + S) keys of concat(buffer[:r(past_len)], new), left-aligned;
  the slots beyond are unspecified (the kernel leaves stale memory there). Verification therefore runs at C = W
  and a total of at least W (graph/op_dims.py), where r = W and every slot is defined.
In buffer slots: the standard op's keys are the C slots then the S new keys; a slot j < C is seen where j < v
and j > v + i - W (v = r(past_len)), which is the sliding mask of group_query._keep with v in place of the
absolute past.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import TrtattnError
from ..graph.emit import Emitter


def window_size(node: gs.Node, past_k, where: str) -> int:
    """The window (local_window_size), refusing what the contract above does not cover."""
    size = int(node.attrs.get("local_window_size", -1))
    if size <= 0:
        raise TrtattnError(f"{where} keeps a window buffer (sliding_window_cache) without a local_window_size: "
                           "not converted")
    if past_k is None:
        raise TrtattnError(f"{where} keeps a window buffer (sliding_window_cache) without past_key/past_value: "
                           "not converted")
    slots = past_k.shape[2] if past_k.shape and len(past_k.shape) == 4 else None
    if isinstance(slots, int) and slots < size:
        raise TrtattnError(f"{where}: its window buffer {past_k.name} has {slots} slots, fewer than local_window_size "
                           f"{size} (which the kernel refuses): not converted")
    return size


def period(emit: Emitter, past, size: int) -> gs.Variable:
    """C - W + 1, the buffer's compaction period (0-D int64); a buffer of fewer than W slots fails in a node
    named after it (ConstantOfShape of a negative length) rather than being read with another layout."""
    i64 = np.int64
    slack = emit("Sub", [emit.shape_slice(past, 2, 3), emit.const([size], i64)], dtype=i64)
    room = emit("ConstantOfShape", [slack], dtype=np.float32,  # C - W zeros: a negative length fails here
                name=f"{past.name.replace('/', '_')}_has_at_least_{size}_slots")
    return emit("Add", [emit("Size", [room], dtype=i64), emit.const(1, i64)], dtype=i64)


def resident(emit: Emitter, length, size: int, cycle) -> gs.Variable:
    """r(L) [B]: the keys the buffer holds after `length` [B] keys (see the module doc)."""
    i64 = np.int64
    w = emit.const(size, i64)
    wrapped = emit("Add", [w, emit("Mod", [emit("Sub", [length, w], dtype=i64), cycle], dtype=i64)], dtype=i64)
    return emit("Where", [emit("Less", [length, w], dtype=np.bool_), length, wrapped], dtype=i64, name="resident")


def write_back(emit: Emitter, concat, out, past, valid, new, kept, dtype) -> None:
    """`out` [B, Nkv, C, H] = the last `kept` [B] keys of concat(buffer[:v], new[:n]) left-aligned, gathered from
    the standard op's present `concat` (the C slots of `past` then the S new keys; `valid` [B]: v, `new` [B]: n);
    slots beyond repeat the last key of `concat` (unspecified in the kernel)."""
    i64 = np.int64

    def column(t):  # [B] -> [B, 1]
        return emit("Unsqueeze", [t, emit.const([1], i64)], dtype=i64)

    slots = emit.dim(past, 2)
    first = emit("Sub", [emit("Add", [valid, new], dtype=i64), kept], dtype=i64)  # [B]: the first key kept
    u = emit("Add", [column(first), emit("Range", [emit.const(0, i64), slots, emit.const(1, i64)], dtype=i64)],
             dtype=i64)  # [B, C]: the u-th of the valid keys
    at = emit("Where", [emit("Less", [u, column(valid)], dtype=np.bool_), u,
                        emit("Add", [u, emit("Sub", [slots, column(valid)], dtype=i64)], dtype=i64)],
              dtype=i64)  # a past key at its slot, a new key n at C + n
    last = emit("Sub", [emit.dim(concat, 2), emit.const(1, i64)], dtype=i64)
    at = emit("Unsqueeze", [emit("Min", [at, last], dtype=i64), emit.const([1, 3], i64)], dtype=i64)  # [B, 1, C, 1]
    emit("GatherElements", [concat, emit("Expand", [at, emit("Shape", [past], dtype=i64)], dtype=i64)], {"axis": 2},
         dtype=dtype, name="window_present")
    emit.graph.nodes[-1].outputs = [out]
