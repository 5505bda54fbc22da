"""Issue 25: fuse now writes RotaryEmbedding ops read from ONNX's function body, 3-D ones with num_heads among them.
The build plan lowers a 4-D op as IRotaryEmbeddingLayer ([B, N, S, H]); a 3-D op ([B, S, N*H], num_heads) is split
into heads around the layer, since the layer would read a 3-D input as packed [T, N, H] (TensorRT's documented
inputs: [B, N, S, H] or packed [T, N, H]). An input of unknown rank is left to the ONNX parser, named in the plan.
The lowered layers run on trtsim's numpy executor against ONNX Runtime on onnx's RotaryEmbedding cases."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest

from trtattn.testing.conformance import conformance_cases
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


def test_three_d_rotary_embedding_with_num_heads_is_a_rope_layer_over_heads():
    plan = make_plan(_rope_model([2, 3, 32], num_heads=4), name="m", form="padded", precision="fp32", sites={})
    (rope,) = plan.ropes
    assert (rope.input, rope.num_heads, rope.position_ids) == ("x", 4, "pos") and not plan.notes


def test_rotary_embedding_of_unknown_rank_is_left_to_the_parser_named():
    model = _rope_model([2, 3, 32], num_heads=4)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    plan = make_plan(model, name="m", form="padded", precision="fp32", sites={})
    assert plan.ropes == [] and plan.notes == ["RotaryEmbedding rope is left to TensorRT's ONNX parser: its "
                                               "input's rank is unknown"]


def _as_three_d(case):
    """A 4-D case ([B, N, S, H]) as the op's 3-D input ([B, S, N*H], num_heads = N): the same rotation."""
    x = case.inputs["input"]
    b, n, s, h = x.shape
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("num_heads", n))
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.CopyFrom(onnx.helper.make_tensor_type_proto(1, [b, s, n * h]).tensor_type.shape)
    feeds = dict(case.inputs, input=x.transpose(0, 2, 1, 3).reshape(b, s, n * h))
    return model, feeds


def _rope_cases():
    cases = []
    for case in conformance_cases("RotaryEmbedding", expanded=False):
        cases.append(pytest.param(case.model, case.inputs, id=case.name))
        if case.inputs["input"].ndim == 4:
            cases.append(pytest.param(*_as_three_d(case), id=f"{case.name}-as-3d"))
    return cases


@pytest.mark.conformance
@pytest.mark.reference
@pytest.mark.parametrize("model,feeds", _rope_cases())
def test_planned_rotary_embeddings_match_onnx_runtime(checked_trt, model, feeds):
    """Each case's op planned and lowered (3-D ones through the head split) on the numpy executor, against the
    op on ONNX Runtime."""
    from trtsim.execute import run
    from trtsim_cases import TOL, add_inputs, new_network

    from trtattn.trt.lower import lower_rope

    (rope,) = make_plan(model, name="m", form="padded", precision="fp32", sites={}).ropes
    _, net = new_network(checked_trt)
    tensors = add_inputs(checked_trt, net, feeds, dynamic=True)
    out = lower_rope(checked_trt, net, rope, tensors.__getitem__)
    out.name = "y"
    net.mark_output(out)
    got = run(net, feeds)["y"]
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    assert got.shape == want.shape == feeds["input"].shape
    np.testing.assert_allclose(got, want, **TOL)
