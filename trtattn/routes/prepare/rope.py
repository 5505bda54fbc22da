"""padded form: every rotate-half RoPE (Mul/Neg/Slice/Concat/Add) as the ONNX RotaryEmbedding op, with
the cos/sin tables taken from the graph, so that it becomes an IRotaryEmbeddingLayer."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.emit import Emitter, export_like
from ...site import AttentionSite, CacheKind, RopeKind


def rope_to_ops(model: onnx.ModelProto, sites: list[AttentionSite]) -> tuple[onnx.ModelProto, int]:
    """Rewrite rotate-half RoPE (Mul/Neg/Slice/Concat/Add) into ONNX RotaryEmbedding ops."""
    todo = [s for s in sites if s.rope is not None and s.rope.kind == RopeKind.HALF_SPLIT and s.source == "pattern"
            and not s.rope.op_caches]  # those fuse wrote as RotaryEmbedding ops already
    if not todo:
        return model, 0
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    tables: dict[tuple, tuple] = {}  # (cos, sin, rotary dim) -> the tables as RotaryEmbedding takes them
    count = 0
    for site in todo:
        rope = site.rope
        assert rope is not None  # todo holds sites with a rope
        k_out = site.new_key if site.cache == CacheKind.CONCAT else site.key
        for x_name, out_name in ((rope.q_input, site.query), (rope.k_input, k_out)):
            out = tensors.get(out_name)
            if out is None or not out.inputs or out.inputs[0].op == "RotaryEmbedding":
                continue
            emit = Emitter(graph, f"trtattn/rope/{site.name}")
            x = tensors[x_name]
            key = (rope.cos, rope.sin, rope.rotary_dim)
            if key not in tables:
                tables[key] = (_half_table(emit, tensors[rope.cos], x, rope.rotary_dim),
                               _half_table(emit, tensors[rope.sin], x, rope.rotary_dim))
            cos, sin = tables[key]
            head = site.head_size or 0
            dim = 0 if rope.rotary_dim in (0, head) else rope.rotary_dim
            out.inputs.clear()
            graph.nodes.append(gs.Node("RotaryEmbedding", f"trtattn/rope/{site.name}/{'q' if x_name == rope.q_input else 'k'}",
                                       {"interleaved": 0, "rotary_embedding_dim": dim}, inputs=[x, cos, sin], outputs=[out]))
            count += 1
    return export_like(graph, model), count


def _half_table(emit: Emitter, table: gs.Tensor, x: gs.Tensor, rotary_dim: int) -> gs.Tensor:
    """HF's cos/sin ([B|1, 1, S, R] duplicated halves) -> RotaryEmbedding's [B, S, R/2]."""
    half = emit("Slice", [table, emit.const([0], np.int64), emit.const([rotary_dim // 2], np.int64),
                          emit.const([-1], np.int64)], dtype=table.dtype, name="half")
    shape = emit("Shape", [half], dtype=np.int64)
    tail = emit("Slice", [shape, emit.const([-2], np.int64), emit.const([2 ** 62], np.int64)], dtype=np.int64)
    flat = emit("Reshape", [half, emit("Concat", [emit.const([-1], np.int64), tail], {"axis": 0}, dtype=np.int64)],
                dtype=table.dtype, name="rows")
    batch = emit("Slice", [emit("Shape", [x], dtype=np.int64), emit.const([0], np.int64), emit.const([1], np.int64)],
                 dtype=np.int64)
    target = emit("Concat", [batch, emit.const([1, 1], np.int64)], {"axis": 0}, dtype=np.int64)
    return emit("Expand", [flat, target], dtype=table.dtype, name="per_row")
