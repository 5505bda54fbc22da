"""GroupQueryAttention's fixed window buffer (sliding_window_cache=1, GenAI's Gemma 2/3 sliding layers) as the
standard Attention op over the buffer plus the new keys, and a gather that writes the buffer back.

The kernel's contract, measured on ONNX Runtime 1.32 with a buffer of W = local_window_size slots (the kernel
refuses fewer; more behaves in a way not pinned down, so the converted model refuses any other size by name):
- the buffer holds v = min(past_len, W) valid keys, left-aligned: slot j is absolute position past_len - v + j
  (past_len: the row's absolute past, seqlens_k + 1 - S, also what rotary uses);
- query i (absolute past_len + i) sees the keys at absolute positions above past_len + i - W;
- the present [B, Nkv, W, H] is the last min(v + S, W) keys of concat(buffer[:v], new), left-aligned; the slots
  beyond are unspecified (the kernel leaves stale memory there), so verification only runs at lengths where
  v + S >= W (graph/op_dims.py: the total length is at least W).
In buffer indices: the standard op's keys are the W slots then the S new keys; a slot j < W is seen where j < v
and j > v + i - W, which is the sliding mask of group_query._keep with v in place of the absolute past.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import TrtattnError
from ..graph.emit import Emitter


def window_size(node: gs.Node, past_k, where: str) -> int:
    """The buffer's slots (local_window_size), refusing what the contract above does not cover."""
    size = int(node.attrs.get("local_window_size", -1))
    if size <= 0:
        raise TrtattnError(f"{where} keeps a window buffer (sliding_window_cache) without a local_window_size: "
                           "not converted")
    if past_k is None:
        raise TrtattnError(f"{where} keeps a window buffer (sliding_window_cache) without past_key/past_value: "
                           "not converted")
    slots = past_k.shape[2] if past_k.shape and len(past_k.shape) == 4 else None
    if isinstance(slots, int) and slots != size:
        raise TrtattnError(f"{where}: its window buffer {past_k.name} has {slots} slots, not local_window_size "
                           f"{size} (the kernel's buffer of another size is not pinned down): not converted")
    return size


def buffer(emit: Emitter, past, size: int, dtype) -> gs.Variable:
    """`past` [B, Nkv, P, H] reshaped to [B, Nkv, W, H]: a feed of any other P fails in this named node rather
    than being read with another layout."""
    i64 = np.int64
    shape = emit("Concat", [emit.shape_slice(past, 0, 2), emit.const([size], i64), emit.shape_slice(past, 3, 4)],
                 {"axis": 0}, dtype=i64)
    return emit("Reshape", [past, shape], dtype=dtype, name=f"{past.name.replace('/', '_')}_has_{size}_slots")


def valid_slots(emit: Emitter, row_past, size: int) -> gs.Variable:
    """v = min(past_len, W) [B]: the buffer slots that hold keys."""
    return emit("Min", [row_past, emit.const(size, np.int64)], dtype=np.int64, name="valid_slots")


def write_back(emit: Emitter, concat, out, valid, row_new, size: int, dtype) -> None:
    """`out` [B, Nkv, W, H] = the last min(v + n, W) keys of concat(buffer[:v], new[:n]) left-aligned, gathered
    from the standard op's present `concat` (the W slots then the S new keys); slots beyond repeat the last key
    of `concat` (unspecified in the kernel)."""
    i64 = np.int64

    def column(t):  # [B] -> [B, 1]
        return emit("Unsqueeze", [t, emit.const([1], i64)], dtype=i64)

    keys = emit("Add", [valid, row_new], dtype=i64)  # [B] valid keys in the concat
    first = emit("Max", [emit("Sub", [keys, emit.const(size, i64)], dtype=i64), emit.const(0, i64)], dtype=i64)
    u = emit("Add", [column(first), emit.const(np.arange(size), i64)], dtype=i64)  # [B, W]: the u-th valid key
    at = emit("Where", [emit("Less", [u, column(valid)], dtype=np.bool_), u,
                        emit("Add", [u, emit("Sub", [emit.const(size, i64), column(valid)], dtype=i64)], dtype=i64)],
              dtype=i64)  # a past key at its slot, a new key n at W + n
    last = emit("Sub", [emit.dim(concat, 2), emit.const(1, i64)], dtype=i64)
    at = emit("Unsqueeze", [emit("Min", [at, last], dtype=i64), emit.const([1, 3], i64)], dtype=i64)  # [B, 1, W, 1]
    shape = emit("Concat", [emit.shape_slice(concat, 0, 2), emit.const([size], i64), emit.shape_slice(concat, 3, 4)],
                 {"axis": 0}, dtype=i64)
    emit("GatherElements", [concat, emit("Expand", [at, shape], dtype=i64)], {"axis": 2}, dtype=dtype,
         name="window_present")
    emit.graph.nodes[-1].outputs = [out]
