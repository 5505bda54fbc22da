"""Issue 18, class 12 (flax): probabilities masked and renormalised, P * m / ReduceSum(P * m) over the softmax
axis, equal Softmax(x + log m): a boolean mask where m == 0, fused and verified although the logits were
never masked. A sum over another axis is not a renormalisation and is listed, never silent."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


def renormalised(form: str = "mul", axis: int = -1, keepdims: bool = True, guard: bool = False,
                 back: int | None = None) -> onnx.ModelProto:
    """attention_model without a mask, whose probabilities are masked by a new boolean input `keep` [batch, seq]
    (over the keys) as `form` ("mul": P * float(keep); "where": Where(keep, P, 0)) and divided by their sum over
    `axis` (keepdims, or keepdims=0 and an Unsqueeze putting the axis back, or at `back`); `guard`: flax's
    zero-sum guard."""
    g = gs.import_onnx(attention_model(opset=18, mask_style=None))
    keep = gs.Variable("keep", np.bool_, ["batch", "seq"])
    g.inputs.append(keep)
    made: list[gs.Node] = []

    def op(kind, inputs, dtype=np.float32, **attrs):
        out = gs.Variable(f"renorm/{kind}_{len(made)}", dtype)
        made.append(gs.Node(kind, f"renorm/{kind}_{len(made)}", attrs, inputs, [out]))
        return out

    const = lambda name, v, dt=np.float32: gs.Constant(f"renorm/{name}", np.asarray(v, dt))  # noqa: E731
    allowed = op("Unsqueeze", [keep, const("keys", [1, 2], np.int64)], np.bool_)  # [B, 1, 1, S]
    (sm,) = [n for n in g.nodes if n.op == "Softmax"]
    probs = sm.outputs[0]
    consumer = probs.outputs[0]
    if form == "mul":
        masked = op("Mul", [probs, op("Cast", [allowed], to=onnx.TensorProto.FLOAT)])
    else:
        masked = op("Where", [allowed, probs, const("zero", 0.0)])
    total = op("ReduceSum", [masked, const("axes", [axis], np.int64)], keepdims=int(keepdims))
    if not keepdims:
        total = op("Unsqueeze", [total, const("back", [axis if back is None else back], np.int64)])
    if guard:  # flax: Where(sum > 0, sum, 1) below, and the rows whose sum is 0 set to 0
        nonzero = op("Greater", [total, const("zero_s", 0.0)], np.bool_)
        out = op("Where", [nonzero, op("Div", [masked, op("Where", [nonzero, total, const("one", 1.0)])]),
                           const("zero_w", 0.0)])
    else:
        out = op("Div", [masked, total])
    consumer.inputs[consumer.inputs.index(probs)] = out
    g.nodes.extend(made)
    g.toposort()
    model = gs.export_onnx(g)
    model.ir_version = 10
    return model


@pytest.mark.parametrize("form,keepdims,guard", [("mul", True, False), ("where", True, False),
                                                 ("mul", False, False), ("mul", True, True)],
                         ids=["mul", "where", "keepdims0_unsqueeze", "flax_guard"])
def test_renormalised_masked_probabilities_fuse_as_a_boolean_mask(form, keepdims, guard):
    model = renormalised(form, keepdims=keepdims, guard=guard)
    (site,) = match(model).sites
    assert [s.op for s in site.mask_steps if s.op.startswith("probs")] == [f"probs_{form}"]
    result = fuse_model(model)
    (r,) = result.reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason
    ops = {n.op_type for n in result.model.graph.node}
    assert "Attention" in ops and not ops & {"ReduceSum", "Div", "Softmax"}  # the renormalisation went with it


def test_renormalised_with_a_fully_masked_row_gives_zero_like_the_guarded_original():
    """A row masked everywhere: 0/0 = NaN in the plain form, 0 under flax's guard and in the fused op."""
    model = renormalised("mul", guard=True)
    result = fuse_model(model)
    assert result.reports[0].status == "fused"
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 32)).astype(np.float32)  # attention_model: heads 4 x head 8
    keep = np.ones((2, 6), bool)
    keep[1] = False  # batch row 1: every key masked
    feeds = {"x": x, "keep": keep}
    names = [i.name for i in model.graph.input]
    assert sorted(names) == sorted(feeds), names
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    got = ort.InferenceSession(result.model.SerializeToString()).run(None, feeds)[0]
    assert np.isfinite(got).all() and np.allclose(want, got, atol=1e-5)


