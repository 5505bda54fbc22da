"""Small self-attention models with a bool mask input read in different axis orders: the mask tests of
routes/prepare (mask_axes) and of graph (mask_reading) both build them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

D, N, H = 16, 2, 8


def self_attention(mask_shape: list, to_attention: list[onnx.NodeProto]) -> onnx.ModelProto:
    """x [b, s, D] projected to Q/K/V [b, N, s, H] and an ONNX Attention (opset 23) over them, whose attn_mask
    is what `to_attention` makes of the bool input `mask` (ending in the tensor "attn_mask")."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), f"w{x}") for x in "qkv"]
    inits.append(numpy_helper.from_array(np.array([0, 0, N, H], np.int64), "heads"))
    nodes = []
    for x in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{x}"], [f"{x}2"]),
                  helper.make_node("Reshape", [f"{x}2", "heads"], [f"{x}3"]),
                  helper.make_node("Transpose", [f"{x}3"], [x], perm=[0, 2, 1, 3])]
    nodes += to_attention
    nodes.append(helper.make_node("Attention", ["q", "k", "v", "attn_mask"], ["y"], name="attn"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", D]),
                                           helper.make_tensor_value_info("mask", TensorProto.BOOL, mask_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", N, "s", H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model


def key_flags(source: str) -> list[onnx.NodeProto]:
    """[b, s] -> [b, 1, s, s]: every query row reads the row's key flags (ONNX Runtime's Attention takes a
    mask with the query length on its axis -2)."""
    def const(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))
    return [const("axes12", [1, 2]), const("ones2", [1, 1]), const("one", [1]), const("from1", [1]),
            const("to2", [2]), helper.make_node("Unsqueeze", [source, "axes12"], ["flags"]),  # [b, 1, 1, s]
            helper.make_node("Shape", ["x"], ["x_shape"]),
            helper.make_node("Slice", ["x_shape", "from1", "to2"], ["queries"]),
            helper.make_node("Concat", ["ones2", "queries", "one"], ["rows"], axis=0),  # [1, 1, s, 1]
            helper.make_node("Expand", ["flags", "rows"], ["attn_mask"])]


# name -> (the mask input's shape, the nodes to the attn_mask, its key axis)
MODELS = {
    "query_key": (["s", "s"], [helper.make_node("Identity", ["mask"], ["attn_mask"])], 1),
    "transposed_key_batch": (["s", "b"], [helper.make_node("Transpose", ["mask"], ["mask_bs"], perm=[1, 0]),
                                          *key_flags("mask_bs")], 0),
    "batch_1_query_key": (["b", 1, "s", "s"], [helper.make_node("Identity", ["mask"], ["attn_mask"])], 3),
}
