"""Tensor parallelism (Megatron's split, TensorRT-LLM's layout): one form per rank, collectives explicit.

    forms = split_model(model, ranks=2)      # the split found from the graph, each rank's ONNX form
    forms.plan.sites, forms.plan.replicated  # per site: heads per rank; what stays whole and why
    check = forms.verify()                   # all ranks on ONNX Runtime, collectives in numpy, vs the original

find.py finds the split (shard.py: one pass following a split axis through the graph), ranks.py writes
each rank's form with `trtattn.dist` AllReduce/AllGather nodes (`forms.write(folder, name)`: to files, one
rank and one weight at a time, for models larger than memory), collectives.py runs a rank set, cost.py
gives each rank's weights, KV-cache bytes and the bytes its collectives move.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ...errors import TrtattnError
from .collectives import RankCheck, RankSet, check_ranks, collective, rank_feeds
from .find import GATHER_BYTES, ParallelPlan, SiteSplit, find_split
from .ranks import DOMAIN, on_disk, rank_model
from .shard import Shard, Unsplittable


@dataclass
class RankForms:
    original: onnx.ModelProto
    plan: ParallelPlan
    feeds: list[dict[str, np.ndarray]]
    budget: int | None = None  # the original is measured and checked in slices of layers of this many bytes
    written: list[onnx.ModelProto] | None = None  # the forms as write() left them, weights on disk

    @functools.cached_property
    def models(self) -> list[onnx.ModelProto]:
        """Each rank's form: as written, else made in memory (all N at once: for models that fit)."""
        if self.written is not None:
            return self.written
        return [rank_model(self.plan, self.original, r) for r in range(self.plan.ranks)]

    def write(self, folder, name: str, protect: tuple = ()) -> list[Path]:
        """Each rank's form written to FOLDER/NAME.rankRofN.onnx (weights in .data) as it is made, one rank at
        a time, each weight sliced from the original's file and written before the next: memory holds one
        weight, not the model. `models` are then the forms as written, their weights read from these files."""
        from ...graph import io

        n = self.plan.ranks
        paths = [Path(folder) / f"{name}.rank{r}of{n}.onnx" for r in range(n)]
        self.written = [io.save_made(path, functools.partial(self._make, r), protect=protect)
                        for r, path in enumerate(paths)]
        self.__dict__.pop("models", None)
        return paths

    def _make(self, rank: int, data) -> onnx.ModelProto:
        return rank_model(self.plan, self.original, rank, store=on_disk(data))

    def verify(self, feeds: list[dict] | None = None, *, atol: float = 1e-4, rtol: float = 1e-4) -> RankCheck:
        split = self.plan.split
        return check_ranks(self.original, self.models, split.input_shards, split.cached, feeds or self.feeds,
                           atol=atol, rtol=rtol, budget=self.budget)


def split_model(model: onnx.ModelProto, ranks: int, *, feeds: list[dict] | None = None, sites=None,
                gather_bytes: int = GATHER_BYTES, dims=None, budget: int | None = None) -> RankForms:
    """The rank forms of `model` over `ranks` devices. `feeds` (default: two sets in the model's domain at
    dims it runs on, and one at other dims) are what the split is verified with, the first what it is
    measured on; `sites` default to the matcher's. `budget`: resident bytes of weights per slice of layers
    the original is run in (default: graph/slices.py's choice, whole unless its weights are over half
    the memory); the rank set is always run one rank's wave (between collectives) at a time."""
    from ...graph.slices import slice_budget
    from ...match import match
    from ...verify.compare import default_feeds

    if budget is None:
        budget = slice_budget(model)
    if feeds is None:
        feeds = default_feeds(model, dims=dims) + _other_dims(model, budget)
    if sites is None:
        found = match(model)
        if found.skipped:  # an attention left unread would be split as plain MatMuls, or stay whole, unsaid
            raise TrtattnError("cannot split a model whose attention the matcher did not read: " + "; ".join(
                f"{s.name}: {s.reason}" for s in found.skipped))
        sites = found.sites
    plan = find_split(model, ranks, feeds[0], sites=sites, gather_bytes=gather_bytes, budget=budget)
    return RankForms(model, plan, feeds, budget)


def _other_dims(model: onnx.ModelProto, budget: int | None = None) -> list[dict]:
    """One more feed set at other dims (each input dim times its own prime, as graph/measure.py probes),
    where the original runs on them (in slices of layers with a `budget`): the split is measured at the
    first dims and must hold at these."""
    from ...graph import slices
    from ...graph.evaluate import ort_session
    from ...graph.feeds import make_feeds
    from ...graph.measure import probe_dims

    names = [o.name for o in model.graph.output]
    wanted = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    try:
        _, choices = probe_dims(model)
        if budget:
            pieces = slices.plan(model, names, budget)
            runs = lambda given: slices.run(model, pieces, [given], names)  # noqa: E731
        else:
            runs = functools.partial(ort_session(model).run, None)
    except Exception:
        return []
    for dims in choices:
        feeds = make_feeds(model, dims=dims, seed=7)
        try:
            runs({k: v for k, v in feeds.items() if k in wanted})
        except Exception:
            continue
        return [feeds]
    return []


__all__ = ["split_model", "RankForms", "find_split", "ParallelPlan", "SiteSplit", "rank_model", "RankSet",
           "RankCheck", "check_ranks", "collective", "rank_feeds", "Shard", "Unsplittable", "DOMAIN",
           "GATHER_BYTES"]
