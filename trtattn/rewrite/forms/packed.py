"""packed form: encoders and cacheless decoders run on packed tokens [1, T] with `cu_seqlens` [B+1]
instead of a padding mask; positions restart per sequence; attention sees a block-diagonal mask, which
IAttention expresses as PACKED_NHD with cumulative lengths."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...contract import CU_SEQLENS
from ...errors import TrtattnError
from ...graph.emit import Emitter
from ...site import CacheKind
from ...graph.emit import export_like


def packed_form(model: onnx.ModelProto, reports) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Tokens of all sequences end to end ([1, T]) with cu_seqlens [B+1]. Returns the model and, per
    Attention node, the causal alignment the packed attention keeps (the ONNX form writes it into a
    block-diagonal mask, which IAttention replaces by the lengths)."""
    from ...graph.inputs import input_specs

    for r in reports:
        site = r.site
        if site.kind.value == "cross" or site.cache != CacheKind.NONE:
            raise TrtattnError(f"site {site.name}: the packed form takes encoders and cacheless decoders; this is "
                               + ("cross-attention" if site.kind.value == "cross" else "attention over a KV cache"))
        if r.bias or site.window or r.pattern not in ("none", "causal"):
            raise TrtattnError(f"site {site.name}: a packed IAttention takes sequence lengths and a causal flag, not "
                               + ("a bias" if r.bias else f"a {r.pattern} mask"))
    specs = {s.name: s for s in input_specs(model)}
    graph = gs.import_onnx(model)
    tokens = [t for t in graph.inputs if specs.get(t.name) and specs[t.name].role.get("kind") in
              ("token_ids", "position_ids", "padding_mask", "ones_mask") and t.shape is not None and len(t.shape) == 2]
    if not any(specs[t.name].role.get("kind") == "token_ids" for t in tokens):
        raise TrtattnError("the packed form needs token inputs [batch, seq] (input_ids); this model has none")
    cu = gs.Variable(CU_SEQLENS, dtype=np.int32, shape=["batch+1"])
    emit = Emitter(graph, "trtattn/packed")
    for t in tokens:
        t.shape = [1, "total_tokens"]
    masks = [t for t in tokens if specs[t.name].role.get("kind") in ("padding_mask", "ones_mask")]
    positions = next((t for t in tokens if specs[t.name].role.get("kind") == "position_ids"), None)
    ids = next(t for t in tokens if specs[t.name].role.get("kind") == "token_ids")
    # seg[t]: which sequence token t belongs to; pos[t]: its position in that sequence
    total = emit("Gather", [emit("Shape", [ids], dtype=np.int64), emit.const(1, np.int64)], {"axis": 0}, dtype=np.int64)
    t_idx = emit("Range", [emit.const(0, np.int64), total, emit.const(1, np.int64)], dtype=np.int64, name="token")
    cu64 = emit("Cast", [cu], {"to": onnx.TensorProto.INT64}, dtype=np.int64)
    ends = emit("Slice", [cu64, emit.const([1], np.int64), emit.const([2 ** 62], np.int64)], dtype=np.int64)
    after = emit("GreaterOrEqual", [emit("Unsqueeze", [t_idx, emit.const([1], np.int64)], dtype=np.int64),
                                    emit("Unsqueeze", [ends, emit.const([0], np.int64)], dtype=np.int64)], dtype=np.bool_)
    seg = emit("ReduceSum", [emit("Cast", [after], {"to": onnx.TensorProto.INT64}, dtype=np.int64),
                             emit.const([1], np.int64)], {"keepdims": 0}, dtype=np.int64, name="sequence")
    pos = emit("Sub", [t_idx, emit("Gather", [cu64, seg], {"axis": 0}, dtype=np.int64)], dtype=np.int64, name="position")
    same = emit("Equal", [emit("Unsqueeze", [seg, emit.const([1], np.int64)], dtype=np.int64),
                          emit("Unsqueeze", [seg, emit.const([0], np.int64)], dtype=np.int64)], dtype=np.bool_)
    earlier = emit("LessOrEqual", [emit("Unsqueeze", [t_idx, emit.const([0], np.int64)], dtype=np.int64),
                                   emit("Unsqueeze", [t_idx, emit.const([1], np.int64)], dtype=np.int64)], dtype=np.bool_)
    block = emit("Unsqueeze", [same, emit.const([0, 1], np.int64)], dtype=np.bool_, name="block_mask")
    block_causal = emit("Unsqueeze", [emit("And", [same, earlier], dtype=np.bool_), emit.const([0, 1], np.int64)],
                        dtype=np.bool_, name="block_causal_mask")
    # padding masks leave the inputs: whatever else read them sees a sequence without padding
    for m in masks:
        ones = emit("ConstantOfShape", [emit("Shape", [ids], dtype=np.int64)],
                    {"value": gs.Constant("one", np.ones(1, dtype=m.dtype or np.int64))}, dtype=m.dtype, name="no_padding")
        for consumer in list(m.outputs):
            for i, x in enumerate(consumer.inputs):
                if x is m:
                    consumer.inputs[i] = ones
    graph.inputs = [t for t in graph.inputs if t not in masks] + [cu]
    if positions is None:
        _replace_position_lookups(graph, model, emit, pos)
    nodes = {n.name: n for n in graph.nodes}
    causal = {}
    for r in reports:
        attn = nodes[r.attention_node]
        is_causal = r.pattern == "causal" or bool(attn.attrs.get("is_causal", 0))
        while len(attn.inputs) > 3:
            attn.inputs.pop()
        attn.inputs.append(block_causal if is_causal else block)
        attn.attrs["is_causal"] = 0
        causal[attn.name] = "upper_left" if is_causal else "none"
    graph.cleanup(remove_unused_graph_inputs=True)
    for o in graph.outputs:
        if o.shape is not None and len(o.shape) >= 2:
            o.shape = [1, "total_tokens"] + list(o.shape[2:])
    return export_like(graph, model), causal


def _replace_position_lookups(graph: gs.Graph, model: onnx.ModelProto, emit: Emitter, pos: gs.Tensor) -> None:
    """Embedding lookups whose indices are 0..S-1 computed from the shape (learned absolute
    positions) read the per-sequence positions instead."""
    from ...graph.inputs import make_feeds
    from ...match.probe import depends_on_input_values

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
    sess = ort.InferenceSession(gs.export_onnx(probe).SerializeToString(), providers=["CPUExecutionProvider"])
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
