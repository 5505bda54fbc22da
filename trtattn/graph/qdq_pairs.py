"""The Q/DQ pairs ONNX Runtime inserts into int8 models itself, written out, so that it loads them at
opset 21 and later.

ONNX Runtime's QDQPropagationTransformer (basic level) carries a DequantizeLinear with a constant scalar
scale and zero point forward across the ops that only move values (Reshape, Transpose, Squeeze, Unsqueeze,
Slice, MaxPool) by inserting a QuantizeLinear -> DequantizeLinear pair after each. From opset 21 the
QuantizeLinear it inserts carries output_dtype; its int8 -> uint8 transformer (extended level, x86 CPU)
then gives that pair a uint8 zero point but leaves output_dtype INT8, and the session is refused
("output_dtype INT8 does not match y_zero_point type UINT8"), though the model is valid ONNX (an int8 model
at opset 20 raised to 23 for the Attention op, measured with onnxruntime 1.32). Pairs already in the model
are not inserted again, and the int8 -> uint8 transformer converts a pair it did not make as a whole.
The pairs are exact: an op that only moves values keeps them on the quantization grid, within its range.
"""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import helper

# the ops ONNX Runtime carries a DequantizeLinear across (qdq_propagation.cc, CanNodePropagate)
VALUE_MOVING_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "MaxPool")
OUTPUT_DTYPE_OPSET = 21  # QuantizeLinear's output_dtype attribute, which ONNX Runtime then sets


def write_propagated_pairs(model: onnx.ModelProto) -> int:
    """Insert, in `model`'s main graph (in place), a QuantizeLinear -> DequantizeLinear pair after each op
    ONNX Runtime would carry an int8 DequantizeLinear across; returns how many. Only at opset 21 and later."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < OUTPUT_DTYPE_OPSET:
        return 0
    graph = model.graph
    scalars = {t.name: t for t in graph.initializer if not t.dims or list(t.dims) == [1]}
    nodes = list(graph.node)
    readers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for name in dict.fromkeys(node.input):
            readers[name].append(i)
    outputs = {o.name for o in graph.output}
    taken: set[str] = set()
    inserted: dict[int, list[onnx.NodeProto]] = defaultdict(list)  # after which node (its index)
    for dq in [n for n in nodes if _is(n, "DequantizeLinear")]:
        if len(dq.input) < 3 or dq.input[1] not in scalars or scalars.get(dq.input[2]) is None \
                or scalars[dq.input[2]].data_type != onnx.TensorProto.INT8:
            continue
        if dq.output[0] in outputs or len(readers[dq.output[0]]) != 1:
            continue  # ONNX Runtime carries only a DequantizeLinear read by one node
        stack = [readers[dq.output[0]][0]]
        while stack:
            at = stack.pop()
            node = nodes[at]
            if node.op_type not in VALUE_MOVING_OPS or node.domain not in ("", "ai.onnx") or node.output[0] in taken:
                continue
            out = node.output[0]
            after = [r for r in readers[out] if not _is(nodes[r], "QuantizeLinear")]
            if not after or out in outputs:
                continue
            taken.add(out)
            q_out, dq_out = f"{out}/trtattn_q", f"{out}/trtattn_dq"
            inserted[at] += [
                helper.make_node("QuantizeLinear", [out, dq.input[1], dq.input[2]], [q_out], name=f"{out}/trtattn_q"),
                helper.make_node("DequantizeLinear", [q_out, dq.input[1], dq.input[2]], [dq_out], name=f"{out}/trtattn_dq")]
            for r in after:
                for i, name in enumerate(nodes[r].input):
                    if name == out:
                        nodes[r].input[i] = dq_out
            stack.extend(after)
    if not inserted:
        return 0
    ordered = []
    for i, node in enumerate(nodes):
        ordered.append(node)
        ordered.extend(inserted.get(i, []))
    copies = []
    for node in ordered:
        c = onnx.NodeProto()
        c.CopyFrom(node)
        copies.append(c)
    del graph.node[:]
    graph.node.extend(copies)
    return sum(len(v) for v in inserted.values()) // 2


def _is(node: onnx.NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")
