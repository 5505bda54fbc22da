"""kv-cache form: decoders whose K/V were concatenated with a past cache read a preallocated cache
instead. TensorScatter (opset 24) writes the new K/V at each row's `cache_write_index`; Attention reads
the whole cache with nonpad_kv_seqlen = write index + new tokens and is_causal (offset-aware:
lower-right). The cache outputs alias the cache inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...contract import MAX_CACHE, WRITE_INDEX
from ...errors import TrtattnError
from ...graph.emit import Emitter
from ...graph.shapes import upgrade_opset
from ...site import CacheKind, CausalKind
from ...graph.emit import export_like


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
    model = upgrade_opset(model, 24)
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    nodes = {n.name: n for n in graph.nodes}
    write_index = gs.Variable(WRITE_INDEX, dtype=np.int64, shape=["batch"])
    graph.inputs.append(write_index)
    for r in cached:
        site, attn = r.site, nodes[r.attention_node]
        emit = Emitter(graph, f"trtattn/kv/{site.name}")
        for past, new in ((site.past_key, site.new_key), (site.past_value, site.new_value)):
            cache_in = tensors[past]
            # the past input becomes the preallocated cache: [B, N_kv, max_cache, H]
            if cache_in.shape is not None and len(cache_in.shape) == 4:
                cache_in.shape = [cache_in.shape[0], cache_in.shape[1], MAX_CACHE, cache_in.shape[3]]
            concat_out = _concat_output(graph, cache_in, tensors[new])
            concat_out.inputs.clear()
            # the concat's output (what the Attention and the present output read) is now the updated cache
            graph.nodes.append(gs.Node("TensorScatter", f"trtattn/kv/{site.name}/update_{'k' if past == site.past_key else 'v'}",
                                       {"axis": 2, "mode": "linear"}, inputs=[cache_in, tensors[new], write_index],
                                       outputs=[concat_out]))
            if concat_out.shape is not None and len(concat_out.shape) == 4:
                concat_out.shape = [concat_out.shape[0], concat_out.shape[1], MAX_CACHE, concat_out.shape[3]]
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
    return export_like(graph, model, 24)


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
