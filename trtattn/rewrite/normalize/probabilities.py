"""What sits between an attention's Softmax and its second MatMul (BMM2), and the guards there moved out.

TensorRT's documented fusion pattern has nothing between the Softmax and BMM2 but Q/DQ. torch's SDPA
TorchScript export puts a guard there for rows that attend to no key (all logits -inf, so the softmax is
NaN): Softmax -> Where(IsNaN(P), 0, P) -> MatMul. normalize moves it after BMM2:

    Softmax -> MatMul -> Y_raw;  Y = Where(IsNaN(Y_raw), 0, Y_raw)

Exact: a softmax is NaN for a whole row or not at all, a NaN row of P makes that row of P.V NaN, and the
guard turns it into the 0 the original gives (0 . V); every other row passes unchanged. (Only a non-finite
V could tell the two apart: then the original is already NaN or inf there.)

The ONNX Attention op's function body zeroes the rows where its bias B is -inf at every key (its fully-masked-row
guard, match/logit_ops/probs_mask.masked_rows): Softmax -> Where(ReduceMax(B) == -inf, 0, P) -> MatMul. The
condition is one value per row ([.., q, 1]), so it moves after BMM2 the same way, kept as it is:

    Softmax -> MatMul -> Y_raw;  Y = Where(ReduceMax(B) == -inf, 0, Y_raw)

exact for the same reason (a zeroed row of P is a zero row of P.V). A core re-emitted on [batch, heads, seq, dim]
(canonical.py) tests its own copy of B in the new layout.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.dependence import value_readers
from ...graph.view import GraphView
from ...match import logit_ops
from ...match.logit_ops.base import scalar

QDQ = ("QuantizeLinear", "DequantizeLinear")


def between(model: onnx.ModelProto | onnx.GraphProto, softmax: str) -> list[str] | None:
    """Op types of the nodes between the Softmax node `softmax` and the MatMul its probabilities feed, in graph
    order (the IsNaN of a guard included); None when no MatMul is reached through single consumers. (A graph:
    a control-flow body.)"""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for k, i in enumerate(n.input):
            if not (n.op_type == "CastLike" and k == 1) and n.op_type not in ("Shape", "Size"):  # type, shape only
                consumers.setdefault(i, []).append(n)
    node = next((n for n in graph.node if n.name == softmax), None)
    if node is None:
        return None
    t, ops = node.output[0], []
    for _ in range(8):
        readers = consumers.get(t, [])
        ops += [r.op_type for r in readers if r.op_type == "IsNaN"]
        main = [r for r in readers if r.op_type != "IsNaN"]
        if len(main) != 1:
            return None
        if main[0].op_type == "MatMul":
            return ops
        ops.append(main[0].op_type)
        t = main[0].output[0]
    return None


def not_documented(ops: list[str] | None) -> list[str]:
    """The ops TensorRT's pattern does not allow between the Softmax and BMM2 (anything but Q/DQ)."""
    return [op for op in ops or [] if op not in QDQ]


def _guard(sm_out: gs.Tensor):
    """(IsNaN, Where, MatMul) when the probabilities go Softmax -> Where(IsNaN(P), 0, P) -> MatMul, else None."""
    readers = list(sm_out.outputs)
    isnan = [n for n in readers if n.op == "IsNaN"]
    where = [n for n in readers if n.op == "Where"]
    if len(readers) != 2 or len(isnan) != 1 or len(where) != 1:
        return None
    isnan, where = isnan[0], where[0]
    fill = where.inputs[1]
    if (where.inputs[0] is not isnan.outputs[0] or where.inputs[2] is not sm_out or len(isnan.outputs[0].outputs) != 1
            or not isinstance(fill, gs.Constant) or fill.values.size != 1 or float(fill.values.reshape(-1)[0]) != 0.0):
        return None
    matmuls = list(where.outputs[0].outputs)
    if len(matmuls) != 1 or matmuls[0].op != "MatMul" or matmuls[0].inputs[0] is not where.outputs[0]:
        return None
    return isnan, where, matmuls[0]


