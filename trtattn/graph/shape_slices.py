"""Shape(x, start, end) as Slice(Shape(x), start, end) while onnx-graphsurgeon folds constants, and back after.

onnx-graphsurgeon's shape folding (fold_constants(fold_shapes=True), which Polygraphy's fold_constants runs)
ignores Shape's start and end (opset 15): it folds Shape(q, start=-2, end=-1) of a static q to q's whole shape,
and a Gather or Slice of it indexes the whole shape. The function body of ONNX's Attention op reads its sizes so,
and the folded model computes with the wrong sizes (or does not load). A Slice of a whole Shape is what it folds
right, so the Shape nodes are given that form for the folding (`explicit`) and the pairs it left are put back
(`merge`): the model keeps its Shape nodes where nothing folded.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

MARK = "/trtattn_shape_slice"  # names the Slice nodes `explicit` writes, so `merge` finds only its own


def _graphs(graph: gs.Graph):
    yield graph
    yield from graph.subgraphs(recursive=True)


def explicit(graph: gs.Graph) -> int:
    """Every Shape node with a start or an end, in `graph` and its If/Loop/Scan bodies, as a whole Shape and a
    Slice of it. Returns how many."""
    count = 0
    for g in _graphs(graph):
        for n in list(g.nodes):
            if n.op != "Shape" or ("start" not in n.attrs and "end" not in n.attrs):
                continue
            start, end = int(n.attrs.pop("start", 0)), n.attrs.pop("end", None)
            out = n.outputs[0]
            whole = gs.Variable(f"{out.name}{MARK}/whole", dtype=np.int64)
            n.outputs = [whole]
            ends = np.iinfo(np.int64).max if end is None else int(end)
            g.nodes.append(gs.Node("Slice", f"{n.name or out.name}{MARK}", inputs=[
                whole, gs.Constant(f"{out.name}{MARK}/start", np.array([start], np.int64)),
                gs.Constant(f"{out.name}{MARK}/end", np.array([ends], np.int64)),
                gs.Constant(f"{out.name}{MARK}/axes", np.array([0], np.int64))], outputs=[out]))
            count += 1
    return count


def merge(graph: gs.Graph) -> int:
    """The Slice(Shape(x)) pairs `explicit` wrote and folding left, as Shape(x, start, end) again. Returns how many."""
    count = 0
    for g in _graphs(graph):
        for sl in list(g.nodes):
            if sl.op != "Slice" or not sl.name.endswith(MARK) or not sl.inputs[0].inputs:
                continue
            shape = sl.inputs[0].inputs[0]
            start, end = (int(np.asarray(t.values).reshape(-1)[0]) for t in sl.inputs[1:3])
            if start:
                shape.attrs["start"] = start
            if end != np.iinfo(np.int64).max:
                shape.attrs["end"] = end
            out = sl.outputs[0]
            sl.outputs.clear()
            shape.outputs = [out]
            g.nodes.remove(sl)
            count += 1
    return count