@pytest.mark.parametrize("axis", [2, -2])
def test_a_sum_over_another_axis_is_not_a_renormalisation_and_is_listed(axis):
    model = renormalised("mul", axis=axis)
    result = match(model)
    assert not result.sites
    (skipped,) = result.skipped
    assert "not over the softmax's axis" in skipped.reason and "ReduceSum" in skipped.reason


def test_a_sum_without_keepdims_unsqueezed_on_another_axis_is_listed():
    """[B, N, S] sums put back as [B, N, 1, S]: each key's column divided by a query's sum, not a softmax's."""
    result = match(renormalised("mul", keepdims=False, back=2))
    assert not result.sites
    (skipped,) = result.skipped
    assert "keepdims=0" in skipped.reason and "not put back where it was" in skipped.reason


def test_a_mask_must_broadcast_into_the_probabilities_without_enlarging_them():
    from trtattn.match.logit_ops.probs_mask import _broadcasts_into

    probs = ["batch", 4, "seq", "seq"]
    assert _broadcasts_into(["batch", 1, 1, "seq"], probs) and _broadcasts_into(["seq"], probs)
    assert _broadcasts_into(None, probs) and _broadcasts_into([2, 1, 1, 6], None)  # unknown: verification decides
    assert not _broadcasts_into([3, "batch", 1, 1, "seq"], probs)  # a mask of higher rank makes P larger
    assert not _broadcasts_into(["batch", 8, "seq", "seq"], probs)  # 8 heads against 4
    assert not _broadcasts_into([2, 1, 6, 6], [2, 1, 1, 6])  # six queries against one
    assert _broadcasts_into([2, 1, 1, 6], [2, 4, 6, 6])  # static dims that agree
    assert not _broadcasts_into([2, 1, 1, 3], [2, 4, 6, 6])  # 3 keys do not broadcast into 6


def _node_of(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op_type and n.name.startswith("renorm/"))


def test_masked_probabilities_read_by_a_third_node_are_not_a_renormalisation():
    """P * m also read by a Transpose (an op named after 'Shape', which the reader skips): the masked
    probabilities are used beyond the division, so they are not renormalised probabilities."""
    model = renormalised("mul")
    masked = _node_of(model, "Mul").output[0]
    model.graph.node.append(onnx.helper.make_node("Transpose", [masked], ["seen"], name="renorm/extra", perm=[0, 1, 3, 2]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("seen", onnx.TensorProto.FLOAT, None))
    result = match(model)
    assert not result.sites and "the probabilities feed" in result.skipped[0].reason


def test_masked_probabilities_divided_by_their_max_are_listed():
    """P * m / ReduceMax(P * m): two readers, no sum among them: not a renormalisation, listed (not a crash)."""
    model = renormalised("mul")
    _node_of(model, "ReduceSum").op_type = "ReduceMax"
    result = match(model)
    assert not result.sites and "the probabilities feed" in result.skipped[0].reason


def test_a_zero_sum_guard_must_compare_the_sum_itself():
    """flax's guard Where(s > 0, s, 1) with its comparison made on another tensor: not the guard, so the
    division is not by the sum and the site is listed."""
    model = renormalised("mul", guard=True)
    greater = _node_of(model, "Greater")
    model.graph.input.append(onnx.helper.make_tensor_value_info("other", onnx.TensorProto.FLOAT, None))
    greater.input[0] = "other"
    result = match(model)
    assert not result.sites and "the probabilities feed" in result.skipped[0].reason
