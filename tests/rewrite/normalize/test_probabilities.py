"""normalize and what sits between the Softmax and the second MatMul: torch's NaN guard (Where(IsNaN(P), 0, P),
written by the SDPA TorchScript export) moves after BMM2, so the site is in TensorRT's documented pattern
(nothing there but Q/DQ), and rows that attend to no key stay 0 as in the original; a site is called "in
TensorRT's form" only when it is."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from trtattn.rewrite.normalize import normalize_model
from trtattn.rewrite.normalize.fusability import verdict
from trtattn.rewrite.normalize.probabilities import between
from trtattn.site import AttentionSite, SiteKind
from trtattn.testing.graphs import attention_model
from trtattn.testing.patterns import documented_pattern_violations


def with_nan_guard(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with torch's SDPA guard after its attention Softmax: Where(IsNaN(P), 0, P) -> MatMul."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    sm = next(n for n in nodes if n.name == "attn/Softmax")
    bmm2 = next(n for n in nodes if n.op_type == "MatMul" and n.input[0] == sm.output[0])
    zero = helper.make_tensor("guard_zero", onnx.TensorProto.FLOAT, [], [0.0])
    out.graph.initializer.append(zero)
    guard = [helper.make_node("IsNaN", [sm.output[0]], ["p_isnan"], name="attn/IsNaN"),
             helper.make_node("Where", ["p_isnan", "guard_zero", sm.output[0]], ["p_guarded"], name="attn/Where")]
    bmm2.input[0] = "p_guarded"
    at = nodes.index(sm) + 1
    del out.graph.node[:]
    out.graph.node.extend(nodes[:at] + guard + nodes[at:])
    return out


def run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.fixture(scope="module")
def guarded():
    model = with_nan_guard(attention_model(mask_style="bool_where", scale_style="mul_q", head=16))
    return model, normalize_model(model)


def test_nan_guard_moves_after_the_second_matmul(guarded):
    model, result = guarded
    assert between(model, "attn/Softmax") == ["IsNaN", "Where"]
    guard = "a NaN guard between the Softmax and the second MatMul"
    assert documented_pattern_violations(model) == [("attn/Softmax", guard)]
    assert result.ok and result.verification.passed and result.verification.max_abs_err <= 1e-6
    (row,) = result.sites
    assert row.action == "rewritten" and row.probabilities == "NaN guard moved after BMM2"
    assert not row.before.implicit and "IsNaN, Where between the Softmax" in "; ".join(row.before.implicit_why)
    assert row.after.implicit, row.after
    assert between(result.model, "attn/Softmax") == []
    assert documented_pattern_violations(result.model) == []
    guard = next(n for n in result.model.graph.node if n.op_type == "Where" and n.name.endswith("nan_guard"))
    softmax = next(n for n in result.model.graph.node if n.name == "attn/Softmax")
    bmm2 = next(n for n in result.model.graph.node if n.op_type == "MatMul" and n.input[0] == softmax.output[0])
    assert guard.input[2] == bmm2.output[0]  # Where(IsNaN(Y), 0, Y) on the second MatMul's output


def test_rows_that_attend_to_no_key_stay_zero(guarded):
    model, result = guarded
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 64)).astype(np.float32)
    mask = np.ones((2, 6), bool)
    mask[1] = False  # row 1 attends to nothing: the softmax is NaN there, the guard makes it 0
    feeds = {"x": x, "attention_mask": mask}
    before, after = run(model, feeds), run(result.model, feeds)
    assert not np.isnan(before).any() and not np.isnan(after).any()
    assert np.all(before[1] == 0) and np.all(after[1] == 0)
    np.testing.assert_allclose(after, before, atol=1e-6)
    unguarded = run(attention_model(mask_style="bool_where", scale_style="mul_q", head=16), feeds)
    assert np.isnan(unguarded[1]).all()  # without any guard the row is NaN: the guard is what makes it 0


def test_only_qdq_may_sit_after_the_softmax():
    site = AttentionSite("s", SiteKind.SELF, "q", "k", "v", "o", q_heads=4, kv_heads=4, head_size=64)
    assert verdict(site, probs_ops=["QuantizeLinear", "DequantizeLinear"]).implicit
    v = verdict(site, probs_ops=["Cast"])
    assert not v.implicit and "Cast between the Softmax and the second MatMul" in v.implicit_why[0]
    assert v.iattention  # IAttention takes the site as it is


@pytest.mark.parametrize("name", ["bert-sdpa", "llama-sdpa"])
def test_sdpa_torchscript_exports_end_in_the_documented_pattern(zoo_export, name):
    model = onnx.load(str(zoo_export(name, "torchscript")))
    assert documented_pattern_violations(model)  # the export has the guard
    result = normalize_model(model)
    assert result.ok and result.verification.passed
    assert documented_pattern_violations(result.model) == []
    assert all(r.probabilities == "NaN guard moved after BMM2" and r.after.implicit for r in result.sites)


def test_heads_merged_into_the_batch_get_the_core_in_the_pattern():
    """[B*N, S, H] products (older exports, bmm): the core is re-emitted on [B, N, S, H] so that MatMul ->
    Softmax -> MatMul hold the documented pattern, with the scale on Q."""
    model = attention_model(rank=3, scale_style="div_after", head=16)
    assert documented_pattern_violations(model)  # Div between the first MatMul and the Softmax
    result = normalize_model(model)
    assert result.ok and result.verification.passed and result.verification.max_abs_err <= 1e-5
    (row,) = result.sites
    assert row.action == "rewritten" and "core re-emitted" in row.mask_form and row.scale_to == "q"
    assert not row.before.implicit and "reshaped" in "; ".join(row.before.implicit_why)
    assert row.after.implicit, row.after
    assert documented_pattern_violations(result.model) == []
    softmax = next(n for n in result.model.graph.node if n.op_type == "Softmax")
    assert softmax.name == "attn/Softmax"  # the site keeps its name
