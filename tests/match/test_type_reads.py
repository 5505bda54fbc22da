"""Issue 25: reads of a tensor's type or shape only (CastLike's target, Shape, Size) are no use of its values,
anywhere in the matcher; and the ONNX Attention body's zeroing of fully masked rows after its softmax,
Where(ReduceMax(bias) == -inf, 0, P), is the fused op's own behaviour when the bias is the op's mask.
Hand-built graphs in the form of the op's function body (onnx.inliner, function expansion)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from trtattn.graph.dependence import depends_on_input_values, meta_readers, reads_values, value_readers
from trtattn.graph.user_inputs import GivenInputs
from trtattn.graph.view import GraphView, import_graph
from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.verify import compare_models

B, N, S, T, D = 1, 2, 3, 4, 8


def test_castlike_reads_the_values_of_its_input_not_of_its_target():
    x = gs.Variable("x", np.float32, [2])
    like = gs.Variable("like", np.float16, [2])
    out = gs.Variable("out", np.float16)
    node = gs.Node("CastLike", inputs=[x, like], outputs=[out])
    shape = gs.Node("Shape", inputs=[like], outputs=[gs.Variable("s", np.int64)])
    assert reads_values(node, 0) and not reads_values(node, 1)
    assert value_readers(x) == [node] and value_readers(like) == []
    assert meta_readers(like) == [node, shape]
    assert depends_on_input_values(out, {"x"}) and not depends_on_input_values(out, {"like"})


def _attention_body(*, guard_on: str = "bias", castlike: bool = True) -> onnx.ModelProto:
    """q.k^T * scale + bias -> Softmax -> the body's guard -> . v, the guard reading `guard_on`'s row max
    ("bias": the bias added to the logits; "other": another input) and its zero as CastLike(0, P)."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
        helper.make_node("ReduceMax", [guard_on, "last"], ["row_max"], keepdims=1),
        helper.make_node("CastLike", ["neg_inf", guard_on], ["neg_inf_t"]),
        helper.make_node("Equal", ["row_max", "neg_inf_t"], ["all_masked"]),
        helper.make_node("CastLike", ["zero", "p"], ["zero_t"]) if castlike else
        helper.make_node("Identity", ["zero"], ["zero_t"]),
        helper.make_node("Where", ["all_masked", "zero_t", "p"], ["p_safe"]),
        helper.make_node("MatMul", ["p_safe", "v"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, f, s) for n, s in
              (("q", [B, N, S, D]), ("k", [B, N, T, D]), ("v", [B, N, T, D]), ("bias", [B, 1, S, T]))]
    if guard_on == "other":
        inputs.append(helper.make_tensor_value_info("other", f, [B, 1, S, T]))
    inits = [helper.make_tensor("scale", f, [], [D ** -0.5]), helper.make_tensor("last", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("neg_inf", f, [], [-np.inf]), helper.make_tensor("zero", f, [], [0.0])]
    graph = helper.make_graph(nodes, "body", inputs, [helper.make_tensor_value_info("y", f, [B, N, S, D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def _masks(site) -> list[str]:
    return [s.op for s in site.mask_steps if s.op != "scale"]


def _feeds(model, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    for name in ("bias", "other"):
        if name in feeds:
            feeds[name] = np.where(rng.random(feeds[name].shape) < 0.3, -np.inf, 0.0).astype(np.float32)
            feeds[name][..., 1, :] = -np.inf  # the second query row masked at every key
    return feeds


def test_castlike_of_the_probabilities_is_not_a_second_consumer():
    """The body's zero is CastLike(0, P): it reads P's type only, so the probabilities still have one consumer."""
    (site,) = match(_attention_body()).sites
    assert site.softmax is not None


def test_fully_masked_rows_zeroed_after_the_softmax_are_the_fused_ops_own():
    model = _attention_body()
    (site,) = match(model).sites
    assert _masks(site) == ["add"]  # the guard adds no step: the op zeroes such rows itself
    result = fuse_model(model, inputs=GivenInputs("rows", [_feeds(model)]))
    (r,) = result.reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == 1 and not ops["Softmax"] and not ops["ReduceMax"] and not ops["Equal"]


def test_a_guard_on_another_tensor_is_one_more_mask_step():
    """Rows zeroed where another tensor is -inf everywhere are not what the op does with its mask: the guard
    stays one more mask step (probs_mask's Where(cond, 0, P)); verified on rows the bias does not mask."""
    model = _attention_body(guard_on="other")
    (site,) = match(model).sites
    assert _masks(site) == ["add", "probs_where_not"]
    feeds = _feeds(model, seed=1)
    feeds["bias"][...] = 0.0  # only `other` masks rows: the fused op must zero them through the extra step
    (r,) = fuse_model(model, inputs=GivenInputs("rows", [feeds])).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


def test_shape_with_start_and_end_folds_to_its_part():
    """onnx-graphsurgeon's shape folding ignores Shape's start/end: the view folds those Shapes itself."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 7])
    nodes = [helper.make_node("Shape", ["x"], ["seq"], start=-2, end=-1),
             helper.make_node("Cast", ["seq"], ["seq_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "seq_f"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", 1, None)]),
                              opset_imports=[helper.make_opsetid("", 23)])
    graph = import_graph(model)
    view = GraphView(graph, model)
    assert view.ints(graph.tensors()["seq"]) == [5]
    assert view.scalar(graph.tensors()["seq_f"]) == 5.0


def test_equal_infinities_in_an_output_agree():
    """A logits output masked with -inf in both models is no error (Polygraphy's inf - inf is NaN)."""
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", f, [4])],
                              [helper.make_tensor_value_info("y", f, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    feeds = [{"x": np.array([0.0, 1.0, 2.0, 0.0], np.float32)}]  # log 0 = -inf
    outcome = compare_models(model, model, feeds=feeds)
    assert outcome.passed and outcome.output_errors["y"] == 0.0 and not outcome.nan_mismatch


def test_a_bias_of_shapes_alone_that_is_all_zero_is_no_mask():
    """The body without attn_mask adds ConstantOfShape([Sq, Skv]) zeros: the probes see no mask, so the site has
    none and the fused op takes Q, K, V only."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Shape", ["q"], ["sq"], start=-2, end=-1),
        helper.make_node("Shape", ["k"], ["skv"], start=-2, end=-1),
        helper.make_node("Concat", ["sq", "skv"], ["bias_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["bias_shape"], ["bias"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Add", ["qk", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, f, s) for n, s in
              (("q", ["b", N, "s", D]), ("k", ["b", N, "t", D]), ("v", ["b", N, "t", D]))]
    model = helper.make_model(helper.make_graph(nodes, "body", inputs, [helper.make_tensor_value_info("y", f, None)]),
                              opset_imports=[helper.make_opsetid("", 23)])
    result = fuse_model(model)
    (r,) = result.reports
    assert r.status == "fused" and r.site.mask.value == "none" and not _masks(r.site), r.reason
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert len([i for i in node.input if i]) == 3
