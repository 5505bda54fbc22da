"""Fast tests for routes/parallel lines the mutation run left alive (benchmarks/mutate.py survivors)."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtattn.routes.parallel import split_model
from trtattn.routes.parallel.collectives import check_ranks
from trtattn.routes.parallel.cost import llama_costs, table_rows


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(*specs):
    rng = np.random.default_rng(0)
    return [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in specs]


def test_an_empty_output_matches_with_no_error():
    """An output with no elements on every rank and in the original is equal: its error is 0, within any bound."""
    model = _model([helper.make_node("Identity", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    check = check_ranks(model, [model, model], {}, {}, [{"x": np.zeros((0,), np.float32)}], atol=1e-4)
    assert check.errors == {"y": 0.0}
    assert check.passed


def test_cost_table_has_one_row_per_preset_and_rank_count():
    cfg = dict(hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, layers=2)
    rows = table_rows({"tiny": cfg, "other": dict(cfg, layers=4)}, ranks=(1, 2), max_cache=16)
    assert [(r["model"], r["ranks"]) for r in rows] == [("tiny", 1), ("tiny", 2), ("other", 1), ("other", 2)]
    assert rows[1]["all_reduces"] == llama_costs(cfg, 2, 16).all_reduces == 2 * 2
    assert rows[3]["all_reduces"] == 4 * 2


def test_default_gather_threshold_is_64_mib_of_lm_head():
    """An LM head of 64 MiB of weights (fp16) splits by vocabulary by default; one just under stays whole."""
    cfg = dict(hidden=4096, heads=32, kv_heads=8, ffn=1024, vocab=8192, layers=1)
    assert llama_costs(cfg, 2, 16).all_gather_bytes == 8192 * 2
    assert llama_costs(dict(cfg, vocab=8190), 2, 16).all_gather_bytes == 0


def test_gemm_bias_of_one_row_splits_with_its_columns():
    """A column-split Gemm's bias of shape [1, N] is sliced by its last axis like the weight's columns."""
    inits = _weights(("w1", (16, 32)), ("b1", (1, 32)), ("w2", (32, 16)))
    model = _model([helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="up"),
                    helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Gemm", ["r", "w2"], ["y"], name="down")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], inits)
    forms = split_model(model, 2)
    biases = [[list(t.dims) for t in m.graph.initializer if t.name.startswith("b1")] for m in forms.models]
    assert biases == [[[1, 16]], [[1, 16]]]
    check = forms.verify()
    assert check.passed, check.errors


def test_split_along_an_unsharded_axis_keeps_the_shard():
    """Heads sharded on axis 2, then a rotate-half Split of each head's axis 3: both halves stay sharded by
    heads, and the ranks' outputs match the original."""
    inits = _weights(("w1", (16, 16)), ("w2", (16, 16))) + [
        onnx.numpy_helper.from_array(np.array([0, 0, 4, 4], np.int64), "heads"),
        onnx.numpy_helper.from_array(np.array([0, 0, 16], np.int64), "flat"),
        onnx.numpy_helper.from_array(np.array([2, 2], np.int64), "halves")]
    model = _model([helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
                    helper.make_node("Reshape", ["h", "heads"], ["hh"], name="to_heads"),
                    helper.make_node("Split", ["hh", "halves"], ["a", "b"], axis=3, name="halve"),
                    helper.make_node("Neg", ["b"], ["nb"]),
                    helper.make_node("Concat", ["nb", "a"], ["rot"], axis=3, name="rotate"),
                    helper.make_node("Reshape", ["rot", "flat"], ["f"], name="from_heads"),
                    helper.make_node("MatMul", ["f", "w2"], ["y"], name="down")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])], inits)
    forms = split_model(model, 2)
    assert not forms.plan.replicated, forms.plan.replicated
    assert all(any(n.op_type == "AllReduce" for n in m.graph.node) for m in forms.models)
    check = forms.verify()
    assert check.passed, check.errors


def test_mqa_rank_plan_keeps_its_one_whole_kv_head():
    """One KV head over 2 ranks stays whole on every rank: each rank's IAttention has half the query heads
    and the one KV head. A plan whose KV heads shape inference left unknown (None) keeps them unknown."""
    from trtattn.routes.parallel.engine import rank_plan_from_prepared
    from trtattn.routes.prepare import prepare
    from trtattn.testing.graphs import attention_model

    prepared = prepare(attention_model(heads=4, kv_heads=1), name="attn", precision="fp32")
    forms = split_model(prepared.form_model, 2)
    (site,) = forms.plan.sites
    assert (site.q_per_rank, site.kv_per_rank) == (2, None)
    for r in range(2):
        plan, _ = rank_plan_from_prepared(prepared, forms, r)
        assert [(a.q_heads, a.kv_heads) for a in plan.attentions] == [(2, 1)]
    prepared.plan.attentions[0].kv_heads = None  # as plan.py records a 4-D Attention's K of unknown heads
    plan, _ = rank_plan_from_prepared(prepared, forms, 0)
    assert [(a.q_heads, a.kv_heads) for a in plan.attentions] == [(2, None)]
