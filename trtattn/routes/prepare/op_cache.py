"""kv-cache form of Attention ops that take their past inside the op (past_key/past_value inputs, present_key/
present_value outputs): ONNX's own external-cache spelling of the same step, which TensorRT builds natively.

    present_key = TensorScatter(past_key, K, cache_write_index)      -> IKVCacheUpdateLayer (in place)
    Y = Attention(Q, present_key, present_value, attn_mask padded to the capacity,
                  nonpad_kv_seqlen = cache_write_index + S_new)       -> IAttention, key_value_lengths

The past inputs become preallocated caches [B, N_kv, capacity, H] that the outputs alias; each row's past
length is its write index. ONNX's causal offset over a past (past length) is the offset nonpad_kv_seqlen - Sq
gives (write index + S_new - Sq), so is_causal, windows and masks keep their meaning; the attention is
then fitted like any other (op_fit.py: lengths, LOWER_RIGHT, one mask). Not causal (cross-attention or
prefix attention over a cache) stays not causal. 3-D attention is split into heads first (the caches are
4-D). ONNX Runtime verifies the form against the original with the past at the start of each cache.

A converted GroupQueryAttention (rewrite/group_query.py) reads each row's keys from seqlens_k as a mask over
Concat(past, new); in this form each row's new keys are written at its own past length (the write index),
which is what ONNX Runtime's kernel does, ragged pasts included, so that mask becomes the row lengths. A
cache the form cannot take (a past computed in the graph, a node reading a past's length) is a listed site.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...contract import MAX_CACHE, WRITE_INDEX
from ...errors import SitesRefused, TrtattnError
from ...graph.emit import Emitter
from .kv_cache import cache_length_read, cache_length_reads
from .lowering import CacheLowering
from .op_fit import MASK, PAST_KEY, PAST_VALUE, op_shape, opt, to_bhnd

OPSET = 24  # TensorScatter and nonpad_kv_seqlen


# why ONNX Runtime's contrib ops with a cache (rewrite/microsoft.py, group_query.py) meet those refusals
CONTRIB_WHY = {
    "com.microsoft:Attention": " (com.microsoft:Attention stacks key and value in one past [2, B, N, P, H]: the "
                               "kv-cache form needs them as two cache inputs, which changes the engine's inputs)",
    "com.microsoft:MultiHeadAttention": " (unidirectional next to a key padding mask: the causal part is a mask "
                                        "placed by the past's length, to keep ONNX Runtime's filter value)",
    "com.microsoft:GroupQueryAttention": " (its sliding window or attention_bias is a mask placed by past_key's "
                                         "length; without them each row's new keys are written at its own past)",
}


def in_op_caches(model: onnx.ModelProto) -> list[str]:
    """The standard Attention nodes of the main graph that take a past cache as inputs."""
    return [n.name for n in model.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")
            and len(n.input) > PAST_KEY and n.input[PAST_KEY]]


def cache_form(graph: gs.Graph, types: dict, nodes: list[str], row_keys: frozenset[str] = frozenset()
               ) -> tuple[list[CacheLowering], list[str], dict[str, str]]:
    """Rewrite the named Attention nodes of `graph` in place (module doc): their cache lowerings, notes, and the
    nodes whose causal offset is the write index itself (Q and the new K/V may differ in length: ONNX's offset
    is the past length, not what nonpad_kv_seqlen - Sq would say) -> that input. `row_keys`: nodes whose mask
    only says which keys each row has, with is_causal (a converted GroupQueryAttention: its seqlens_k over a
    concatenated cache). In the form a row has exactly its write index + new keys, so that mask is dropped: each
    row's new keys are written at its own past length, as ONNX Runtime's kernel writes them, ragged pasts too."""
    by_name = {n.name: n for n in graph.nodes}
    notes = []
    for name in sorted(row_keys & set(nodes)):
        node = by_name[name]
        mask = opt(node, MASK)
        if mask is not None and node.attrs.get("is_causal", 0) and _of_lengths_alone(graph, mask):
            node.inputs[MASK] = gs.Variable.empty()
            notes.append(f"Attention {name}: its mask of each row's keys (seqlens_k) is the form's row lengths: "
                         f"{WRITE_INDEX} (each row's past length) + new tokens (seqlens_k, where still read, must agree)")
    if notes:
        graph.cleanup(remove_unused_graph_inputs=False)
    inputs = {t.name: t for t in graph.inputs}
    refused = refusals(graph, [by_name[name] for name in nodes])
    if refused:
        raise SitesRefused("Attention op(s) that cannot take the kv-cache form of their own caches: "
                           + "; ".join(f"{name}: {why}" for name, why in refused.items()), list(refused.items()))
    write_index = inputs.get(WRITE_INDEX)
    if write_index is None:
        past = by_name[nodes[0]].inputs[PAST_KEY] if nodes else None  # its batch dim is the model's own
        batch = past.shape[0] if past is not None and past.shape else "batch"
        write_index = gs.Variable(WRITE_INDEX, dtype=np.int64, shape=[batch])
        graph.inputs.append(write_index)
    lowerings, offsets = [], {}
    for name in nodes:
        node = by_name[name]
        if not _same_length(node, types):
            offsets[name] = WRITE_INDEX
        past_k, past_v = node.inputs[PAST_KEY], node.inputs[PAST_VALUE]  # both there (refusals)
        to_bhnd(graph, node, op_shape(node, types))
        emit = Emitter(graph, f"trtattn/cache/{name}")
        q, k, v = node.inputs[:3]
        presents = []
        for past, new, out_index, tag in ((past_k, k, 1, "key"), (past_v, v, 2, "value")):
            if past.shape is not None and len(past.shape) == 4:
                past.shape = [past.shape[0], past.shape[1], MAX_CACHE, past.shape[3]]
            given = node.outputs[out_index] if len(node.outputs) > out_index and node.outputs[out_index].name else None
            present = given or gs.Variable(f"{name}/present_{tag}", dtype=past.dtype)
            if given is not None and given.shape is not None and len(given.shape) == 4:
                given.shape = [given.shape[0], given.shape[1], MAX_CACHE, given.shape[3]]
            scatter = f"trtattn/cache/{name}/update_{tag}"
            graph.nodes.append(gs.Node("TensorScatter", scatter, {"axis": 2}, inputs=[past, new, write_index],
                                       outputs=[present]))
            lowerings.append(CacheLowering(scatter, (scatter,), past.name, new.name, WRITE_INDEX, present.name))
            presents.append(present)
        kv_lengths = emit("Add", [write_index, emit.dim(k, 2)], dtype=np.int64, name="kv_lengths")
        mask = opt(node, MASK)
        if mask is not None:
            mask = _to_capacity(emit, mask, presents[0], types)
        node.inputs = [q, *presents, mask or gs.Variable.empty(), gs.Variable.empty(), gs.Variable.empty(),
                       kv_lengths]
        qk = node.outputs[3] if len(node.outputs) > 3 and node.outputs[3].name else None  # (refused before: qk_beside.py)
        node.outputs = [node.outputs[0]] + ([gs.Variable.empty(), gs.Variable.empty(), qk] if qk is not None else [])
        notes.append(f"Attention {name}: its past cache as a preallocated cache updated in place "
                     f"({past_k.name}, {past_v.name} -> TRT_KVCacheUpdate), per-row lengths "
                     f"{WRITE_INDEX} + new tokens" + (", causal from each row's past length" if node.attrs.get("is_causal")
                                                     else ", not causal (the op has no is_causal)"))
    return lowerings, notes, offsets


def refusals(graph: gs.Graph, nodes: list[gs.Node]) -> dict[str, str]:
    """Attention node -> why its caches cannot be preallocated caches updated in place: a past computed in the
    graph (the engine takes its caches as inputs), or a node reading a past's length (the capacity in the form)."""
    inputs = {t.name for t in graph.inputs}
    why: dict[str, str] = {}
    for node in nodes:
        past_k, past_v = opt(node, PAST_KEY), opt(node, PAST_VALUE)
        if past_k is None or past_v is None:
            raise TrtattnError(f"Attention {node.name} has only one of past_key and past_value")
        computed = [p.name for p in (past_k, past_v) if p.name not in inputs]
        reads = cache_length_reads(graph, {past_k.name, past_v.name})
        if computed:
            why[node.name] = (f"its past cache {computed[0]} is computed in the graph, not an input; the kv-cache "
                              "form preallocates caches the engine takes as inputs")
        elif reads:
            why[node.name] = cache_length_read(*reads[0])
    return why


