"""TensorRT's documented attention pattern, checked on a graph by hand (independently of normalize's own
fusability verdict): what tests and the trtexec-route benchmark hold normalize's output to."""

from __future__ import annotations

import onnx

QDQ = {"QuantizeLinear", "DequantizeLinear"}
MASKING = {"Where", "Add", "Sub"}


def documented_pattern_violations(model: onnx.ModelProto | onnx.GraphProto) -> list:
    """Each attention Softmax (one fed by a MatMul of two activations and feeding a MatMul), in the graph and in
    its If/Loop/Scan bodies, against TensorRT's documented pattern: MatMul -> at most one Where/Add/Sub (Casts
    aside) -> Softmax -> only Q/DQ -> MatMul, no Mul/Div on the logits. Returns (softmax, what is wrong) pairs."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    bad = [v for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
           for v in documented_pattern_violations(a.g)]
    producers = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    for sm in (n for n in graph.node if n.op_type == "Softmax"):
        t, down = sm.output[0], []
        while len(readers.get(t, [])) == 1 and readers[t][0].op_type != "MatMul":
            down.append(readers[t][0].op_type)
            t = readers[t][0].output[0]
        if [n.op_type for n in readers.get(t, [])] != ["MatMul"]:
            if "IsNaN" in {n.op_type for n in readers.get(sm.output[0], [])}:
                bad.append((sm.name, "a NaN guard between the Softmax and the second MatMul"))
            continue  # not an attention (a classifier head)
        up, t = [], sm.input[0]
        while t in producers and producers[t].op_type != "MatMul":
            n = producers[t]
            up.append(n.op_type)
            t = n.input[1] if n.op_type == "Where" else n.input[0]
        masking = [op for op in up if op != "Cast"]
        if len(masking) > 1 or set(masking) - MASKING:
            bad.append((sm.name, f"between the first MatMul and the Softmax: {up}"))
        if set(down) - QDQ:
            bad.append((sm.name, f"between the Softmax and the second MatMul: {down}"))
    return bad
