"""kv-cache form: decoders read and write a preallocated cache, the LLM pattern of TensorRT's
documentation: a packed query over a padded cache.

Tokens of every row go end to end ([1, T] with cu_seqlens [B+1], tokens.py); each row's new K/V
are written into its cache [B, N_kv, capacity, H] from its `cache_write_index` on; its attention reads
the cache up to write index + new tokens, lower-right causal within that length. A prefill of ragged
prompts and a decode step ([1, B], one token per row) are the same program, and no padding is ever
computed or attended. The cache outputs alias the cache inputs.

In ONNX (what ONNX Runtime verifies): ScatterND writes the packed K/V into the cache; the query is
gathered into padded rows, Attention reads the whole cache with a boolean mask built from the write
indices and lengths, and the rows are packed again. TensorRT gets the same as IKVCacheUpdateLayer
(packed update) and IAttention (packed query, padded key/value, per-row lengths, LOWER_RIGHT): the
records are in lowering.py.

Cross-attention reads static K/V inputs (an encoder-decoder's, computed once by its first decoder step);
its only mask may be the encoder's padding mask, which stays an input [B, S_enc] and is read as per-row
key/value lengths (right padding), as the padded form reads padding masks.

A cache the graph concatenates that the form cannot own is refused per site with why (unowned_caches): one layer's
slice of a stacked input (openai-whisper's), a cache whose length the graph reads (a position offset), a cache not
appended to as the attention's K/V; the padded plan notes it (forms.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...contract import MAX_CACHE, WRITE_INDEX
from ...errors import SitesRefused, TrtattnError
from ...graph.dependence import value_inputs
from ...graph.emit import Emitter, export_like
from ...site import CacheKind, CausalKind
from ..parallel.facts import constant_value
from .lowering import AttentionLowering, CacheLowering
from .mask_axes import key_flag_masks
from .padded import allowed_keys, lengths_of, right_padded_masks
from .tokens import Tokens, batch_from_tokens, pack_tokens, per_token_outputs


def _check(reports, encoder_masks: dict[str, str]) -> None:
    if not any(r.site.cache == CacheKind.CONCAT for r in reports):
        raise TrtattnError("the kv-cache form needs a model whose K/V are concatenated with a past cache "
                           "(past_key_values inputs); this one has none")
    for r in reports:
        site = r.site
        if site.rank != 4:
            raise TrtattnError(f"site {site.name}: the kv-cache form takes [B, N, S, H] attention, not rank {site.rank}")
        if site.cache == CacheKind.CONCAT:
            if r.bias or site.window or r.pattern != "causal" or site.causal not in (CausalKind.LOWER_RIGHT,
                                                                                      CausalKind.UPPER_LEFT):
                raise TrtattnError(f"site {site.name}: the kv-cache form needs a causal mask (with padding at most); "
                                   f"this one is {r.pattern}" + (" with a bias" if r.bias else "")
                                   + (f" with window {site.window}" if site.window else ""))
        elif site.cache == CacheKind.CROSS_STATIC:
            if r.bias or (site.mask.value != "none" and site.name not in encoder_masks):
                raise TrtattnError(f"site {site.name}: cross-attention over static K/V in the kv-cache form takes no "
                                   "mask but the encoder's right-padded padding mask (read as lengths), and no bias; "
                                   f"this one has {'a bias' if r.bias else 'another mask'}")
        else:
            raise TrtattnError(f"site {site.name}: attention without a cache in a decoder step; the kv-cache form "
                               "takes self-attention over a past cache and cross-attention over static K/V")


class _Rows:
    """Index tensors shared by every site: padded rows of the packed tokens and back."""

    def __init__(self, emit: Emitter, tokens: Tokens, write_index: gs.Tensor):
        self.emit, self.tokens, self.write_index = emit, tokens, write_index
        i64 = np.int64
        self.kv_lengths = emit("Add", [write_index, tokens.lengths], dtype=i64, name="kv_lengths")  # [B]
        self.kv_lengths.name = "kv_lengths"  # what the plan and the sidecar show
        # the cache slot each token is written to: its row's write index + its index in the row
        self.slot = emit("Add", [emit("Gather", [write_index, tokens.row], {"axis": 0}, dtype=i64), tokens.index],
                         dtype=i64, name="slot")
        longest = emit("ReduceMax", [tokens.lengths], {"keepdims": 1}, dtype=i64, name="longest")  # [1]
        self.positions = emit("Range", [emit.const(0, i64), emit("Squeeze", [longest], dtype=i64), emit.const(1, i64)],
                              dtype=i64, name="query_positions")  # [Smax]
        last = emit("Sub", [emit.dim(tokens.ids, 1), emit.const(1, i64)], dtype=i64)
        starts = emit("Slice", [tokens.cu64, emit.const([0], i64), emit.const([-1], i64)], dtype=i64)
        grid = emit("Add", [emit("Unsqueeze", [starts, emit.const([1], i64)], dtype=i64),
                            emit("Unsqueeze", [self.positions, emit.const([0], i64)], dtype=i64)], dtype=i64)
        self.padded_index = emit("Min", [grid, last], dtype=i64, name="padded_index")  # [B, Smax] into the tokens
        self.packed_index = emit("Add", [emit("Mul", [tokens.row, longest], dtype=i64), tokens.index], dtype=i64,
                                 name="packed_index")  # [T] into the flattened [B * Smax] rows
        self._scatter: dict[int, gs.Tensor] = {}

    def scatter_indices(self, heads: int) -> gs.Tensor:
        """[T, heads, 3]: (row, head, slot) of every token's K or V in a [B, heads, capacity, H] cache."""
        if heads not in self._scatter:
            e, i64 = self.emit, np.int64
            total = e("Unsqueeze", [e.dim(self.tokens.ids, 1), e.const([0], i64)], dtype=i64)
            shape = e("Concat", [total, e.const([heads, 1], i64)], {"axis": 0}, dtype=i64)
            row = e("Expand", [e("Unsqueeze", [self.tokens.row, e.const([1, 2], i64)], dtype=i64), shape], dtype=i64)
            head = e("Expand", [e.const(np.arange(heads).reshape(1, heads, 1), i64), shape], dtype=i64)
            slot = e("Expand", [e("Unsqueeze", [self.slot, e.const([1, 2], i64)], dtype=i64), shape], dtype=i64)
            self._scatter[heads] = e("Concat", [row, head, slot], {"axis": 2}, dtype=i64, name="scatter_indices")
        return self._scatter[heads]

    def causal_mask(self, key: gs.Tensor) -> gs.Tensor:
        """[B, 1, Smax, capacity]: query s of row b sees key j when j <= s + write index (lower-right
        within the row's length) and j < its length."""
        e, i64 = self.emit, np.int64
        keys = e("Range", [e.const(0, i64), e.dim(key, 2), e.const(1, i64)], dtype=i64, name="key_positions")
        j = e("Unsqueeze", [keys, e.const([0, 1, 2], i64)], dtype=i64)  # [1, 1, 1, C]
        s = e("Unsqueeze", [self.positions, e.const([0, 1, 3], i64)], dtype=i64)  # [1, 1, Smax, 1]
        start = e("Unsqueeze", [self.write_index, e.const([1, 2, 3], i64)], dtype=i64)  # [B, 1, 1, 1]
        length = e("Unsqueeze", [self.kv_lengths, e.const([1, 2, 3], i64)], dtype=i64)
        causal = e("LessOrEqual", [j, e("Add", [s, start], dtype=i64)], dtype=np.bool_)
        return e("And", [causal, e("Less", [j, length], dtype=np.bool_)], dtype=np.bool_, name="cache_mask")

    def to_padded(self, x: gs.Tensor, dtype) -> gs.Tensor:
        """[1, N, T, H] packed tokens -> [B, N, Smax, H] rows."""
        e, i64 = self.emit, np.int64
        g = e("Gather", [x, self.padded_index], {"axis": 2}, dtype=dtype)  # [1, N, B, Smax, H]
        return e("Transpose", [e("Squeeze", [g, e.const([0], i64)], dtype=dtype)], {"perm": [1, 0, 2, 3]}, dtype=dtype,
                 name="query_rows")

    def to_packed(self, y: gs.Tensor, out: gs.Tensor, dtype) -> list[str]:
        """[B, N, Smax, H] rows -> `out` [1, N, T, H]; the names of the nodes that do it."""
        e, i64 = self.emit, np.int64
        first = len(e.graph.nodes)
        heads_first = e("Transpose", [y], {"perm": [1, 0, 2, 3]}, dtype=dtype)
        target = e("Concat", [e.shape_slice(heads_first, 0, 1), e.const([-1], i64), e.shape_slice(heads_first, 3, 4)],
                   {"axis": 0}, dtype=i64)
        flat = e("Reshape", [heads_first, target], dtype=dtype)  # [N, B * Smax, H]
        tokens = e("Gather", [flat, self.packed_index], {"axis": 1}, dtype=dtype)
        e("Unsqueeze", [tokens, e.const([0], i64)], dtype=dtype, name="packed_output")
        e.graph.nodes[-1].outputs = [out]
        return [n.name for n in e.graph.nodes[first:]]


