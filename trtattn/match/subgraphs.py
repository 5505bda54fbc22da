"""Attention inside control flow: the branches of an If (optimum's merged with/without-cache decoders) and
Loop/Scan bodies are searched like the main graph.

A subgraph reads tensors of the scopes around it by name. To match it, it is made a model of its own:
those tensors become its inputs, with the types and shapes the outer graph knows (small constants are
copied in, so a scale stays a constant; weights stay inputs the activation test knows are weights).
Its sites carry the path to the subgraph (AttentionSite.graph: (node output, attribute) pairs), so the
rewrite finds the subgraph in the graph it rewrites and fuses the site in place.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph.view import GraphView

SUBGRAPHS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
SMALL = 64  # constants of at most this many elements are copied into the subgraph's model


def subgraphs(graph: gs.Graph):
    """(node, attribute, subgraph) for every control-flow node of `graph` (not nested ones)."""
    for node in graph.nodes:
        for attr in SUBGRAPHS.get(node.op, ()):
            sub = node.attrs.get(attr)
            if isinstance(sub, gs.Graph):
                yield node, attr, sub


# with an Exp, a softmax written without a Softmax op (canonical.py) may be there
WRITTEN_SOFTMAX = {"ReduceSum", "ReduceLogSumExp", "LogSoftmax"}


def has_softmax(nodes) -> bool:
    """Do these NodeProtos hold a Softmax, an ONNX Attention, an Exp normalised as a softmax may be, or an
    integer normalisation between products (canonical.py: an integer softmax, I-BERT's quant mode)?"""
    ops = {n.op_type for n in nodes}
    integer = {"Cast", "Div", "ReduceSum"} <= ops and bool(ops & {"MatMul", "MatMulInteger", "Einsum"})
    return bool(ops & {"Softmax", "Attention"}) or ("Exp" in ops and bool(ops & WRITTEN_SOFTMAX)) or integer


def has_subgraph_softmax(graph: onnx.GraphProto) -> bool:
    """The same, in an If branch or a Loop/Scan body of `graph`, at any depth."""
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH and (has_softmax(a.g.node) or has_subgraph_softmax(a.g)):
                return True
    return False


def find(graph: gs.Graph, path) -> gs.Graph:
    """The subgraph at `path` ((node output name, attribute), ...) in `graph`."""
    for out, attr in path:
        node = next((n for n in graph.nodes if any(o.name == out for o in n.outputs)), None)
        if node is None or not isinstance(node.attrs.get(attr), gs.Graph):
            raise KeyError(f"no subgraph {attr} under the node making {out}")
        graph = node.attrs[attr]
    return graph


def find_proto(graph: onnx.GraphProto, path) -> onnx.GraphProto:
    """The same as `find`, on the protobuf graph."""
    for out, attr in path:
        node = next((n for n in graph.node if out in n.output), None)
        body = next((a.g for a in node.attribute if a.name == attr and a.type == onnx.AttributeProto.GRAPH), None) \
            if node is not None else None
        if body is None:
            raise KeyError(f"no subgraph {attr} under the node making {out}")
        graph = body
    return graph


def view_of(outer: GraphView, sub: gs.Graph) -> tuple[GraphView, set[str]]:
    """A view of `sub` as a model of its own, and the names of its outer weights."""
    model, weights = _standalone(outer, sub)
    graph = gs.import_onnx(model)
    return GraphView(graph, model), weights


def _outer_variables(sub: gs.Graph) -> list[gs.Variable]:
    """Computed tensors `sub` (and the subgraphs in it) read from outside."""
    inside = {t.name for t in sub.inputs}
    for n in sub.nodes:
        inside.update(o.name for o in n.outputs)
    out, seen = [], set()
    for n in sub.nodes:
        reads = list(n.inputs)
        for attr in SUBGRAPHS.get(n.op, ()):
            if isinstance(n.attrs.get(attr), gs.Graph):
                reads += _outer_variables(n.attrs[attr])
        for t in reads:
            if isinstance(t, gs.Variable) and t.name and t.name not in inside and t.name not in seen:
                seen.add(t.name)
                out.append(t)
    return out


def _value_info(name: str, dtype, shape) -> onnx.ValueInfoProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype is not None else onnx.TensorProto.FLOAT
    dims = None if shape is None else [d if (isinstance(d, int) and d >= 0) or isinstance(d, str) else None
                                      for d in shape]
    return onnx.helper.make_tensor_value_info(name, elem, dims)


def _standalone(outer: GraphView, sub: gs.Graph) -> tuple[onnx.ModelProto, set[str]]:
    """`sub` as a model: what it reads from outside becomes inputs (weights never copied), small constants
    stay constants."""
    body = sub.copy()
    inputs, weights, swapped = [], set(), {}
    for node in body.nodes:
        for i, t in enumerate(node.inputs):
            if isinstance(t, gs.Constant) and t.shape is not None and int(np.prod(t.shape)) > SMALL:
                if t.name not in swapped:
                    swapped[t.name] = gs.Variable(t.name, dtype=t.dtype, shape=list(t.shape))
                    inputs.append(_value_info(t.name, t.dtype, list(t.shape)))
                    weights.add(t.name)
                node.inputs[i] = swapped[t.name]
    own = {t.name for t in body.inputs}
    inits = []
    for t in _outer_variables(sub):
        if t.name in own or t.name in swapped:
            continue
        value = outer.const(t)
        if value is not None and value.size <= SMALL:  # folded in the outer graph: a constant here too
            inits.append(onnx.numpy_helper.from_array(np.asarray(value), t.name))
            continue
        inputs.append(_value_info(t.name, outer.dtype(t), outer.shape(t)))
    proto = gs.export_onnx(body, do_type_check=False)
    proto.graph.input.extend(inputs)
    proto.graph.initializer.extend(inits)
    del proto.opset_import[:]
    proto.opset_import.extend([onnx.helper.make_opsetid("", outer.opset)])
    return proto, weights
