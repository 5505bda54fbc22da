"""packed form: encoders and cacheless decoders run on packed tokens [1, T] with `cu_seqlens` [B+1]
instead of a padding mask; positions restart per sequence. In ONNX each attention reads a block-diagonal
mask (causal within a block where the site is causal); IAttention says the same with PACKED_NHD query
and key/value and the cumulative lengths (lowering.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...errors import TrtattnError
from ...graph.dependence import depends_on_input_values
from ...graph.emit import Emitter, export_like
from ...graph.external import set_session_folder
from ...site import CacheKind, SiteKind
from .lowering import AttentionLowering
from .tokens import pack_tokens, per_token_outputs


def packed_form(model: onnx.ModelProto, reports) -> tuple[onnx.ModelProto, list[AttentionLowering]]:
    """Tokens of all sequences end to end ([1, T]) with cu_seqlens [B+1]. Returns the model and one
    lowering per Attention node."""
    for r in reports:
        site = r.site
        if site.kind != SiteKind.SELF or site.cache != CacheKind.NONE:
            raise TrtattnError(f"site {site.name}: the packed form takes encoders and cacheless decoders; this is "
                               + ("attention over a KV cache" if site.cache == CacheKind.CONCAT else
                                  "attention over static K/V read from graph inputs"
                                  if site.cache == CacheKind.CROSS_STATIC else
                                  "cross-attention" if site.kind == SiteKind.CROSS else
                                  "attention whose Q and K are graph inputs (nothing says they are one sequence's "
                                  "tokens, which packing needs)"))
        if r.bias or site.window or r.pattern not in ("none", "causal"):
            raise TrtattnError(f"site {site.name}: a packed IAttention takes sequence lengths and a causal flag, not "
                               + ("a bias" if r.bias else f"a {r.pattern} mask"))
    graph = gs.import_onnx(model)
    emit = Emitter(graph, "trtattn/packed")
    tokens = pack_tokens(graph, model, emit, "packed")
    t_idx = tokens.token
    same = emit("Equal", [emit("Unsqueeze", [tokens.row, emit.const([1], np.int64)], dtype=np.int64),
                          emit("Unsqueeze", [tokens.row, emit.const([0], np.int64)], dtype=np.int64)], dtype=np.bool_)
    earlier = emit("LessOrEqual", [emit("Unsqueeze", [t_idx, emit.const([0], np.int64)], dtype=np.int64),
                                   emit("Unsqueeze", [t_idx, emit.const([1], np.int64)], dtype=np.int64)], dtype=np.bool_)
    block = emit("Unsqueeze", [same, emit.const([0, 1], np.int64)], dtype=np.bool_, name="block_mask")
    block_causal = emit("Unsqueeze", [emit("And", [same, earlier], dtype=np.bool_), emit.const([0, 1], np.int64)],
                        dtype=np.bool_, name="block_causal_mask")
    if tokens.positions is None:
        _replace_position_lookups(graph, model, emit, tokens.index)
    nodes = {n.name: n for n in graph.nodes}
    lowerings = []
    for r in reports:
        attn = nodes[r.attention_node]
        is_causal = r.pattern == "causal" or bool(attn.attrs.get("is_causal", 0))
        while len(attn.inputs) > 3:
            attn.inputs.pop()
        attn.inputs.append(block_causal if is_causal else block)
        attn.attrs["is_causal"] = 0
        lowerings.append(AttentionLowering(attn.name, (attn.name,), "upper_left" if is_causal else "none",
                                           q_lengths=tokens.cu.name, kv_lengths=tokens.cu.name, query_form="packed",
                                           kv_form="packed"))
    graph.cleanup(remove_unused_graph_inputs=True)
    per_token_outputs(graph)
    return export_like(graph, model), lowerings


def _replace_position_lookups(graph: gs.Graph, model: onnx.ModelProto, emit: Emitter, pos: gs.Tensor) -> None:
    """Embedding lookups whose indices are 0..S-1 computed from the shape (learned absolute
    positions) read the per-sequence positions instead."""
    from ...graph.feeds import make_feeds

    inputs = {t.name for t in graph.inputs}
    candidates = [n for n in graph.nodes if n.op == "Gather" and isinstance(n.inputs[0], gs.Constant)
                  and n.inputs[0].values.ndim == 2 and not isinstance(n.inputs[1], gs.Constant)
                  and not depends_on_input_values(n.inputs[1], inputs)]
    if not candidates:
        return
    import onnxruntime as ort

    probe = gs.import_onnx(model)
    wanted = [probe.tensors()[n.inputs[1].name] for n in candidates]
    for t in wanted:
        t.dtype = t.dtype or np.int64
    probe.outputs = wanted
    probe.cleanup()
    options = ort.SessionOptions()
    set_session_folder(options, model)  # weights left on disk: from the model's folder, not the working directory
    sess = ort.InferenceSession(gs.export_onnx(probe).SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = make_feeds(model)
    needed = {i.name for i in sess.get_inputs()}
    values = sess.run(None, {k: v for k, v in feeds.items() if k in needed})
    for node, value in zip(candidates, values):
        value = np.asarray(value)
        seq = value.shape[-1] if value.ndim else 0
        if seq > 1 and (value.reshape(-1, seq) == np.arange(seq)).all():
            node.inputs[1] = emit("Unsqueeze", [emit("Cast", [pos], {"to": onnx.helper.np_dtype_to_tensor_dtype(value.dtype)},
                                                     dtype=value.dtype), emit.const([0], np.int64)],
                                  dtype=value.dtype, name="positions")
