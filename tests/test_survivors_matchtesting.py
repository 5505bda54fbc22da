"""Mutation survivors in match/ and testing/ (benchmarks/mutate.py, seed 20261128): each test fails when its
line (named in the docstring) is mutated as the sample did, and passes as the code is."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import TensorProto, helper

from trtattn.graph.view import GraphView
from trtattn.match.rotation import _cone_model
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.conformance import ConformanceCase, inside_attention
from trtattn.testing.contrib_graphs import group_query_model
from trtattn.testing.op_cases import CaseOutcome


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_group_query_attention_softcap_is_on_the_site():
    """match/fused_ops.py:142: the site of a GroupQueryAttention with softcap says its cap (None without one)."""
    model = group_query_model()
    assert fuse_model(model).reports[0].site.softcap is None
    model.graph.node[0].attribute.append(helper.make_attribute("softcap", 2.0))
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert result.reports[0].site.softcap == 2.0


def _table_graph():
    """y = a_x * t_cos with t_cos a stored table: the probe feeds both (the input sorts before the table)."""
    x = gs.Variable("a_x", np.float32, [4])
    table = gs.Constant("t_cos", np.full(4, 5.0, np.float32))
    y = gs.Variable("y", np.float32, [4])
    node = gs.Node("Mul", inputs=[x, table], outputs=[y])
    graph = gs.Graph(nodes=[node], inputs=[x], outputs=[y], opset=17)
    return GraphView(graph), node, x, table, y


def test_cone_feeds_a_stored_table_as_an_input_and_keeps_the_other_operands():
    """match/rotation.py:193 and :195: a stored table probed becomes a graph input in place of the stored value,
    in the consumer's table operand only (the other operand stays the probed x)."""
    view, node, x, table, y = _table_graph()
    feeds = {"a_x": np.arange(4, dtype=np.float32), "t_cos": np.array([1, -2, 3, -4], np.float32)}
    model = _cone_model([node], [x, table], y, feeds, view)
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["a_x", "t_cos"]
    assert [t.name for t in model.graph.initializer] == []  # the table is probed, not read from the model
    assert list(model.graph.node[0].input) == ["a_x", "t_cos"]
    np.testing.assert_allclose(_run(model, feeds)[0], feeds["a_x"] * feeds["t_cos"])


def test_inside_attention_is_rotary_q_and_k_scaled_by_0_3():
    """testing/conformance.py:169: the model is Softmax(rot(Q) . rot(K)^T * 0.3) . V, as its docstring says."""
    f = TensorProto.FLOAT
    rope = helper.make_model(helper.make_graph(
        [helper.make_node("RotaryEmbedding", ["input", "cos_cache", "sin_cache", "position_ids"], ["output"])],
        "rope", [helper.make_tensor_value_info("input", f, [1, 2, 3, 4]),
                 helper.make_tensor_value_info("cos_cache", f, [5, 2]), helper.make_tensor_value_info("sin_cache", f, [5, 2]),
                 helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("output", f, [1, 2, 3, 4])]), opset_imports=[helper.make_opsetid("", 23)])
    rng = np.random.default_rng(1)
    tables = {n: rng.uniform(-1, 1, (5, 2)).astype(np.float32) for n in ("cos_cache", "sin_cache")}
    case = ConformanceCase("rope", rope, {"input": rng.standard_normal((1, 2, 3, 4)).astype(np.float32), **tables,
                                          "position_ids": np.array([[4, 0, 2]])}, {}, 1e-3, 1e-7)
    model, feeds = inside_attention(case)
    shared = {k: v for k, v in feeds.items() if k not in "qkv"}
    q, k = (_run(case.model, {**shared, "input": feeds[s]})[0] for s in "qk")
    logits = q @ np.swapaxes(k, -1, -2) * 0.3
    p = np.exp(logits - logits.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ feeds["v"]
    np.testing.assert_allclose(_run(model, feeds)[0], want, rtol=1e-4, atol=1e-5)


def test_case_outcome_matches_reference_is_false_over_the_bound():
    """testing/op_cases.py:45: matches_reference is a property, false when an error exceeds its bound."""
    assert not CaseOutcome("c", "f", reference_error={"y": 0.5}, reference_bound={"y": 0.1}).matches_reference
    assert not CaseOutcome("c", "f").matches_reference  # nothing compared: no match
    assert CaseOutcome("c", "f", reference_error={"y": 0.01}, reference_bound={"y": 0.1}).matches_reference is True
