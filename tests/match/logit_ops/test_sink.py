"""Issue 18, class 9: attention sinks (gpt-oss): a learned per-head logit column concatenated before the
softmax and sliced off after is attention over one extra key with zero K and V; fused and verified."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.edits import with_sinks
from trtattn.testing.graphs import attention_model


@pytest.mark.parametrize("shift,first", [(False, False), (True, False), (False, True)])
def test_sink_is_an_extra_key_fused_and_verified(shift, first):
    model = with_sinks(attention_model(opset=18, heads=4, kv_heads=2, mask_style="additive_input"), 4,
                       shift=shift, first=first)
    (site,) = match(model).sites
    assert site.mask_steps[-1].op == "sink"
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


@pytest.mark.parametrize("wrong", [dict(slice_wrong=True), dict(first=True, drop_first=False),
                                   dict(first=False, drop_first=True)])
def test_slice_that_is_not_the_sink_column_is_listed(wrong):
    model = with_sinks(attention_model(opset=18, heads=4), 4, **wrong)
    result = match(model)
    assert not result.sites and "not exactly the sink's column" in result.skipped[0].reason


def test_zoo_llama_with_sinks_fuses_verified(zoo_export):
    """gpt-oss's form (sinks, then the max shift) written into a real export with GQA, rope and a causal mask."""
    model = with_sinks(onnx.load(str(zoo_export("llama", "torchscript"))), 4, shift=True)
    reports = fuse_model(model).reports
    assert len(reports) == 2
    for r in reports:
        assert r.status == "fused" and r.max_abs_err < 1e-4 and (r.site.q_heads, r.site.kv_heads) == (4, 2), r.reason


# Survivors of mutating match/logit_ops/sink.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
def _concat_on_logits(axis: int):
    """logits = q @ k^T [1, 2, 3, 3] concatenated with a constant along `axis` (a column: axis -1)."""
    import onnx_graphsurgeon as gs

    from trtattn.graph.view import GraphView

    q, k = gs.Variable("q", np.float32, [1, 2, 3, 4]), gs.Variable("k", np.float32, [1, 2, 4, 3])
    logits, joined = gs.Variable("logits", np.float32, [1, 2, 3, 3]), gs.Variable("joined", np.float32)
    piece = [1, 2, 3, 3]
    piece[axis] = 1
    extra = gs.Constant("extra", np.zeros(piece, np.float32))
    concat = gs.Node("Concat", "concat", {"axis": axis}, [logits, extra], [joined])
    graph = gs.Graph(nodes=[gs.Node("MatMul", "qk", inputs=[q, k], outputs=[logits]), concat], inputs=[q, k],
                     outputs=[joined], opset=17)
    return GraphView(graph, fold=False), concat


def test_a_concat_on_the_logits_along_the_keys_is_a_sink_and_along_another_axis_is_not():
    from trtattn.match.logit_ops.sink import Sink

    view, concat = _concat_on_logits(-1)
    step, chain = Sink().read(view, concat)
    assert (step.op, step.operand, step.value, chain.name) == ("sink", "extra", 1.0, "logits")
    for axis in (1, 2, -2):
        view, concat = _concat_on_logits(axis)
        assert Sink().read(view, concat) is None, axis


def test_a_sink_after_a_boolean_mask_fuses_and_a_logit_op_after_the_sink_is_listed():
    from trtattn.rewrite.fuse import fuse_model

    model = with_sinks(attention_model(opset=18, heads=4, mask_style="bool_where"), 4)
    (site,) = match(model).sites
    assert [s.op for s in site.mask_steps][-2:] == ["where", "sink"]
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")  # [logits, sink] * 0.5, then softmax
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(0.5, np.float32), "after_sink"))
    model.graph.node.insert(list(model.graph.node).index(softmax),
                            helper.make_node("Mul", [softmax.input[0], "after_sink"], ["halved"], name="after_sink/Mul"))
    softmax.input[0] = "halved"
    result = match(model)  # the walk from the softmax stops at the Mul: a Concat is not a logit op it follows
    assert not result.sites and "Mul after_sink/Mul is not on a path from a product" in result.skipped[0].reason
