"""A Softmax written without a Softmax op, as exporters and hand-written code spell it (issue 18, class 1).

`write_softmax(graph, softmax_node, form)` replaces one Softmax (opset >= 13) by the form; the last node
writes the original probabilities tensor. Used by the fuzzer's `softmax_written` kind and by the tests.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

# each equal to Softmax(x, axis); "sum_eps" adds a tiny epsilon to the sum: the same numbers in float32
# (the sum is >= 1), but nothing proves it equal to a Softmax, so it must be listed, never silent
FORMS = ("onnx_body", "plain", "mul_reciprocal", "reciprocal_first", "exp_logsoftmax", "exp_sub_logsumexp",
         "logsoftmax_body")
UNPROVEN = ("sum_eps",)


def write_softmax(graph: gs.Graph, sm: gs.Node, form: str, tag: str | None = None) -> None:
    opset = int(graph.opset)
    if opset < 13:
        raise ValueError(f"opset {opset}: the forms here are of a single-axis Softmax (opset >= 13)")
    axis = int(sm.attrs.get("axis", -1))
    x, probs = sm.inputs[0], sm.outputs[0]
    tag = tag or f"{sm.name or probs.name}_as_{form}"
    count = [0]

    def op(kind, inputs, **attrs):
        count[0] += 1
        out = gs.Variable(f"{tag}/{kind}_{count[0]}_out", dtype=x.dtype)
        graph.nodes.append(gs.Node(kind, f"{tag}/{kind}_{count[0]}", attrs, list(inputs), [out]))
        return out

    def reduce(kind, t):
        if opset >= 18 or (kind == "ReduceSum" and opset >= 13):
            return op(kind, [t, gs.Constant(f"{tag}/axes_{count[0]}", np.asarray([axis], np.int64))], keepdims=1)
        return op(kind, [t], axes=[axis], keepdims=1)

    def shifted(t):
        return op("Sub", [t, reduce("ReduceMax", t)])

    sm.inputs.clear()
    sm.outputs.clear()
    graph.nodes.remove(sm)
    if form == "onnx_body":
        e = op("Exp", [shifted(x)])
        last = op("Div", [e, reduce("ReduceSum", e)])
    elif form == "plain":
        e = op("Exp", [x])
        last = op("Div", [e, reduce("ReduceSum", e)])
    elif form in ("mul_reciprocal", "reciprocal_first"):
        e = op("Exp", [shifted(x)])
        inv = op("Reciprocal", [reduce("ReduceSum", e)])
        last = op("Mul", [e, inv] if form == "mul_reciprocal" else [inv, e])
    elif form == "exp_logsoftmax":
        last = op("Exp", [op("LogSoftmax", [x], axis=axis)])
    elif form == "exp_sub_logsumexp":
        last = op("Exp", [op("Sub", [x, reduce("ReduceLogSumExp", x)])])
    elif form == "logsoftmax_body":  # ONNX's LogSoftmax function body, under an Exp
        y = shifted(x)
        last = op("Exp", [op("Sub", [y, op("Log", [reduce("ReduceSum", op("Exp", [y]))])])])
    elif form == "sum_eps":
        e = op("Exp", [shifted(x)])
        eps = gs.Constant(f"{tag}/eps", np.asarray(1e-30, np.float32))
        last = op("Div", [e, op("Add", [reduce("ReduceSum", e), eps])])
    else:
        raise ValueError(f"unknown softmax form {form}")
    node = last.inputs[0]
    node.outputs[0] = probs
    graph.toposort()
