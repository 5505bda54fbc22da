"""Every form: every rotate-half RoPE (Mul/Neg/Slice/Concat/Add) as the ONNX RotaryEmbedding op, with
the cos/sin tables taken from the graph, and ONNX Runtime's com.microsoft RotaryEmbedding as the standard
op, so that each becomes an IRotaryEmbeddingLayer."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...errors import TrtattnError
from ...graph.emit import Emitter, export_like
from ...graph.rotary import OP, RotaryAttrs, is_rotary, rotary_inputs
from ...site import AttentionSite, CacheKind, RopeKind, SiteSource
from ...site_names import site_scope


def rope_to_ops(model: onnx.ModelProto, sites: list[AttentionSite]) -> tuple[onnx.ModelProto, int]:
    """Rewrite rotate-half RoPE (Mul/Neg/Slice/Concat/Add), and ONNX Runtime's com.microsoft RotaryEmbedding,
    into ONNX RotaryEmbedding ops."""
    todo = [s for s in sites if s.rope is not None and s.rope.kind == RopeKind.HALF_SPLIT and s.source == SiteSource.PATTERN
            and not s.rope.op_caches]  # those fuse wrote as RotaryEmbedding ops already
    contrib = any(n.op_type == OP and n.domain == "com.microsoft" for n in model.graph.node)
    if not todo and not contrib:
        return model, 0
    graph = gs.import_onnx(model)
    count = _contrib_to_standard(graph)
    tensors = graph.tensors()
    tables: dict[tuple, tuple] = {}  # (cos, sin, rotary dim) -> the tables as RotaryEmbedding takes them
    for site in todo:
        rope = site.rope
        assert rope is not None  # todo holds sites with a rope
        k_out = site.new_key if site.cache == CacheKind.CONCAT else site.key
        for x_name, out_name in ((rope.q_input, site.query), (rope.k_input, k_out)):
            out = tensors.get(out_name)
            if out is None or not out.inputs or is_rotary(out.inputs[0].op, out.inputs[0].domain):
                continue
            emit = Emitter(graph, site_scope(site.name, "rope"))
            x = tensors[x_name]
            key = (rope.cos, rope.sin, rope.rotary_dim)
            if key not in tables:
                tables[key] = (_half_table(emit, tensors[rope.cos], x, rope.rotary_dim),
                               _half_table(emit, tensors[rope.sin], x, rope.rotary_dim))
            cos, sin = tables[key]
            attrs = RotaryAttrs.for_head(False, rope.rotary_dim, site.head_size or 0).as_attrs()
            out.inputs.clear()
            side = "q" if x_name == rope.q_input else "k"
            graph.nodes.append(gs.Node(OP, site_scope(site.name, "rope", side), attrs, inputs=[x, cos, sin],
                                       outputs=[out]))
            count += 1
    return export_like(graph, model), count


def _contrib_to_standard(graph: gs.Graph) -> int:
    """com.microsoft RotaryEmbedding(x, position_ids [B, S], cos, sin) as the standard op (x, cos, sin,
    position_ids), the same attributes (num_heads from the tables when a 3-D x leaves it 0): TensorRT and
    AutoCast take the standard op only. A scale, packed batching or a position offset [1] is refused by name."""
    count = 0
    for n in [n for n in graph.nodes if n.op == OP and n.domain == "com.microsoft"]:
        x, cos, sin, positions = rotary_inputs(n.domain, n.inputs)
        where = f"com.microsoft:RotaryEmbedding {n.name or n.outputs[0].name}"
        if float(n.attrs.get("scale", 1.0)) != 1.0 or n.attrs.get("is_packed_batching", 0):
            raise TrtattnError(f"{where} has a scale or packed batching: the standard RotaryEmbedding has neither")
        if positions.shape is not None and len(positions.shape) != 2:
            raise TrtattnError(f"{where} takes position_ids as an offset of shape {positions.shape}: the standard "
                               "RotaryEmbedding takes them per token [B, S]")
        given = RotaryAttrs.of(n.attrs)
        heads = 0
        if x.shape is not None and len(x.shape) == 3:
            heads = given.num_heads
            if not heads:
                half, hidden = (cos.shape or [None, None])[-1], x.shape[-1]
                if not (isinstance(half, int) and isinstance(hidden, int)) or given.rotary_embedding_dim:
                    raise TrtattnError(f"{where}: its number of heads is unknown (num_heads 0)")
                heads = hidden // (2 * half)
        attrs = RotaryAttrs(given.interleaved, given.rotary_embedding_dim, heads).as_attrs()
        graph.nodes.append(gs.Node(OP, n.name or f"trtattn/rope/{n.outputs[0].name}", attrs,
                                   inputs=[x, cos, sin, positions], outputs=list(n.outputs)))
        n.inputs.clear()
        n.outputs.clear()
        count += 1
    return count


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
