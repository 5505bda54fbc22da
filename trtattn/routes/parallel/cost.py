"""What a rank holds and what its collectives move: weights, KV-cache bytes at a cache capacity, and the
bytes of every ALL_REDUCE and ALL_GATHER per token.

`rank_costs` reads them off a split (the rank forms' own initializers, the sites' heads per rank, the
collectives' tensors); `llama_costs` gives the same figures for a Llama configuration by formula (the
writer's presets), for sizes no machine here can split: the README's 8B and 70B table. Ring collectives:
an ALL_REDUCE of P bytes sends 2(N-1)/N * P per rank, an ALL_GATHER of P bytes (N-1)/N * P.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import onnx


@dataclass
class RankCost:
    rank: int
    ranks: int
    weight_bytes: int
    kv_cache_bytes: int  # one sequence at the cache capacity
    all_reduces: int  # per token (one per row-split product)
    all_reduce_bytes: int  # payload per token, all of them together
    all_gather_bytes: int
    sent_bytes: float  # what the rank sends per token over a ring

    def as_dict(self) -> dict:
        return asdict(self)


def _ring(reduce_bytes: int, gather_bytes: int, ranks: int) -> float:
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * reduce_bytes + (ranks - 1) / ranks * gather_bytes


def initializer_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for t in model.graph.initializer:
        size = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
        total += size * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def rank_costs(forms, max_cache: int, kv_bytes: int | None = None) -> list[RankCost]:
    """Per rank of `forms` (routes.parallel.RankForms). `kv_bytes` per cache element (default: each site's
    K/V element size as measured)."""
    plan = forms.plan
    n = plan.ranks
    facts = plan.facts
    kv = 0
    for s in plan.sites:
        heads = s.kv_per_rank if s.kv_per_rank is not None else (s.kv_heads or 0)
        kv += heads * (s.head_size + s.v_head_size) * max_cache * (kv_bytes or s.element_bytes)
    reduce_bytes = gather_bytes = 0
    reducing = plan.split.rows + plan.split.vocab
    for i in reducing:
        out = plan.nodes[i].outputs[0].name
        reduce_bytes += _per_token(facts, out)
    for name in plan.split.gathered:
        gather_bytes += _per_token(facts, name)
    return [RankCost(r, n, initializer_bytes(m), kv, len(reducing), reduce_bytes, gather_bytes,
                     _ring(reduce_bytes, gather_bytes, n)) for r, m in enumerate(forms.models)]


def _per_token(facts, name: str) -> int:
    """Bytes of `name` per token: its last axis (hidden or vocabulary) times its element size."""
    shape = facts.shapes[name]
    return int(shape[-1]) * np.dtype(facts.dtypes[name]).itemsize if shape else 0


def llama_costs(cfg: dict, ranks: int, max_cache: int, dtype_bytes: int = 2,
                gather_bytes: int | None = None) -> RankCost:
    """One rank of a Llama configuration (write_llama's presets) split as routes/parallel splits the
    written model: Q/K/V and gate/up by columns, o and down by rows, KV heads with their query heads (one
    replicated KV head per rank when fewer than the ranks, whole when neither divides), the LM head and
    the embedding by vocabulary when over the gather threshold, norms whole."""
    from .find import GATHER_BYTES

    threshold = GATHER_BYTES if gather_bytes is None else gather_bytes
    h, heads, kv_heads, ffn, vocab, layers = (cfg[k] for k in ("hidden", "heads", "kv_heads", "ffn", "vocab", "layers"))
    head = h // heads
    split_heads = heads % ranks == 0
    q = ranks if split_heads else 1
    kv_rank = kv_heads  # KV heads a rank holds
    if split_heads and kv_heads % ranks == 0:
        kv_rank = kv_heads // ranks
    elif split_heads and ranks % kv_heads == 0:
        kv_rank = 1
    mlp = ranks if ffn % ranks == 0 else 1
    attention = h * heads * head // q + 2 * h * kv_rank * head + heads * head * h // q
    per_layer = attention + 3 * h * ffn // mlp + 2 * h
    lm_head = h * vocab if cfg.get("lm_head", True) else 0
    lm_split = ranks if lm_head and lm_head * dtype_bytes >= threshold and vocab % ranks == 0 else 1
    embed_split = ranks if vocab * h * dtype_bytes >= threshold and vocab % ranks == 0 and ranks > 1 else 1
    embedding = vocab * h // embed_split + (h if embed_split > 1 else 0)  # a rank's rows and one row of zeros
    weights = (layers * per_layer + embedding + h + lm_head // lm_split) * dtype_bytes
    kv = layers * 2 * kv_rank * head * max_cache * dtype_bytes
    reduces = layers * ((q > 1) + (mlp > 1)) + (embed_split > 1)
    reduce_bytes = reduces * h * dtype_bytes
    gather = vocab * dtype_bytes if lm_split > 1 else 0
    return RankCost(0, ranks, weights, kv, reduces, reduce_bytes, gather, _ring(reduce_bytes, gather, ranks))


def table_rows(presets: dict, ranks=(1, 2, 4, 8), max_cache: int = 8192) -> list[dict]:
    rows = []
    for name, cfg in presets.items():
        for n in ranks:
            c = llama_costs(cfg, n, max_cache)
            rows.append({"model": name, "ranks": n, "weights_gib": round(c.weight_bytes / 2**30, 2),
                         "kv_cache_gib": round(c.kv_cache_bytes / 2**30, 3), "all_reduces": c.all_reduces,
                         "reduce_kib_per_token": round(c.all_reduce_bytes / 1024, 1),
                         "gather_kib_per_token": round(c.all_gather_bytes / 1024, 1),
                         "sent_kib_per_token": round(c.sent_bytes / 1024, 1)})
    return rows
