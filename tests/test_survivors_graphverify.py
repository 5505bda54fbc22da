"""Tests for the survivors of mutating the graph, rewrite and verify modules (benchmarks/mutate.py, base 8bb4c20):
graph/dims.py, graph/qdq_pairs.py, graph/validate.py, rewrite/group_query.py, verify/compare.py."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from trtattn.graph import validate
from trtattn.graph.dims import _empty_output
from trtattn.graph.qdq_pairs import OUTPUT_DTYPE_OPSET, write_propagated_pairs
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.contrib_graphs import group_query_feeds, group_query_model
from trtattn.verify.compare import max_abs_error


def _one_node(op: str, inputs: list, outputs: list, opset: int = 17, inits=(), **attrs) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, [i.name for i in inputs], [o.name for o in outputs], **attrs)],
                              "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# ---------------------------------------------------------------- dims.py
def test_an_empty_input_dim_is_chosen_not_an_empty_output():
    """A dim the graph names plainly (an empty past: past = 0) is an input's, chosen; only an expression of
    the input dims below 1 (past - 1) says the run would give an empty output."""
    def model(out_dim: str) -> onnx.ModelProto:
        return _one_node("Identity", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "past"])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_dim])])
    assert not _empty_output(model("past"), {"past": 0})
    assert _empty_output(model("past - 1"), {"past": 1})
    assert not _empty_output(model("past - 1"), {"past": 2})


# ---------------------------------------------------------------- qdq_pairs.py
def test_no_pair_written_counts_zero_and_leaves_the_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = _one_node("Relu", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                      opset=OUTPUT_DTYPE_OPSET)
    before = model.SerializeToString()
    assert write_propagated_pairs(model) == 0
    assert model.SerializeToString() == before


# ---------------------------------------------------------------- validate.py
def test_a_model_under_protobufs_limit_is_checked_from_memory_not_its_file(tmp_path):
    """LayerNormalization at opset 16: ONNX fails it, ONNX Runtime runs it. What ONNX Runtime is asked is the model
    as read and repaired in memory; the file (here not a model at all) is opened only past protobuf's limit."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "w")]
    model = _one_node("LayerNormalization", [x, helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], opset=16, inits=inits, axis=-1)
    path = tmp_path / "in.onnx"
    path.write_bytes(b"not a model")
    note = validate.check_read(model, path)
    assert note is not None and "ONNX Runtime loads it" in note and "LayerNormalization" in note


# ---------------------------------------------------------------- group_query.py
def test_group_query_attention_without_a_past_presents_the_new_keys_and_values():
    """No past_key/past_value: the present outputs are the new K and V ([B, Nkv, S, H]), each its own."""
    model = group_query_model()
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    gqa.input[3] = gqa.input[4] = ""
    kept = [i for i in model.graph.input if i.name not in ("past_key", "past_value")]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert not any(n.op_type == "GroupQueryAttention" for n in result.model.graph.node)
    feeds = {k: v for k, v in group_query_feeds(2, 3, 0, seed=3).items() if not k.startswith("past")}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want, got = run(model), run(result.model)
    assert [w.shape for w in want] == [g.shape for g in got] == [(2, 3, 32), (2, 2, 3, 8), (2, 2, 3, 8)]
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=1e-5)


# ---------------------------------------------------------------- compare.py
def test_the_max_abs_error_is_the_largest_difference():
    assert max_abs_error([1.0, 2.0, -np.inf], [1.0, 2.5, -np.inf]) == 0.5
    assert max_abs_error([[3.0, 0.0]], [[1.0, 0.0]]) == 2.0