def move_nan_guard(graph: gs.Graph, softmax: gs.Node, prefix: str) -> bool:
    """Move torch's NaN guard of this Softmax after its BMM2 (module doc). False when there is none."""
    found = _guard(softmax.outputs[0])
    if found is None:
        return False
    _, where, bmm2 = found
    y = bmm2.outputs[0]
    raw = gs.Variable(f"{prefix}/bmm2_unguarded", dtype=y.dtype, shape=y.shape)
    bmm2.inputs[0] = softmax.outputs[0]
    bmm2.outputs = [raw]
    is_nan = gs.Variable(f"{prefix}/bmm2_isnan", dtype=bool, shape=y.shape)
    graph.nodes.append(gs.Node("IsNaN", f"{prefix}/nan_guard_isnan", inputs=[raw], outputs=[is_nan]))
    graph.nodes.append(gs.Node("Where", f"{prefix}/nan_guard", inputs=[is_nan, where.inputs[1], raw], outputs=[y]))
    return True  # the old IsNaN/Where read nothing now: cleanup removes them


def row_guard(graph: gs.Graph, softmax: gs.Node) -> tuple[gs.Node, gs.Node, gs.Tensor, gs.Tensor] | None:
    """(Where, MatMul, bias B, condition) when the probabilities go Softmax [-> Cast] -> Where(ReduceMax(B) == -inf,
    0, P) -> MatMul (the op's fully-masked-row guard, module doc), else None. B is None when the condition is one value per
    row already folded (a constant bias): zeroing whole rows moves after the product all the same."""
    p = softmax.outputs[0]
    readers = value_readers(p)
    while len(readers) == 1 and readers[0].op == "Cast":  # the softmax computed in another precision
        p = readers[0].outputs[0]
        readers = value_readers(p)
    if len(readers) != 1 or readers[0].op != "Where":
        return None
    where = readers[0]
    # the product with V; other readers (the probabilities returned) keep reading the guarded probabilities
    matmuls = [n for n in value_readers(where.outputs[0]) if n.op == "MatMul" and n.inputs[0] is where.outputs[0]]
    if len(matmuls) != 1:
        return None
    view = GraphView(graph)
    found = logit_ops.masked_rows(view, where, p)
    if found is not None:
        return where, matmuls[0], found[0], found[1]
    cond = where.inputs[0]  # folded to a constant (a constant bias): still one value per row
    fill = where.inputs[1]
    like = view.producer(fill)
    zero = scalar(view, like.inputs[0] if like is not None and like.op == "CastLike" else fill) == 0.0
    if where.inputs[2] is p and zero and cond.shape and cond.shape[-1] == 1:
        return where, matmuls[0], None, cond
    return None


def move_row_guard(graph: gs.Graph, softmax: gs.Node, prefix: str) -> bool:
    """Move the op's fully-masked-row guard of this Softmax after its BMM2 (module doc). False when there is none."""
    found = row_guard(graph, softmax)
    if found is None:
        return False
    where, bmm2, _, cond = found
    y = bmm2.outputs[0]
    raw = gs.Variable(f"{prefix}/bmm2_unguarded", dtype=y.dtype, shape=y.shape)
    bmm2.inputs[0] = where.inputs[2]
    bmm2.outputs = [raw]
    graph.nodes.append(gs.Node("Where", f"{prefix}/masked_rows", inputs=[cond, zero_like(graph, raw, prefix), raw],
                               outputs=[y]))
    return True  # the old Where feeds nothing now (cleanup removes it) or only what returns the probabilities


def zero_like(graph: gs.Graph, t: gs.Tensor, prefix: str) -> gs.Tensor:
    """A scalar 0 of `t`'s element type (CastLike when the type is not known here)."""
    if t.dtype is not None:
        return gs.Constant(f"{prefix}/zero", np.zeros((), np.dtype(t.dtype)))
    out = gs.Variable(f"{prefix}/zero")
    graph.nodes.append(gs.Node("CastLike", f"{prefix}/zero_like", inputs=[
        gs.Constant(f"{prefix}/zero_f32", np.zeros((), np.float32)), t], outputs=[out]))
    return out
