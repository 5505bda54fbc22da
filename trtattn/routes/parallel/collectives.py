"""Run a rank set on ONNX Runtime with its collectives carried out in numpy, and compare it with the
original model.

Each rank's form is cut at its `trtattn.dist` nodes: the collectives come out, their outputs become
inputs, and the model runs in waves, each wave up to the collectives whose inputs are ready; between
waves the collectives run across the ranks in numpy (ALL_REDUCE: the sum in rank order; ALL_GATHER:
concatenation). One session per rank and wave, made once and reused for every feed dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from ...graph.evaluate import cut_out, ort_session
from ...graph.view import import_graph
from .ranks import DOMAIN, slice_array
from .shard import Shard


def collective(op: str, parts: list[np.ndarray], axis: int = 0) -> np.ndarray:
    """One collective over the ranks' tensors, in rank order: what each rank receives."""
    if op == "AllReduce":
        total = parts[0].astype(np.float64) if parts[0].dtype.kind == "f" else parts[0].copy()
        for p in parts[1:]:
            total = total + p
        return np.asarray(total, dtype=parts[0].dtype)
    if op == "AllGather":
        return np.concatenate(parts, axis=axis)
    raise ValueError(f"collective '{op}': AllReduce or AllGather")


class _RankGraph:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = import_graph(model)
        graph.toposort()
        self.collectives = [n for n in graph.nodes if n.domain == DOMAIN]
        for node in self.collectives:  # cut: each collective's output becomes an input of the rank's graph
            out = node.outputs[0]
            node.outputs.clear()
            node.inputs.clear()
            graph.inputs.append(out)
        graph.nodes = [n for n in graph.nodes if n.domain != DOMAIN]
        self.graph = graph
        self.outputs = {t.name for t in graph.outputs}


