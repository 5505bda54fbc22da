"""Forms of a fused model, each still standard ONNX and verified on ONNX Runtime before TensorRT
sees it. The network builder lowers their ops one to one (trt/plan.py, trt/lower.py).

padded    the fused model, with every rotate-half RoPE rewritten into the ONNX RotaryEmbedding op
          (cos/sin tables taken from the graph) so that it becomes an IRotaryEmbeddingLayer.
kv-cache  decoders whose K/V were concatenated with a past cache read a preallocated cache
          instead: TensorScatter (opset 24) writes the new K/V at each row's `cache_write_index`,
          Attention reads the whole cache with nonpad_kv_seqlen = write index + new tokens and
          is_causal (offset-aware: lower-right). The cache outputs alias the cache inputs. Each row
          keeps its own length, so there is no padding mask: the attention_mask input goes.
packed    encoders and cacheless decoders run on packed tokens [1, T] with `cu_seqlens` [B+1]
          instead of a padding mask; positions restart per sequence; attention sees a block-
          diagonal mask, which IAttention expresses as PACKED_NHD with cumulative lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import version_converter

from .errors import TrtattnError
from .match.mask import _Emitter
from .site import AttentionSite, CacheKind, CausalKind, RopeKind

WRITE_INDEX = "cache_write_index"
CU_SEQLENS = "cu_seqlens"


@dataclass
class Derived:
    model: onnx.ModelProto
    sites: dict = field(default_factory=dict)  # Attention node -> AttentionSite
    packed_lengths: str | None = None
    causal: dict = field(default_factory=dict)  # Attention node -> alignment, where the form's op does not say
    verification: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def derive(form: str, original: onnx.ModelProto, fused, *, dims=None, progress=None) -> Derived:
    from .report import Progress

    progress = progress or Progress(enabled=False)
    reports = [r for r in fused.reports if r.status == "fused"]
    sites = {r.attention_node: r.site for r in reports}
    with progress.step("rewriting RoPE into RotaryEmbedding ops"):
        model, ropes = rope_to_ops(fused.model, [r.site for r in reports])
    derived = Derived(model, sites, notes=[f"{ropes} RoPE rotations as RotaryEmbedding ops"] if ropes else [])
    if form == "kv-cache":
        with progress.step("deriving the KV-cache form (TensorScatter + Attention with cache lengths)"):
            derived.model = kv_cache_form(derived.model, reports)
    elif form == "packed":
        with progress.step("deriving the packed form (cu_seqlens, restarting positions)"):
            derived.model, derived.causal = packed_form(derived.model, reports)
            derived.packed_lengths = CU_SEQLENS
    if form == "padded" and not ropes:  # the fused model itself, verified by fuse already
        derived.verification = fused.verification
        return derived
    with progress.step(f"verifying the {form} form against the original on ONNX Runtime"):
        derived.verification = verify_form(form, original, derived.model, [r.site for r in reports], dims=dims)
    if not derived.verification["passed"]:
        raise TrtattnError(f"the {form} form does not match the original model on ONNX Runtime "
                           f"(max abs error {derived.verification.get('max_abs_err')}); not building it")
    return derived


def _export(graph: gs.Graph, like: onnx.ModelProto, opset: int | None = None) -> onnx.ModelProto:
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = gs.export_onnx(graph)
    model.ir_version = like.ir_version
    del model.metadata_props[:]
    model.metadata_props.extend(list(like.metadata_props))
    if opset:
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = max(imp.version, opset)
    return model


# ---------------------------------------------------------------- RoPE
def rope_to_ops(model: onnx.ModelProto, sites: list[AttentionSite]) -> tuple[onnx.ModelProto, int]:
    """Rewrite rotate-half RoPE (Mul/Neg/Slice/Concat/Add) into ONNX RotaryEmbedding ops."""
    todo = [s for s in sites if s.rope is not None and s.rope.kind == RopeKind.HALF_SPLIT and s.source == "pattern"]
    if not todo:
        return model, 0
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    tables: dict[str, tuple] = {}
    count = 0
    for site in todo:
        rope = site.rope
        k_out = site.new_key if site.cache == CacheKind.CONCAT else site.key
        for x_name, out_name in ((rope.q_input, site.query), (rope.k_input, k_out)):
            out = tensors.get(out_name)
            if out is None or not out.inputs or out.inputs[0].op == "RotaryEmbedding":
                continue
            emit = _Emitter(graph, f"trtattn/rope/{site.name}")
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
    return _export(graph, model), count


def _half_table(emit: _Emitter, table: gs.Tensor, x: gs.Tensor, rotary_dim: int) -> gs.Tensor:
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


# ---------------------------------------------------------------- KV cache
def kv_cache_form(model: onnx.ModelProto, reports) -> onnx.ModelProto:
    cached = [r for r in reports if r.site.cache == CacheKind.CONCAT]
    if not cached:
        raise TrtattnError("the kv-cache form needs a model whose K/V are concatenated with a past cache "
                           "(past_key_values inputs); this one has none")
    for r in cached:
        if r.bias or r.site.window or r.pattern not in ("causal",) or r.site.causal not in (CausalKind.LOWER_RIGHT,
                                                                                             CausalKind.UPPER_LEFT):
            raise TrtattnError(f"site {r.site.name}: the kv-cache form needs a causal mask (with padding at most); "
                               f"this one is {r.pattern}" + (" with a bias" if r.bias else "")
                               + (f" with window {r.site.window}" if r.site.window else ""))
    model = version_converter.convert_version(model, 24) if _opset(model) < 24 else model
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    nodes = {n.name: n for n in graph.nodes}
    write_index = gs.Variable(WRITE_INDEX, dtype=np.int64, shape=["batch"])
    graph.inputs.append(write_index)
    for r in cached:
        site, attn = r.site, nodes[r.attention_node]
        emit = _Emitter(graph, f"trtattn/kv/{site.name}")
        for past, new in ((site.past_key, site.new_key), (site.past_value, site.new_value)):
            cache_in = tensors[past]
            # the past input becomes the preallocated cache: [B, N_kv, max_cache, H]
            if cache_in.shape is not None and len(cache_in.shape) == 4:
                cache_in.shape = [cache_in.shape[0], cache_in.shape[1], "max_cache", cache_in.shape[3]]
            concat_out = _concat_output(graph, cache_in, tensors[new])
            concat_out.inputs.clear()
            # the concat's output (what the Attention and the present output read) is now the updated cache
            graph.nodes.append(gs.Node("TensorScatter", f"trtattn/kv/{site.name}/update_{'k' if past == site.past_key else 'v'}",
                                       {"axis": 2, "mode": "linear"}, inputs=[cache_in, tensors[new], write_index],
                                       outputs=[concat_out]))
            if concat_out.shape is not None and len(concat_out.shape) == 4:
                concat_out.shape = [concat_out.shape[0], concat_out.shape[1], "max_cache", concat_out.shape[3]]
        q = attn.inputs[0]
        new_len = emit("Gather", [emit("Shape", [q], dtype=np.int64), emit.const(2, np.int64)], {"axis": 0},
                       dtype=np.int64)
        lengths = emit("Add", [write_index, new_len], dtype=np.int64, name="kv_lengths")
        # no mask: each row's length and the offset-aware causal alignment say it all
        while len(attn.inputs) > 3:  # drop the mask (gs keeps producer/consumer links: pop, don't slice)
            attn.inputs.pop()
        attn.inputs.extend([gs.Variable.empty(), gs.Variable.empty(), gs.Variable.empty(), lengths])
        attn.attrs["is_causal"] = 1
    graph.cleanup(remove_unused_graph_inputs=True)
    caches = {r.site.past_key for r in cached} | {r.site.past_value for r in cached}
    for n in graph.nodes:  # the cache's length is its capacity now, not the number of past tokens
        if n.op == "Shape" and n.inputs[0].name in caches and _reads_sequence_axis(n):
            raise TrtattnError(f"node {n.name} reads the length of the past cache {n.inputs[0].name} (positions or "
                               "masks derived from it); in the kv-cache form that is the capacity: give the model "
                               "position_ids (and cache positions) as inputs instead")
    return _export(graph, model, 24)


def _reads_sequence_axis(shape: gs.Node, axis: int = 2, rank: int = 4) -> bool:
    """Does this Shape of a cache [B, N, S, H] feed anything the sequence length reaches?
    (dynamo reads the batch size from any tensor that has it: that is harmless)"""
    start = shape.attrs.get("start", 0) % rank
    end = shape.attrs.get("end", rank)
    end = end % rank if end < 0 else min(end, rank)
    if not start <= axis < end:
        return False
    for c in shape.outputs[0].outputs:
        if c.op == "Gather" and isinstance(c.inputs[1], gs.Constant):
            if (np.asarray(c.inputs[1].values).reshape(-1) % rank + start != axis).all():
                continue
        return True
    return False


def _concat_output(graph: gs.Graph, past: gs.Tensor, new: gs.Tensor) -> gs.Tensor:
    for n in graph.nodes:
        if n.op == "Concat" and len(n.inputs) == 2 and n.inputs[1] is new and _passes_to(n.inputs[0], past):
            return n.outputs[0]
    raise TrtattnError(f"cannot find the Concat of the past cache {past.name} and {new.name}")


def _passes_to(t: gs.Tensor, target: gs.Tensor) -> bool:
    while t is not target and t.inputs and t.inputs[0].op in ("Identity", "Concat") and len(t.inputs[0].inputs) == 1:
        t = t.inputs[0].inputs[0]
    return t is target


def _opset(model: onnx.ModelProto) -> int:
    return next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)


# ---------------------------------------------------------------- packed
def packed_form(model: onnx.ModelProto, reports) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Tokens of all sequences end to end ([1, T]) with cu_seqlens [B+1]. Returns the model and, per
    Attention node, the causal alignment the packed attention keeps (the ONNX form writes it into a
    block-diagonal mask, which IAttention replaces by the lengths)."""
    from .inputs import input_specs

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
    emit = _Emitter(graph, "trtattn/packed")
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
    return _export(graph, model), causal


