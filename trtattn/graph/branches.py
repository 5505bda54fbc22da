"""An If on a boolean graph input, taken one way: the model with that input fixed (Optimum's merged
decoder with use_cache_branch True is its decoder with a cache; False, its first step).

The chosen branch's nodes and initializers move into the main graph; each branch output reaches the If's
output name through an Identity (a branch may return an outer tensor as it is). What the taken model
no longer needs goes: the nodes that made left-out placeholders, and the inputs and weights only the other
branch read (a first step's past, a cached step's encoder states), so the model's interface is the
branch's own. The input model is not modified."""

from __future__ import annotations

import onnx

from ..errors import TrtattnError
from .dependence import node_reads


def branch_inputs(model: onnx.ModelProto) -> list[str]:
    """Boolean graph inputs that are the condition of an If of the main graph."""
    inputs = {i.name for i in model.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.BOOL}
    return sorted({n.input[0] for n in model.graph.node if n.op_type == "If" and n.input[0] in inputs})


def empty_outputs(branch: onnx.GraphProto) -> set[str]:
    """Outputs a branch returns as a constant with no elements (placeholders: the with-cache branch of
    Optimum's merged seq2seq decoder returns empty cross-attention presents, by design)."""
    made = {o: n for n in branch.node for o in n.output}
    found = set()
    for out in branch.output:
        node = made.get(out.name)
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node is not None \
            and node.op_type == "Constant" else next((t for t in branch.initializer if t.name == out.name), None)
        if value is not None and 0 in value.dims:
            found.add(out.name)
    return found


def take_branch(model: onnx.ModelProto, name: str, value: bool, drop_empty: bool = False) -> onnx.ModelProto:
    """`model` with the boolean input `name` fixed to `value`: every If it decides replaced by its branch.
    drop_empty: the branch's placeholder outputs (empty constants) are left out of the model's outputs, so
    the model can be run and compared like any other. Nodes no output depends on, and inputs the If read
    but nothing reads now, are removed."""
    if name not in branch_inputs(model):
        raise TrtattnError(f"'{name}' is not a boolean input that decides an If of the main graph")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes, dropped = [], set()
    for node in out.graph.node:
        if node.op_type != "If" or node.input[0] != name:
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if value else "else_branch"))
        if drop_empty:
            for made, wanted in zip(branch.output, node.output):
                if made.name in empty_outputs(branch):
                    dropped.add(wanted)
        nodes.extend(branch.node)
        out.graph.initializer.extend(branch.initializer)
        out.graph.sparse_initializer.extend(branch.sparse_initializer)
        for made, wanted in zip(branch.output, node.output):
            if wanted and wanted != made.name and wanted not in dropped:  # (a branch may name its output as the If's)
                nodes.append(onnx.helper.make_node("Identity", [made.name], [wanted], name=f"{wanted}/branch"))
    if dropped:
        kept = [o for o in out.graph.output if o.name not in dropped]
        del out.graph.output[:]
        out.graph.output.extend(kept)
    read_before = _reads(model.graph.node)
    nodes = _live(nodes, {o.name for o in out.graph.output})
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    # inputs only the branch not taken read (a first step's past, a cached step's encoder states), and the flag
    read = _reads(nodes)
    kept = [i for i in out.graph.input if i.name in read or i.name not in read_before]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    weights = [t for t in out.graph.initializer if t.name in read]  # the other branch's weights go with it
    del out.graph.initializer[:]
    out.graph.initializer.extend(weights)
    return out


def _reads(nodes) -> set[str]:
    """Every tensor name the nodes read (a branch's subgraphs read outer names directly)."""
    return {name for n in nodes for name in node_reads(n)}


def _live(nodes: list, wanted: set[str]) -> list:
    """The nodes an output depends on, in their order: placeholders dropped, the nodes that made them go too."""
    keep = [False] * len(nodes)
    for k in range(len(nodes) - 1, -1, -1):  # the nodes are in topological order
        if wanted & set(nodes[k].output):
            keep[k] = True
            wanted |= _reads([nodes[k]])
    return [n for n, kept in zip(nodes, keep) if kept]
