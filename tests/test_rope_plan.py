"""Issue 25: fuse now writes RotaryEmbedding ops read from ONNX's function body, 3-D ones with num_heads among them.
The build plan lowers a 4-D op as IRotaryEmbeddingLayer ([B, N, S, H]); a 3-D op ([B, S, N*H]) it leaves to the
ONNX parser, since the layer would read a 3-D input as packed [T, N, H]."""

from __future__ import annotations

import onnx
import onnxruntime

from trtattn.trt.plan import make_plan


def _rope_model(shape, **attrs) -> onnx.ModelProto:
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    node = onnx.helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope", **attrs)
    graph = onnx.helper.make_graph([node], "rope", [
        onnx.helper.make_tensor_value_info("x", f, shape), onnx.helper.make_tensor_value_info("cos", f, [50, 4]),
        onnx.helper.make_tensor_value_info("sin", f, [50, 4]), onnx.helper.make_tensor_value_info("pos", i64, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", f, shape)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 23)])
    onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # it loads
    return model


def test_four_d_rotary_embedding_is_a_rope_layer():
    # num_heads on a 4-D input (torch's exporter writes it) changes nothing
    plan = make_plan(_rope_model([2, 4, 3, 8], interleaved=1, num_heads=4), name="m", form="padded", precision="fp32",
                     sites={})
    (rope,) = plan.ropes
    assert (rope.input, rope.position_ids, rope.interleaved) == ("x", "pos", True)


def test_three_d_rotary_embedding_with_num_heads_is_left_to_the_parser():
    plan = make_plan(_rope_model([2, 3, 32], num_heads=4), name="m", form="padded", precision="fp32", sites={})
    assert plan.ropes == []
