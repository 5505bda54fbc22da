"""Which graph inputs a tensor depends on by *value*, not only by shape or type.

A padding mask or position ids reach a tensor by value; a sequence length read off an input through Shape
or Size reaches it only by shape, which every run of the same shape shares, and CastLike(x, t) reads only
t's element type. The walk goes up from the tensor through producers and follows only the inputs whose
values a node reads (`reads_values`): the one home of that notion, which every consumer count, liveness
and dependence walk of the matcher asks.

Also, for ONNX protos: the names a node reads (`node_reads`), its subgraphs' outer names included.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_graphsurgeon as gs

# inputs a node reads only for their shape or element type, never their values, by op: every input (None)
# or these positions. Nothing of such an input's values flows into the node's outputs.
TYPE_OR_SHAPE_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Shape": None, "Size": None, "EyeLike": None, "RandomNormalLike": None, "RandomUniformLike": None,
    "CastLike": (1,),  # the target type
}


def reads_values(node: gs.Node, index: int) -> bool:
    """Does `node` read the values of its input at `index` (not only its shape or type)?"""
    if node.op not in TYPE_OR_SHAPE_INPUTS:
        return True
    only = TYPE_OR_SHAPE_INPUTS[node.op]
    return only is not None and index not in only


def value_operands(node: gs.Node) -> list[gs.Tensor]:
    """The inputs of `node` whose values it reads."""
    return [t for i, t in enumerate(node.inputs) if reads_values(node, i)]


def reads_values_of(node: gs.Node, tensor: gs.Tensor) -> bool:
    """Does `node` read the values of `tensor` through any of its inputs?"""
    return any(t is tensor and reads_values(node, i) for i, t in enumerate(node.inputs))


def value_readers(tensor: gs.Tensor) -> list[gs.Node]:
    """The consumers of `tensor` that read its values (not those that read only its shape or type)."""
    return [c for c in tensor.outputs if reads_values_of(c, tensor)]


def meta_readers(tensor: gs.Tensor) -> list[gs.Node]:
    """The consumers of `tensor` that read only its shape or type (Shape, Size, CastLike's target, ...)."""
    return [c for c in tensor.outputs if not reads_values_of(c, tensor)]


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
            stack.extend(value_operands(producer))


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