def _replace_position_lookups(graph: gs.Graph, model: onnx.ModelProto, emit: _Emitter, pos: gs.Tensor) -> None:
    """Embedding lookups whose indices are 0..S-1 computed from the shape (learned absolute
    positions) read the per-sequence positions instead."""
    from .inputs import make_feeds
    from .match.probe import depends_on_input_values

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


# ---------------------------------------------------------------- verification
def verify_form(form: str, original: onnx.ModelProto, derived: onnx.ModelProto, sites, *, dims=None) -> dict:
    """The form model against the original, both on ONNX Runtime through Polygraphy."""
    import contextlib

    from .verify import adapter_for, compare_models, compare_runners, runner_for

    if form == "padded":
        return compare_models(original, derived, sites, dims=dims).summary()
    adapter = adapter_for(original, [i.name for i in derived.graph.input], cache_inputs(derived))
    with contextlib.ExitStack() as stack:
        runners = [runner_for(stack, original, name="original"), runner_for(stack, derived, name=form)]
        return compare_runners(*runners, adapter, dims=dims).summary()


def pack(feeds: dict, inputs, lengths: list[int]) -> dict:
    """Padded [B, S] feeds (right padding) -> packed [1, T] feeds with cu_seqlens, for the packed
    model's inputs (names)."""
    wanted = set(inputs)
    out = {}
    for name, value in feeds.items():
        if name in wanted and value.ndim == 2:
            out[name] = np.concatenate([value[b, :n] for b, n in enumerate(lengths)])[None]
        elif name in wanted:
            out[name] = value
    out[CU_SEQLENS] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return out


def cache_inputs(model: onnx.ModelProto) -> list[str]:
    """The inputs the kv-cache form reads as preallocated caches (their sequence axis is max_cache)."""
    return [i.name for i in model.graph.input
            if any(d.dim_param == "max_cache" for d in i.type.tensor_type.shape.dim)]
