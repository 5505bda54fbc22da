"""The tensor-parallel split of a model, found from its graph: which products split by columns, which
by rows with an ALL_REDUCE after, which outputs are gathered, what each rank's KV cache holds, and what
stays whole on every rank and why.

Every product with a 2-D weight is tried in graph order as the seed of a region (shard.py follows its
columns forward). Where a region meets an operand computed whole, the nearest products that compute it
are tried as seeds too, so Q's region takes K's and V's projections (whole KV groups go with their query
heads, or K/V stay whole when their heads do not split), and the gate's region takes the up projection.
A region is kept when it ends in partial sums (an attention's out-projection, an MLP's down projection)
or, for a product of at least `gather_bytes` of weight, in graph outputs gathered (a vocabulary-parallel
LM head). An embedding table of at least `gather_bytes` splits by vocabulary rows: each rank looks up the
ids in its rows (others give zeros) and an ALL_REDUCE sums. A region that cannot split names the node
and why; its weights stay replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.view import import_graph
from .facts import Facts, constant_value, measure_all
from .shard import NeedsGroups, Pass, Shard, Split, Unsplittable, weight_operand

GATHER_BYTES = 64 << 20  # an LM head under this many bytes of weight stays whole on every rank
LAYOUT = {"Transpose", "Reshape", "Identity", "Cast", "Squeeze", "Unsqueeze"}


@dataclass
class SiteSplit:
    name: str
    q_heads: int | None
    kv_heads: int | None
    q_per_rank: int | None  # None: the site runs whole on every rank
    kv_per_rank: int | None  # None: K/V whole on every rank (each rank slices the heads it needs)
    note: str = ""
    head_size: int = 0
    v_head_size: int = 0
    element_bytes: int = 4  # of its K/V (what a cache of them holds per element)
    kv_replicas: int = 1  # ranks holding each KV head (> 1: KV heads fewer than the ranks, replicated)


@dataclass
class ParallelPlan:
    ranks: int
    graph: gs.Graph
    nodes: list[gs.Node]
    facts: Facts
    split: Split
    sites: list[SiteSplit] = field(default_factory=list)
    replicated: list[tuple[str, str]] = field(default_factory=list)  # (product node, why it stays whole)
    gather_bytes: int = GATHER_BYTES


def find_split(model: onnx.ModelProto, ranks: int, feeds: dict[str, np.ndarray], *, sites=(),
               gather_bytes: int = GATHER_BYTES, budget: int | None = None) -> ParallelPlan:
    if ranks < 2:
        raise ValueError(f"--tp {ranks}: tensor parallelism needs at least 2 ranks")
    graph = import_graph(model)
    graph.toposort()
    for k, node in enumerate(graph.nodes):  # the rank writer finds nodes by name: every node has one
        if not node.name:
            node.name = f"tp_node_{k}"
    nodes = list(graph.nodes)
    facts = measure_all(model, feeds, budget)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    cache = _cache_outputs(graph, sites)
    finder = _Finder(Pass(graph, nodes, facts, ranks, opset, cache), nodes, gather_bytes)
    split, replicated = finder.grow_all(sites)
    for i, node in enumerate(nodes):  # embedding tables: split by vocabulary rows over the threshold
        table = constant_value(node.inputs[0]) if node.op == "Gather" and node.inputs else None
        if table is None or table.ndim != 2 or table.size < 1024 or node.inputs[1].name in split.sharded:
            continue
        if node.attrs.get("axis", 0) % 2 == 0 and table.shape[0] % ranks == 0 and table.nbytes >= gather_bytes:
            split.vocab.append(i)
        else:
            why = (f"{table.shape[0]} rows do not split into {ranks}" if table.shape[0] % ranks else
                   f"{table.nbytes} bytes, under the {gather_bytes}-byte threshold for a vocabulary split")
            replicated.append((node.name, f"embedding table {list(table.shape)}: kept whole on every rank ({why})"))
    plan = ParallelPlan(ranks, graph, nodes, facts, split, replicated=replicated, gather_bytes=gather_bytes)
    plan.sites = [_site_split(s, split, ranks, facts) for s in sites]
    return plan


class _Finder:
    def __init__(self, one_pass: Pass, nodes: list[gs.Node], gather_bytes: int):
        self.one_pass, self.nodes, self.gather_bytes = one_pass, nodes, gather_bytes
        self.producer = {o.name: i for i, n in enumerate(nodes) for o in n.outputs}
        self.groups: dict[int, int] = {}  # seeds whose columns are blocks (a fused QKV projection)
        self.copies: dict[int, int] = {}  # seeds whose column blocks are replicated (KV heads fewer than ranks)

    def grow_all(self, sites=()) -> tuple[Split, list[tuple[str, str]]]:
        """Seeds in order: the products nearest above each site's query (its Q projection), then every
        other product with a 2-D weight in graph order."""
        seeds: set[int] = set()
        inputs: dict[str, Shard] = {}
        split = self.one_pass.run(seeds, inputs, self.groups, self.copies)
        covered: set[int] = set()
        replicated: list[tuple[str, str]] = []
        tensors = {t.name: t for n in self.nodes for t in n.outputs}
        first = [i for s in sites if s.query in tensors for i in self._nearest(tensors[s.query])[0]]
        rest = [i for i, n in enumerate(self.nodes) if weight_operand(n) is not None]
        for c in dict.fromkeys(first + rest):
            if c in covered:
                continue
            try:
                try:
                    grown, grown_inputs, new = self._grow(seeds | {c}, inputs)
                except NeedsGroups as e:  # a fused projection: its columns in blocks, each split on its own
                    self.groups[c] = e.groups
                    grown, grown_inputs, new = self._grow(seeds | {c}, inputs)
                reason = self._refuse(split, new, c)
            except Unsplittable as e:
                self.groups.pop(c, None)
                reason = str(e)
            if reason:
                replicated.append((self.nodes[c].name, reason))
                continue
            seeds, inputs, split = grown, grown_inputs, new
            covered |= seeds | set(split.rows)
        return split, [(n, r) for n, r in replicated if not any(self.nodes[i].name == n for i in covered)]

    def _grow(self, seeds: set[int], inputs: dict[str, Shard]) -> tuple[set[int], dict[str, Shard], Split]:
        """Run to a fixed point: graph inputs met become sharded inputs; an activation sliced whole is
        split at the product computing it where that keeps the pass valid."""
        tried: set[tuple[int, int]] = set()
        while True:
            split = self.one_pass.run(seeds, inputs, self.groups, self.copies)
            if split.input_shards.keys() - inputs.keys():
                inputs = dict(split.input_shards)
                continue
            upgraded = False
            for key in split.activation_slices:
                if key in tried or key in split.index_shifts:  # indices: sliced and shifted by design
                    continue
                tried.add(key)
                for seed, shards, copies in self._splits_above(self.nodes[key[0]].inputs[key[1]], seeds, inputs):
                    try:
                        trial = self.one_pass.run(seed, shards, self.groups, copies)
                    except Unsplittable:
                        continue
                    if key not in trial.activation_slices:
                        seeds, inputs, self.copies = seed, dict(trial.input_shards), copies
                        upgraded = True
                        break
                if upgraded:
                    break
            if not upgraded:
                return seeds, inputs, split

    def _splits_above(self, t: gs.Tensor, seeds: set[int], inputs: dict[str, Shard]):
        """Ways to compute `t` already split, nearest first: a product with a 2-D weight above it split by
        columns (then with its column blocks replicated: KV heads fewer than the ranks), or a graph input
        above it (a past K/V) fed in slices along one of its axes."""
        products, graph_inputs = self._nearest(t)
        n = self.one_pass.n
        for i in products:
            if i not in seeds:
                yield seeds | {i}, inputs, self.copies
                for c in range(2, n):
                    if n % c == 0 and i not in self.groups:
                        yield seeds | {i}, inputs, {**self.copies, i: c}
        for name in graph_inputs:
            if name in inputs:
                continue
            for axis, size in enumerate(self.one_pass.facts.shapes[name]):
                if size > 1 and size % n == 0:
                    yield seeds, {**inputs, name: Shard(axis)}, self.copies

    def _nearest(self, t: gs.Tensor) -> tuple[list[int], list[str]]:
        """The products with a 2-D weight nearest above `t` on each path, and the graph inputs reached
        without passing one, nearest first."""
        found, reached, frontier, seen = [], [], [t], set()
        inputs = self.one_pass.inputs
        while frontier:
            nxt: list[gs.Tensor] = []
            for x in frontier:
                i = self.producer.get(x.name)
                if i is None:
                    if x.name in inputs and x.name not in reached:
                        reached.append(x.name)
                    continue
                if i in seen:
                    continue
                seen.add(i)
                if weight_operand(self.nodes[i]) is not None:
                    found.append(i)
                else:
                    nxt.extend(y for y in self.nodes[i].inputs if constant_value(y) is None)
            frontier = nxt
        return found, reached

    def _refuse(self, before: Split, after: Split, seed: int) -> str:
        """Why a grown region is not kept ('' when it is)."""
        if set(after.rows) - set(before.rows):
            return ""
        new_gathered = after.gathered.keys() - before.gathered.keys()
        if new_gathered:
            size = np.asarray(constant_value(self.nodes[seed].inputs[1])).nbytes
            if size >= self.gather_bytes:
                return ""
            return f"{size} bytes of weight, under the {self.gather_bytes}-byte threshold for a split with ALL_GATHER"
        return "its columns reach no product that splits by rows and no graph output"


def _cache_outputs(graph: gs.Graph, sites) -> set[str]:
    """Graph outputs that are a site's K or V (after the cache concat), through layout ops (and a Concat of
    one input: an exporter's present without a past): each rank keeps the heads it computes."""
    kv = {n for s in sites for n in (s.key, s.value, s.new_key, s.new_value) if n}
    consumers: dict[str, list[gs.Node]] = {}
    for node in graph.nodes:
        for t in node.inputs:
            consumers.setdefault(t.name, []).append(node)
    frontier, seen = list(kv), set(kv)
    while frontier:
        name = frontier.pop()
        for node in consumers.get(name, []):
            if node.op in LAYOUT or node.op == "Concat" and len(node.inputs) == 1:
                out = node.outputs[0].name
                if out not in seen:
                    seen.add(out)
                    frontier.append(out)
    outputs = {o.name for o in graph.outputs}
    return seen & outputs


