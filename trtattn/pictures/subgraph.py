"""Which nodes a site's picture shows, and what each one does to the attention.

A fused site is drawn as the nodes *between* its operands and its output (reachable from Q/K/V and
reaching the output), each annotated with its role (the two products, the softmax, scale, mask, bias,
soft-cap, cache, rope). A site that was not fused is drawn as the neighbourhood of its softmax, with the
node that stopped the match (named in the reason) highlighted. What replaced a site is the fused op and
its neighbours in the written model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import onnx

MAX_NODES = 60  # a picture stays readable; a larger region is cut at the nodes farthest from the site

# MaskStep.op -> the role drawn
STEP_ROLES = {"scale": "scale", "add": "mask / bias", "sub": "mask / bias", "where": "mask", "where_not": "mask",
              "softcap": "soft-cap", "reshape": "layout"}


@dataclass
class Region:
    """Nodes of one graph to draw: names in graph order, each node's role, and the highlighted ones."""

    graph: onnx.GraphProto
    nodes: list[str]
    roles: dict[str, str] = field(default_factory=dict)
    highlight: set[str] = field(default_factory=set)
    inputs: list[str] = field(default_factory=list)  # tensors entering the region, drawn as its sources


def node_name(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def _index(graph: onnx.GraphProto):
    names = [node_name(n, i) for i, n in enumerate(graph.node)]
    producer = {o: names[i] for i, n in enumerate(graph.node) for o in n.output if o}
    consumers: dict[str, list[str]] = {}
    for i, n in enumerate(graph.node):
        for t in n.input:
            if t:
                consumers.setdefault(t, []).append(names[i])
    return names, producer, consumers


def _closure(start: set[str], step) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in step(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# Inputs that only carry sizes (shapes, axes, starts): the data path does not go through them, so the
# Shape -> Gather -> Concat chains that feed Reshape targets stay out of the picture.
SIZE_INPUTS = {"Reshape": 1, "Expand": 1, "Slice": 1, "Tile": 1, "Unsqueeze": 1, "Squeeze": 1, "Pad": 1,
               "ReduceSum": 1, "ReduceMax": 1, "ReduceMean": 1, "Resize": 1, "Split": 1, "TopK": 1}
SIZE_OPS = {"Shape", "Size", "ConstantOfShape", "Range", "NonZero"}


def _data_consumers(graph: onnx.GraphProto, names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i, n in enumerate(graph.node):
        if n.op_type in SIZE_OPS:
            continue
        first_size = SIZE_INPUTS.get(n.op_type, len(n.input))
        for k, t in enumerate(n.input):
            if t and k < first_size:
                out.setdefault(t, []).append(names[i])
    return out


def between(graph: onnx.GraphProto, sources: set[str], output: str) -> list[str]:
    """Nodes on a data path from the tensors `sources` to the tensor `output`, in graph order."""
    names, producer, _ = _index(graph)
    consumers = _data_consumers(graph, names)
    by_name = {names[i]: n for i, n in enumerate(graph.node)}
    forward = _closure({c for s in sources for c in consumers.get(s, [])},
                       lambda n: [c for o in by_name[n].output for c in consumers.get(o, [])])
    start = {producer[output]} if output in producer else set()
    backward = _closure(start, lambda n: [producer[t] for t in by_name[n].input if t in producer])
    keep = forward & backward
    return [n for n in names if n in keep]


def around(graph: onnx.GraphProto, centre: str, radius: int = 4) -> list[str]:
    """Nodes within `radius` edges of the node `centre` (either direction), in graph order."""
    names, producer, consumers = _index(graph)
    by_name = {names[i]: n for i, n in enumerate(graph.node)}
    if centre not in by_name:
        return []
    near, frontier = {centre}, {centre}
    for _ in range(radius):
        nxt = set()
        for n in frontier:
            node = by_name[n]
            nxt |= {producer[t] for t in node.input if t in producer}
            nxt |= {c for o in node.output for c in consumers.get(o, [])}
        frontier = nxt - near
        near |= frontier
        if len(near) >= MAX_NODES:
            break
    return [n for n in names if n in near][:MAX_NODES]


def _region(graph: onnx.GraphProto, nodes: list[str]) -> Region:
    names, producer, _ = _index(graph)
    by_name = {names[i]: n for i, n in enumerate(graph.node)}
    inside = set(nodes)
    constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    inputs = []  # the data entering the region (constants and weights would only crowd the picture)
    for n in nodes:
        for t in by_name[n].input:
            if t and t not in constants and producer.get(t) not in inside and t not in inputs:
                inputs.append(t)
    return Region(graph, nodes, inputs=inputs[:12])


def site_region(graph: onnx.GraphProto, site) -> Region:
    """The nodes between a fused site's operands and its output, each annotated with its role."""
    sources = {t for t in (site.query, site.key, site.value, site.key_transposed, site.past_key, site.past_value)
               if t}
    if site.rope is not None:
        sources |= {site.rope.q_input, site.rope.k_input}
    nodes = between(graph, sources, site.output)
    if not nodes and site.softmax:
        nodes = around(graph, site.softmax)
    region = _region(graph, nodes[:MAX_NODES])
    region.roles = roles(graph, region.nodes, site)
    return region


def roles(graph: onnx.GraphProto, nodes: list[str], site) -> dict[str, str]:
    """What each node of the region does to the attention (nodes that only move axes get none)."""
    names, producer, consumers = _index(graph)
    by_name = {names[i]: n for i, n in enumerate(graph.node)}
    out: dict[str, str] = {}
    softmax = site.softmax
    after_softmax = _closure({softmax}, lambda n: [c for o in by_name[n].output for c in consumers.get(o, [])]) \
        if softmax in by_name else set()
    for n in nodes:
        op = by_name[n].op_type
        if n == softmax:
            out[n] = "softmax"
        elif op in ("MatMul", "Einsum", "MatMulInteger", "QLinearMatMul"):
            out[n] = "P·V" if n in after_softmax else "Q·Kᵀ"
    for step in site.mask_steps:
        if step.node in by_name and step.node not in out:
            out[step.node] = STEP_ROLES.get(step.op, step.op)
    caches = {t for t in (site.past_key, site.past_value) if t}
    for n in nodes:
        node = by_name[n]
        if n not in out and node.op_type == "Concat" and caches & set(node.input):
            out[n] = "cache"
    if site.rope is not None:
        for t in (site.query, site.key):
            for n in between(graph, {site.rope.q_input, site.rope.k_input}, t):
                out.setdefault(n, "rope")
    return out


def failed_region(graph: onnx.GraphProto, softmax: str | None, reason: str) -> Region:
    """The neighbourhood of a site that was not fused, the node(s) its reason names highlighted."""
    names = [node_name(n, i) for i, n in enumerate(graph.node)]
    named = [n for n in names if n and re.search(rf"(?<![\w/.]){re.escape(n)}(?![\w/.])", reason)]
    centre = softmax if softmax in names else (named[0] if named else None)
    nodes = around(graph, centre) if centre else []
    for n in named:
        if n not in nodes:
            nodes += around(graph, n, radius=1)
    nodes = [n for n in names if n in set(nodes)][:MAX_NODES]
    region = _region(graph, nodes)
    region.highlight = set(named) or ({centre} if centre else set())
    if softmax in nodes:
        region.roles[softmax] = "softmax"
    return region


def replaced_region(graph: onnx.GraphProto, attention_node: str | None) -> Region | None:
    """The fused op that replaced a site and its neighbours in the written model."""
    if not attention_node:
        return None
    nodes = around(graph, attention_node, radius=1)
    if not nodes:
        return None
    region = _region(graph, nodes)
    region.roles = {attention_node: "fused attention"}
    region.highlight = set()
    return region
