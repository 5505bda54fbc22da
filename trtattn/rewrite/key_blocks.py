"""A site whose key axis the graph wrote in blocks (match/partition.py), rewritten: Concat(K_i) and Concat(V_i)
made again from the blocks, and, where the blocks are a cache input and the new slice (Gemma3's split-cache
prefill), the op's own past/present form: Attention(Q, K_new, V_new, mask, past_key, past_value) computes over
Concat(past, new) like the graph, and is what the kv-cache form lowers to IAttention with the KV-cache update
(routes/prepare/op_cache.py)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..match.partition import emit as join_blocks
from ..site import AttentionSite, CacheKind
from .layout import Dims, convert

PAST_KEY = 4  # the Attention op's input index of past_key (past_value follows)


def prepare(graph: gs.Graph, tensors: dict, site: AttentionSite) -> None:
    """Write Concat(K_i), Concat(V_i) (and the layout ops the proof pulled them above) where `graph` lacks them."""
    if site.partition is not None:
        join_blocks(graph, tensors, site.partition.made)


def past_form(graph: gs.Graph, site: AttentionSite) -> bool:
    """Whether the site's joined blocks are a cache input and the new slice: the op takes the past itself."""
    inputs = {t.name for t in graph.inputs}
    return (site.partition is not None and len(site.partition.keys) == 2 and site.cache == CacheKind.CONCAT
            and site.past_key in inputs and site.past_value in inputs and site.new_key is not None
            and site.new_value is not None and site.qk_output is None and not any(s.op == "sink" for s in site.mask_steps))


def past_operands(graph: gs.Graph, emit, tensors: dict, site: AttentionSite, dims: Dims
                  ) -> tuple[list[gs.Tensor], list[gs.Tensor]] | None:
    """([K_new, V_new], [past_key, past_value]) as the op reads them (BNSH; each block has the frame of the joined
    K or V it is a block of), or None when the op does not take the past: the blocks are not a cache input and
    the new slice, or a cache is not laid out as the op's past (a V cache stored transposed, [B, N, H, S]): the
    engine would take a cache it cannot update in place, so the op reads Concat(past, new) instead."""
    lay = site.layout
    if not past_form(graph, site) or lay is None or not (site.new_key and site.new_value and site.past_key
                                                          and site.past_value):
        return None
    k_to, v_to = (lay.batch, lay.kv_heads, ("k",), ("d",)), (lay.batch, lay.kv_heads, ("k",), ("e",))
    if not (_laid_out(lay.k, k_to, dims) and _laid_out(lay.v, v_to, dims)):
        return None
    new = [convert(emit, tensors[site.new_key], lay.k, k_to, dims),
           convert(emit, tensors[site.new_value], lay.v, v_to, dims)]
    return new, [tensors[site.past_key], tensors[site.past_value]]


def _laid_out(src, dst, dims: Dims) -> bool:
    """A tensor of frame `src` is already laid out as `dst`: axis for axis the same atoms but those of size 1."""
    real = lambda g: [a for a in g if not dims.unit(a)]  # noqa: E731
    return len(src) == len(dst) and all(real(g) == real(h) for g, h in zip(src, dst))


def with_presents(attention: gs.Node, past: list[gs.Tensor]) -> None:
    """The op's past inputs after Q, K, V and the mask (empty where none), and its present outputs."""
    while len(attention.inputs) < PAST_KEY:
        attention.inputs.append(gs.Variable.empty())
    attention.inputs.extend(past)
    attention.outputs.extend(gs.Variable(f"{attention.name}/present_{x}", dtype=p.dtype) for x, p in
                             zip(("key", "value"), past))