def _encoder_masks(graph: gs.Graph, model: onnx.ModelProto, reports, nodes: dict, dims=None) -> dict[str, str]:
    """Cross-attention site -> the one graph input its mask's values come from, where that is a right-padded
    padding mask that no self-attention mask reads (the encoder's, over the static K/V's axis, not the tokens')
    and its axes are the batch and the keys (mask_axes.py)."""
    inputs, right_padded = {t.name for t in graph.inputs}, right_padded_masks(model)
    sources = {}
    for r in reports:
        attn = nodes[r.attention_node]
        if len(attn.inputs) > 3 and attn.inputs[3].name:
            sources[r.site.name] = value_inputs(attn.inputs[3], inputs)
    selves = set().union(*(sources.get(r.site.name, set()) for r in reports if r.site.cache != CacheKind.CROSS_STATIC))
    candidates = {r.attention_node: next(iter(sources[r.site.name])) for r in reports
                  if r.site.cache == CacheKind.CROSS_STATIC and len(sources.get(r.site.name, ())) == 1
                  and sources[r.site.name] <= right_padded - selves}
    key_flags = key_flag_masks(graph, model, candidates, dims)
    return {r.site.name: candidates[r.attention_node] for r in reports if r.attention_node in key_flags}


def kv_cache_form(model: onnx.ModelProto, reports, dims=None) -> tuple[onnx.ModelProto, list[AttentionLowering],
                                                            list[CacheLowering], list[str]]:
    """The form (module doc), its attention and cache lowerings, and the encoder padding masks it reads as
    lengths (they must be right-padded)."""
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    nodes = {n.name: n for n in graph.nodes}
    encoder_masks = _encoder_masks(graph, model, reports, nodes, dims)
    refuse_unowned_caches(graph, reports)
    _check(reports, encoder_masks)
    emit = Emitter(graph, "trtattn/kv")
    tokens = pack_tokens(graph, model, emit, "kv-cache", keep=set(encoder_masks.values()))
    if tokens.positions is None:
        raise TrtattnError("the kv-cache form needs position_ids as an input: in it a cache's length is its capacity, "
                           "so positions cannot come from the cache's shape")
    batch_from_tokens(graph, tokens, emit)
    write_index = gs.Variable(WRITE_INDEX, dtype=np.int64, shape=["batch"])
    graph.inputs.append(write_index)
    rows = _Rows(emit, tokens, write_index)
    encoder_lengths = {name: lengths_of(emit, next(t for t in graph.inputs if t.name == name))
                       for name in sorted(set(encoder_masks.values()))}
    attentions, updates, caches = [], [], set()
    for r in reports:
        site, attn = r.site, nodes[r.attention_node]
        if site.cache == CacheKind.CONCAT:
            for past, new, tag in ((site.past_key, site.new_key, "k"), (site.past_value, site.new_value, "v")):
                updates.append(_scatter(graph, rows, tensors[past], tensors[new], site, tag))
                caches.add(past)
        dtype = attn.outputs[0].dtype or np.float32
        query = attn.inputs[0]
        attn.inputs[0] = rows.to_padded(query, dtype)
        while len(attn.inputs) > 3:  # the model's mask and cache lengths: the rows' lengths say it now
            attn.inputs.pop()
        if site.cache == CacheKind.CONCAT:
            attn.inputs.append(rows.causal_mask(attn.inputs[1]))
        elif site.name in encoder_masks:  # the encoder's padding as lengths, the same for every query row
            lengths = encoder_lengths[encoder_masks[site.name]]
            attn.inputs.append(emit.full_query_rows(allowed_keys(emit, attn.inputs[0], attn.inputs[1], lengths, False),
                                                    attn.inputs[0]))
        attn.attrs["is_causal"] = 0
        out = attn.outputs[0]
        padded_out = gs.Variable(f"{out.name}/rows", dtype=dtype)
        attn.outputs = [padded_out]
        region = (attn.name, *rows.to_packed(padded_out, out, dtype))
        cached = site.cache == CacheKind.CONCAT
        kv_lengths = rows.kv_lengths if cached else encoder_lengths.get(encoder_masks.get(site.name, ""))
        attentions.append(AttentionLowering(attn.name, region, "lower_right" if cached else "none", query=query.name,
                                            output=out.name, q_lengths=tokens.cu.name,
                                            kv_lengths=kv_lengths.name if kv_lengths is not None else None,
                                            query_form="packed"))
    graph.cleanup(remove_unused_graph_inputs=True)
    refuse_cache_length_reads(graph, caches)
    per_token_outputs(graph, skip={u.output for u in updates})
    return export_like(graph, model), attentions, updates, sorted(encoder_lengths)


