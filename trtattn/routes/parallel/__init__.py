"""Tensor parallelism (Megatron's split, TensorRT-LLM's layout): one form per rank, collectives explicit.

    forms = split_model(model, ranks=2)      # the split found from the graph, each rank's ONNX form
    forms.plan.sites, forms.plan.replicated  # per site: heads per rank; what stays whole and why
    check = forms.verify()                   # all ranks on ONNX Runtime, collectives in numpy, vs the original

find.py finds the split (shard.py: one pass following a split axis through the graph), ranks.py writes
each rank's form with `trtattn.dist` AllReduce/AllGather nodes, collectives.py runs a rank set, cost.py
gives each rank's weights, KV-cache bytes and the bytes its collectives move.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from .collectives import RankCheck, RankSet, check_ranks, collective, rank_feeds
from .find import GATHER_BYTES, ParallelPlan, SiteSplit, find_split
from .ranks import DOMAIN, rank_model
from .shard import Shard, Unsplittable


@dataclass
class RankForms:
    original: onnx.ModelProto
    plan: ParallelPlan
    models: list[onnx.ModelProto]
    feeds: list[dict[str, np.ndarray]]

    def verify(self, feeds: list[dict] | None = None, *, atol: float = 1e-4, rtol: float = 1e-4) -> RankCheck:
        split = self.plan.split
        return check_ranks(self.original, self.models, split.input_shards, split.cached, feeds or self.feeds,
                           atol=atol, rtol=rtol)


def split_model(model: onnx.ModelProto, ranks: int, *, feeds: list[dict] | None = None, sites=None,
                gather_bytes: int = GATHER_BYTES, dims=None) -> RankForms:
    """The rank forms of `model` over `ranks` devices. `feeds` (default: two sets in the model's domain at
    dims it runs on) are what the split is measured on and verified with; `sites` default to the matcher's."""
    from ...match import match
    from ...verify.compare import default_feeds

    if feeds is None:
        feeds = default_feeds(model, dims=dims)
    if sites is None:
        sites = match(model).sites
    plan = find_split(model, ranks, feeds[0], sites=sites, gather_bytes=gather_bytes)
    return RankForms(model, plan, [rank_model(plan, model, r) for r in range(ranks)], feeds)


__all__ = ["split_model", "RankForms", "find_split", "ParallelPlan", "SiteSplit", "rank_model", "RankSet",
           "RankCheck", "check_ranks", "collective", "rank_feeds", "Shard", "Unsplittable", "DOMAIN",
           "GATHER_BYTES"]
