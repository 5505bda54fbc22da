"""Token inputs packed end to end, shared by the packed and kv-cache forms.

The [batch, seq] token inputs (input_ids, position_ids) become [1, total_tokens]; a cu_seqlens input
[B+1] says where each row starts; padding masks leave the inputs (whatever else read them sees a
sequence without padding). Per token the graph then knows its row (`row`) and its index in that row
(`index`); per row its number of tokens (`lengths`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...contract import CU_SEQLENS
from ...errors import TrtattnError
from ...graph.emit import Emitter
from ...graph.roles import RoleKind

MASK_KINDS = (RoleKind.PADDING_MASK, RoleKind.ONES_MASK)
TOKEN_KINDS = (RoleKind.TOKEN_IDS, RoleKind.POSITION_IDS, *MASK_KINDS)
TOTAL = "total_tokens"


@dataclass
class Tokens:
    ids: gs.Tensor  # [1, T]
    positions: gs.Tensor | None  # [1, T] when the model takes positions
    cu: gs.Tensor  # the cu_seqlens input, int32 [B+1]
    cu64: gs.Tensor
    token: gs.Tensor  # [T] int64: 0..T-1
    row: gs.Tensor  # [T] int64: the row each token belongs to
    index: gs.Tensor  # [T] int64: its index within that row
    lengths: gs.Tensor  # [B] int64: tokens per row


def pack_tokens(graph: gs.Graph, model: onnx.ModelProto, emit: Emitter, form: str, keep=()) -> Tokens:
    """`keep`: [batch, seq] inputs over another sequence than the tokens' (an encoder's padding mask), left as
    they are."""
    from ...graph.roles import input_specs

    specs = {s.name: s for s in input_specs(model)}
    kinds = {t.name: specs[t.name].kind for t in graph.inputs if t.name in specs}
    tokens = [t for t in graph.inputs if kinds.get(t.name) in TOKEN_KINDS and t.shape is not None and len(t.shape) == 2
              and t.name not in keep]
    ids = next((t for t in tokens if kinds[t.name] is RoleKind.TOKEN_IDS), None)
    if ids is None:
        raise TrtattnError(f"the {form} form needs token inputs [batch, seq] (input_ids); this model has none")
    masks = [t for t in tokens if kinds[t.name] in MASK_KINDS]
    positions = next((t for t in tokens if kinds[t.name] is RoleKind.POSITION_IDS), None)
    for t in tokens:
        t.shape = [1, TOTAL]
    cu = gs.Variable(CU_SEQLENS, dtype=np.int32, shape=["batch+1"])
    total = emit.dim(ids, 1)
    t_idx = emit("Range", [emit.const(0, np.int64), total, emit.const(1, np.int64)], dtype=np.int64, name="token")
    cu64 = emit.cast(cu, np.int64)
    starts = emit("Slice", [cu64, emit.const([0], np.int64), emit.const([-1], np.int64)], dtype=np.int64)
    ends = emit("Slice", [cu64, emit.const([1], np.int64), emit.const([2 ** 62], np.int64)], dtype=np.int64)
    after = emit("GreaterOrEqual", [emit("Unsqueeze", [t_idx, emit.const([1], np.int64)], dtype=np.int64),
                                    emit("Unsqueeze", [ends, emit.const([0], np.int64)], dtype=np.int64)], dtype=np.bool_)
    row = emit("ReduceSum", [emit.cast(after, np.int64), emit.const([1], np.int64)], {"keepdims": 0}, dtype=np.int64,
               name="row")
    index = emit("Sub", [t_idx, emit("Gather", [cu64, row], {"axis": 0}, dtype=np.int64)], dtype=np.int64, name="index")
    lengths = emit("Sub", [ends, starts], dtype=np.int64, name="lengths")
    for m in masks:  # consumers left after the rewrite see no padding
        ones = emit("ConstantOfShape", [emit("Shape", [ids], dtype=np.int64)],
                    {"value": gs.Constant("one", np.ones(1, dtype=m.dtype or np.int64))}, dtype=m.dtype, name="no_padding")
        for consumer in list(m.outputs):
            for i, x in enumerate(consumer.inputs):
                if x is m:
                    consumer.inputs[i] = ones
    graph.inputs = [t for t in graph.inputs if t not in masks] + [cu]
    return Tokens(ids, positions, cu, cu64, t_idx, row, index, lengths)


def per_token_outputs(graph: gs.Graph, skip=()) -> None:
    """Outputs [B, S, ...] become [1, total_tokens, ...] (names in `skip`, e.g. caches, keep theirs)."""
    for o in graph.outputs:
        if o.name not in skip and o.shape is not None and len(o.shape) >= 2:
            o.shape = [1, TOTAL] + list(o.shape[2:])


def batch_from_tokens(graph: gs.Graph, tokens: Tokens, emit: Emitter) -> None:
    """Exporters read the batch size from any input that has it (dynamo: a cache's axis 0). With tokens
    packed [1, T], the token side's batch is 1, not the caches' B: such reads take the tokens' instead
    (a read that the caches' side needs would be caught by the form's verification)."""
    token_inputs = {t.name for t in (tokens.ids, tokens.positions) if t is not None}
    batch = None
    for n in [n for n in graph.nodes if n.op == "Shape" and n.inputs and n.inputs[0] in graph.inputs]:
        if n.inputs[0].name in token_inputs or n.inputs[0].name == tokens.cu.name:
            continue
        start, end = n.attrs.get("start", 0), n.attrs.get("end")
        if start == 0 and end == 1:
            batch = batch if batch is not None else emit.shape_slice(tokens.ids, 0, 1)
            for consumer in list(n.outputs[0].outputs):
                for i, x in enumerate(consumer.inputs):
                    if x is n.outputs[0]:
                        consumer.inputs[i] = batch