def _scatter(graph: gs.Graph, rows: _Rows, cache: gs.Tensor, new: gs.Tensor, site, tag: str) -> CacheLowering:
    """The Concat(past, new) becomes ScatterND(cache, indices, new tokens) into the preallocated cache."""
    e, i64 = rows.emit, np.int64
    if cache.shape is not None and len(cache.shape) == 4:  # the past input becomes the cache [B, N_kv, capacity, H]
        cache.shape = [cache.shape[0], cache.shape[1], MAX_CACHE, cache.shape[3]]
    heads = site.kv_heads or (cache.shape[1] if cache.shape and isinstance(cache.shape[1], int) else None)
    if not heads:
        raise TrtattnError(f"site {site.name}: the number of key/value heads of {cache.name} is unknown")
    concat_out = _concat_output(graph, cache, new)
    concat_out.inputs.clear()
    dtype = new.dtype or cache.dtype
    tokens = e("Transpose", [e("Squeeze", [new, e.const([0], i64)], dtype=dtype)], {"perm": [1, 0, 2]}, dtype=dtype)
    name = f"trtattn/kv/{site.name}/update_{tag}"
    graph.nodes.append(gs.Node("ScatterND", name, inputs=[cache, rows.scatter_indices(heads), tokens],
                               outputs=[concat_out]))
    if concat_out.shape is not None and len(concat_out.shape) == 4:
        concat_out.shape = [concat_out.shape[0], concat_out.shape[1], MAX_CACHE, concat_out.shape[3]]
    return CacheLowering(name, (name,), cache.name, new.name, rows.write_index.name, concat_out.name,
                         update_form="packed", update_lengths=rows.tokens.cu.name)


