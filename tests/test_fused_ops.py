"""ONNX's own Attention op read as a site (match/fused_ops.py)."""

from onnx import TensorProto, helper

from trtattn.match import match


def _attention(inputs: list[str]):
    shape = [1, 2, 4, 8]
    names = [i for i in inputs if i]
    graph = helper.make_graph(
        [helper.make_node("Attention", inputs, ["y"], name="attn")], "g",
        [helper.make_tensor_value_info(i, TensorProto.FLOAT, shape) for i in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_past_key_without_past_value_is_listed_with_the_reason():
    result = match(_attention(["q", "k", "v", "", "past_k"]))
    assert not result.sites
    assert [s.reason for s in result.skipped] == ["Attention attn has only one of past_key and past_value"]


def test_plain_attention_op_is_a_site():
    result = match(_attention(["q", "k", "v"]))
    assert [s.output for s in result.sites] == ["y"] and not result.skipped