class RankSet:
    """N rank forms run together; `run(feeds_per_rank)` gives each rank's outputs by name, `run_all` that for
    several feed sets. One session at a time (a rank's wave, made, run on every feed set and freed), so
    memory follows the work: about one layer's weights of one rank."""

    def __init__(self, models: list[onnx.ModelProto]):
        self.ranks = [_RankGraph(m) for m in models]
        first = self.ranks[0]
        self.ops = [(n.op, dict(n.attrs)) for n in first.collectives]
        # the collectives' inputs/outputs by name, the same on every rank (the forms differ only in data)
        protos = [n for n in models[0].graph.node if n.domain == DOMAIN]
        self.inputs = [p.input[0] for p in protos]
        self.outputs = [p.output[0] for p in protos]
        self.waves = self._waves(models[0])
        self.final_names = [o.name for o in first.graph.outputs if o.name not in self.outputs]

    def _waves(self, model: onnx.ModelProto) -> list[list[int]]:
        """Collectives grouped so that each group's inputs need only earlier groups' outputs."""
        producer = {o: n for n in model.graph.node for o in n.output}
        index = {o: k for k, o in enumerate(self.outputs)}
        depth: dict[str, int] = {}

        def level(name: str) -> int:  # 1 + the deepest collective `name` depends on (0: none)
            stack, order = [name], []
            while stack:
                x = stack.pop()
                if x in depth or x not in producer:
                    continue
                order.append(x)
                node = producer[x]
                stack.extend(i for i in node.input if i and i not in depth)
            for x in reversed(order):
                node = producer[x]
                if x in index:
                    depth[x] = 1 + max((depth.get(i, 0) for i in node.input if i), default=0)
                else:
                    depth[x] = max((depth.get(i, 0) for i in node.input if i), default=0)
            return depth.get(name, 0)

        levels = [level(self.inputs[k]) for k in range(len(self.inputs))]
        return [[k for k, v in enumerate(levels) if v == d] for d in sorted(set(levels))]

    @staticmethod
    def _run(rank: _RankGraph, names: list[str], feeds: list[dict]) -> list[list[np.ndarray]]:
        """`names` of the rank's graph for every feed set, from one session made here and freed after."""
        tensors = rank.graph.tensors()
        session = ort_session(cut_out(rank.graph, [tensors[n] for n in names], rank.model))
        wanted = [i.name for i in session.get_inputs()]
        # copies: an output ONNX Runtime gives can hold its session's memory arena alive (GBs on a large wave)
        return [[np.array(v) for v in session.run(names, {n: f[n] for n in wanted})] for f in feeds]

    def run(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return self.run_all([feeds])[0]

    def run_all(self, feed_sets: list[list[dict[str, np.ndarray]]]) -> list[list[dict[str, np.ndarray]]]:
        """For each feed set (one dict per rank), each rank's outputs by name."""
        known = [[dict(f) for f in feeds] for feeds in feed_sets]  # [set][rank]
        n = len(self.ranks)
        for wave in self.waves:
            names = [self.inputs[k] for k in wave]
            parts = [self._run(rank, names, [k[r] for k in known]) for r, rank in enumerate(self.ranks)]  # [rank][set]
            for s, values in enumerate(known):
                for j, k in enumerate(wave):
                    op, attrs = self.ops[k]
                    value = collective(op, [parts[r][s][j] for r in range(n)], attrs.get("axis", 0))
                    for r in range(n):
                        values[r][self.outputs[k]] = value
        finals = ([self._run(rank, self.final_names, [k[r] for k in known]) for r, rank in enumerate(self.ranks)]
                  if self.final_names else None)
        results = []
        for s, values in enumerate(known):
            per_rank = []
            for r, rank in enumerate(self.ranks):
                out = {name: values[r][name] for name in self.outputs}
                if finals is not None:
                    out.update(zip(self.final_names, finals[r][s]))
                per_rank.append({o.name: out[o.name] for o in rank.graph.outputs})
            results.append(per_rank)
        return results


@dataclass
class RankCheck:
    ranks: int
    passed: bool
    atol: float
    rtol: float
    errors: dict[str, float] = field(default_factory=dict)  # output -> max abs error over ranks and feeds
    bounds: dict[str, float] = field(default_factory=dict)


def rank_feeds(feeds: dict[str, np.ndarray], shards: dict[str, Shard], ranks: int) -> list[dict[str, np.ndarray]]:
    return [{k: (slice_array(v, shards[k], ranks, r) if k in shards else v) for k, v in feeds.items()}
            for r in range(ranks)]


def check_ranks(original: onnx.ModelProto, models: list[onnx.ModelProto], input_shards: dict[str, Shard],
                cached: dict[str, Shard], feeds_list: list[dict], *, atol: float = 1e-4,
                rtol: float = 1e-4, budget: int | None = None) -> RankCheck:
    """The rank set against the original on ONNX Runtime, output by output: a replicated or gathered
    output on every rank, a cache output on each rank against its block. An output's bound is
    atol + rtol * its largest reference magnitude (as verify/compare.py bounds every verification).
    `budget`: the original runs in slices of layers of that many resident bytes of weights."""
    n = len(models)
    names = [o.name for o in original.graph.output]
    wanted = {i.name for i in original.graph.input} - {t.name for t in original.graph.initializer}
    feeds_list = [{k: v for k, v in feeds.items() if k in wanted} for feeds in feeds_list]
    if budget:
        from ...graph import slices

        references = [dict(r) for r in slices.run(original, slices.plan(original, names, budget), feeds_list, names)]
    else:
        session = ort_session(original)
        references = [dict(zip(names, session.run(names, feeds))) for feeds in feeds_list]
        del session
    check = RankCheck(n, True, atol, rtol)
    outs = RankSet(models).run_all([rank_feeds(feeds, input_shards, n) for feeds in feeds_list])
    for expected, got in zip(references, outs):
        for name, ref in expected.items():
            ref = np.asarray(ref)
            if name in cached:  # each rank's cache against its block (a replicated KV head: on each holder)
                candidates = [(g[name], slice_array(ref, cached[name], n, r)) for r, g in enumerate(got)]
            else:
                candidates = [(g[name], ref) for g in got]
            scale = float(np.max(np.abs(ref), initial=0.0)) if ref.size else 0.0
            bound = atol + rtol * scale
            check.bounds[name] = max(check.bounds.get(name, 0.0), bound)
            for c, want in candidates:
                if c.shape != want.shape:
                    err = float("inf")
                else:
                    err = float(np.max(np.abs(c.astype(np.float64) - want), initial=0.0)) if want.size else 0.0
                    if np.isnan(err):
                        err = float("inf")
                check.errors[name] = max(check.errors.get(name, 0.0), err)
    check.passed = all(e <= check.bounds[k] for k, e in check.errors.items())
    return check


__all__ = ["RankSet", "RankCheck", "check_ranks", "collective", "rank_feeds"]