def refuse_cache_length_reads(graph: gs.Graph, caches) -> None:
    """In the kv-cache form a cache's length is its capacity, not the number of past tokens: a node that reads
    it (positions or masks derived from it) is refused, naming it."""
    for node, cache in cache_length_reads(graph, caches):
        raise TrtattnError(cache_length_read(node, cache) + ": give the model position_ids (and cache positions) as "
                           "inputs instead")


def cache_length_reads(graph: gs.Graph, caches) -> list[tuple[str, str]]:
    """(Shape node, cache) for each node reading the sequence length of one of these caches."""
    return [(n.name, n.inputs[0].name) for n in graph.nodes
            if n.op == "Shape" and n.inputs[0].name in caches and _reads_sequence_axis(n)]


def cache_length_read(node: str, cache: str) -> str:
    return (f"node {node} reads the length of the past cache {cache} (positions or masks derived from it); in the "
            "kv-cache form that is the capacity")


# ---------------------------------------------------------------- caches the graph appends to, which the form cannot own
_SLICING = ("Identity", "Split", "Squeeze", "Gather", "Slice", "Unsqueeze")  # how a graph takes one cache of a stack


def refuse_unowned_caches(graph: gs.Graph, reports) -> None:
    """Sites whose keys the graph concatenates onto a cache input (site.cache_lengths) that the form cannot make a
    cache updated in place: refused, each with why (unowned_caches), not read as sites without a cache."""
    unowned = unowned_caches(graph, reports)
    if unowned:
        raise SitesRefused("the kv-cache form cannot own the caches the graph concatenates: "
                           + "; ".join(f"{site}: {why}" for site, why in unowned.items()), list(unowned.items()))


