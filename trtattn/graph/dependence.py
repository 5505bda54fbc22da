"""Which graph inputs a tensor depends on by *value*, not only by shape.

A padding mask or position ids reach a tensor by value; a sequence length read off an input through Shape
or Size reaches it only by shape, which every run of the same shape shares. The walk goes up from the
tensor through producers and stops at the ops whose output is a function of their input's shape alone.

Also, for ONNX protos: the names a node reads (`node_reads`), its subgraphs' outer names included.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_graphsurgeon as gs

# ops whose output depends only on the shape of their input: nothing of its values flows through them
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})


def _value_sources(tensor: gs.Tensor, graph_inputs: set[str], limit: int | None) -> Iterator[str]:
    seen: set[int] = set()
    stack = [tensor]
    while stack:
        if limit is not None and len(seen) >= limit:
            return  # the caller asked a bounded question: what was not reached counts as not found
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.name in graph_inputs:
            yield t.name
        for producer in t.inputs:  # a gs tensor's inputs are its producer nodes (none for constants)
            if producer.op not in SHAPE_ONLY_OPS:
                stack.extend(producer.inputs)


def value_inputs(tensor: gs.Tensor, graph_inputs: set[str], limit: int | None = None) -> set[str]:
    """The graph inputs (names in `graph_inputs`) whose values reach `tensor`.
    limit: visit at most this many tensors (a bounded look for callers on a hot path)."""
    return set(_value_sources(tensor, graph_inputs, limit))


def depends_on_input_values(tensor: gs.Tensor, graph_inputs: set[str], limit: int | None = None) -> bool:
    """Whether the value of any graph input in `graph_inputs` reaches `tensor` (stops at the first found).
    limit: as for value_inputs; a walk cut short answers False."""
    return next(_value_sources(tensor, graph_inputs, limit), None) is not None


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Names a node reads: its inputs and the outer-scope names its subgraphs use."""
    names = [i for i in node.input if i]
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            inner = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                inner.update(n.output)
            for n in g.node:
                names.extend(r for r in node_reads(n) if r not in inner)
    return names