def _of_lengths_alone(graph: gs.Graph, mask: gs.Tensor) -> bool:
    """Is `mask` computed from shapes and integer inputs alone (lengths such as seqlens_k), no float input (an
    attention bias) read by value?"""
    inputs = {id(t) for t in graph.inputs}
    seen, todo = set(), [mask]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) in inputs and not np.issubdtype(np.dtype(t.dtype or np.float32), np.integer):
            return False
        for producer in t.inputs:
            if producer.op != "Shape":  # a Shape reads its input's dims, not its values
                todo.extend(producer.inputs)
    return True


def _same_length(node: gs.Node, types: dict) -> bool:
    """Do Q and the new K have one sequence length, statically (equal sizes or one dim name)?"""
    q, k = (types.get(t.name, (None, None))[1] or [] for t in node.inputs[:2])
    axis = 1 if len(q) == 3 else 2
    return len(q) > axis and len(k) > axis and q[axis] is not None and q[axis] == k[axis]


def _to_capacity(emit: Emitter, mask: gs.Tensor, cache: gs.Tensor, types: dict) -> gs.Tensor:
    """The mask over past + new keys extended to the cache's capacity with masked-out keys (ONNX pads a short
    mask so too; the row lengths mask those keys anyway)."""
    elem, shape = types.get(mask.name, (None, None))
    rank = len(shape or mask.shape or [])
    if not rank:
        raise TrtattnError(f"the mask {mask.name} has an unknown rank")
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype(mask.dtype or np.float32)
    i64 = np.int64
    missing = emit("Sub", [emit("Unsqueeze", [emit.dim(cache, 2), emit.const([0], i64)], dtype=i64),
                           emit.shape_slice(mask, rank - 1, rank)], dtype=i64)
    pads = emit("Concat", [emit.const([0] * (2 * rank - 1), i64), missing], {"axis": 0}, dtype=i64)
    value = np.zeros((), dtype) if dtype == np.bool_ else np.full((), -np.inf, dtype)
    return emit("Pad", [mask, pads, emit.const(value, dtype)], dtype=dtype, name="mask_to_capacity")