def unowned_caches(graph: gs.Graph, reports) -> dict[str, str]:
    """Site -> why the cache inputs the graph concatenates onto its keys cannot be caches TensorRT's KV-cache update
    writes in place: a cache taken apart before the Concat (one layer's slice of a stacked input: the update writes
    a whole cache input, so owning it means one input per layer and kind, other engine inputs than the model's), or
    a node reading a cache's length (a position offset: in the form the length is the capacity), else that the cache
    is not appended to as the attention's K/V. Sites whose cache the form takes (CacheKind.CONCAT) are not named."""
    tensors = graph.tensors()
    out = {}
    for r in reports:
        if r.site.cache == CacheKind.CONCAT or not r.site.cache_lengths:
            continue
        why = []
        for c in r.site.cache_lengths:
            cache = tensors[c.input]
            shape = list(cache.shape or [])
            if c.past in shape:
                why += _unowned(cache, shape.index(c.past), len(shape))
        out[r.site.name] = "; ".join(dict.fromkeys(why)) or (
            f"{', '.join(c.input for c in r.site.cache_lengths)} is concatenated onto its keys in the graph, not as "
            "the K/V of the attention appended to a [B, N_kv, S, H] cache input")
    return out


def _unowned(cache: gs.Tensor, axis: int, rank: int) -> list[str]:
    """Why `cache` (its key axis `axis`) is not a cache input concatenated as it is, followed down the nodes that
    take a cache of a stack (_SLICING) to its Concats and to the Shapes reading its key axis."""
    why: list[str] = []
    todo: list[tuple[gs.Tensor, int, int, tuple[str, ...]]] = [(cache, axis, rank, ())]
    while todo:
        t, a, n_dims, path = todo.pop()
        for n in t.outputs:
            if n.op == "Shape" and _reads_sequence_axis(n, a, n_dims):
                why.append(f"node {n.name} reads the length of {cache.name} (a position offset or mask derived from "
                           "it), which in the kv-cache form is the capacity")
            elif n.op == "Concat" and any(op != "Identity" for op in path):
                why.append(f"{cache.name} is taken apart before its Concat ({' -> '.join(dict.fromkeys(path))}: a "
                           "stack of caches); TensorRT's KV-cache update writes a whole cache input in place, so "
                           "owning it needs one cache input per layer and kind, not the model's engine inputs")
            elif n.op in _SLICING:
                kept = _axis_through(n, a, n_dims)
                if kept is not None:
                    todo += [(o, *kept, (*path, n.op)) for o in n.outputs]
    return list(dict.fromkeys(why))


def _axis_through(node: gs.Node, axis: int, rank: int) -> tuple[int, int] | None:
    """(the key axis, the rank) of `node`'s output, its input's key axis being `axis`; None where the axis is lost
    (squeezed or gathered) or the node's axes are not constants."""
    def axes(index: int, attr: str) -> list[int] | None:
        given = node.attrs.get(attr)
        if given is None and len(node.inputs) > index:
            given = constant_value(node.inputs[index])
        return None if given is None else [int(x) for x in np.asarray(given).reshape(-1)]

    if node.op == "Squeeze":
        squeezed = axes(1, "axes")
        if squeezed is None or axis in [x % rank for x in squeezed]:
            return None
        return axis - sum(x % rank < axis for x in squeezed), rank - len(squeezed)
    if node.op == "Unsqueeze":
        added = axes(1, "axes")
        if added is None:
            return None
        out_rank = rank + len(added)
        for x in sorted(x % out_rank for x in added):
            axis += x <= axis
        return axis, out_rank
    if node.op == "Gather":
        index = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
        along = node.attrs.get("axis", 0) % rank
        if along == axis or index is None:
            return None
        dropped = 1 - index.ndim
        return axis - (dropped if along < axis else 0), rank - dropped
    return axis, rank  # Identity, Split, Slice: the same axes


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