def _site_split(site, split: Split, ranks: int, facts: Facts) -> SiteSplit:
    heads_axis = {"BNSH": 1, "BSNH": 2, "BNHS": 1}.get(getattr(site.q_layout, "value", ""), None)

    def measured(name, fallback):  # a fused op's site may not record its heads: its operand's shape says them
        shape = facts.shapes.get(name) if name else None
        return fallback or (shape[heads_axis] if shape and heads_axis is not None and site.rank == 4 else None)

    width = np.dtype(facts.dtypes.get(site.key, np.float32)).itemsize
    q = measured(site.query, site.q_heads)
    kv = measured(site.key, site.kv_heads) or q
    head, v_head = site.head_size or 0, site.v_head_size or site.head_size or 0
    if site.query not in split.sharded:
        return SiteSplit(site.name, q, kv, None, None, "whole on every rank (its query heads do not split)",
                         head, v_head, width)
    shard = split.sharded[site.query]
    if heads_axis is not None and site.rank == 4 and shard.axis != heads_axis:
        return SiteSplit(site.name, q, kv, None, None, f"its query is split along axis {shard.axis}, not its heads "
                                                       f"(axis {heads_axis})", head, v_head, width)
    q_rank = q // ranks if q else None
    kv_shard = next((split.sharded[n] for n in (site.key, site.new_key) if n and n in split.sharded), None)
    if kv_shard is not None:
        blocks = kv_shard.blocks(ranks)
        note = (f"KV heads replicated: rank r holds KV head r * {kv} // {ranks} ({kv_shard.copies} ranks "
                "per KV head)") if kv_shard.copies > 1 else ""
        return SiteSplit(site.name, q, kv, q_rank, kv // blocks if kv else None, note, head, v_head, width,
                         kv_shard.copies)
    return SiteSplit(site.name, q, kv, q_rank, None, f"K/V whole on every rank: {kv} KV heads do not split "
                                                     f"into {ranks}", head, v_head, width)
