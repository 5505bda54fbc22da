"""Evaluation order of a recorded network, at tensor level.

A parsed ONNX model is one opaque layer, and the builder cuts graphs so that some of that layer's
inputs (placeholders) are computed by TensorRT layers from the same layer's outputs. At layer level
that is a cycle; at tensor level it is not, as long as each ONNX output only needs ONNX inputs
that do not depend on it. So an ONNX layer is evaluated in stages: each step computes the outputs
whose ONNX dependencies are available.
"""

from __future__ import annotations

from functools import lru_cache

from onnx import AttributeProto


def _subgraph_outer_names(node) -> set[str]:
    """Names a control-flow node's bodies read from the enclosing scope."""
    names = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            produced = {i.name for i in g.input} | {i.name for i in g.initializer}
            for inner in g.node:
                produced.update(inner.output)
            for inner in g.node:
                names.update(n for n in inner.input if n and n not in produced)
                names.update(_subgraph_outer_names(inner) - produced)
    return names


def onnx_dependencies(model) -> dict[str, frozenset[str]]:
    """For each graph output, the graph inputs (not initializers) it depends on."""
    return _dependencies(model.SerializeToString())


@lru_cache(maxsize=64)
def _dependencies(serialized: bytes) -> dict[str, frozenset[str]]:
    import onnx

    model = onnx.load_from_string(serialized)
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = {i.name for i in graph.input} - initializers
    producer = {}
    for node in graph.node:
        for out in node.output:
            if out:
                producer[out] = node
    memo: dict[str, frozenset[str]] = {}

    def deps(name: str) -> frozenset[str]:
        if name in memo:
            return memo[name]
        memo[name] = frozenset()  # guards against malformed cyclic graphs
        if name in inputs:
            result = frozenset([name])
        elif name in producer:
            node = producer[name]
            needed = [n for n in node.input if n] + sorted(_subgraph_outer_names(node))
            result = frozenset().union(*[deps(n) for n in needed]) if needed else frozenset()
        else:
            result = frozenset()
        memo[name] = result
        return result

    return {out.name: deps(out.name) for out in graph.output}


def plan(network):
    """Steps [(layer_state, [output indices])] in an order that respects every tensor dependency,
    plus what could not be scheduled [(layer_state, [output indices])] (cycles, missing inputs)."""
    ready = {id(t) for t in network._inputs}
    pending = {id(st): set(range(len(st.outputs))) for st in network._layers}
    steps = []
    progress = True
    while progress:
        progress = False
        for st in network._layers:
            todo = pending[id(st)]
            if not todo:
                continue
            if st.kind == "ONNX":
                deps = onnx_dependencies(st.onnx.model)
                available = {st.onnx.inputs[i] for i, t in enumerate(st.inputs) if t is not None and id(t) in ready}
                now = [j for j in sorted(todo) if deps[st.onnx.outputs[j]] <= available]
            else:
                needed = [t for t in st.inputs if t is not None]
                now = sorted(todo) if all(id(t) in ready for t in needed) else []
            if now:
                steps.append((st, now))
                todo.difference_update(now)
                ready.update(id(st.outputs[j]) for j in now)
                progress = True
    unresolved = [(st, sorted(pending[id(st)])) for st in network._layers if pending[id(st)]]
    return steps, unresolved
