"""Tests for the survivors of mutating last round's logit ops (benchmarks/mutate.py, base d3efd07):
match/logit_ops/mul_mask.py, probs_mask.py, sink.py, scale.py. Each pins an outcome the fast lane left open."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.match.logit_ops.test_mul_mask import multiplied
from tests.match.logit_ops.test_scale import per_head_scale
from trtattn.match import match
from trtattn.testing.graphs import attention_model


def _steps(result):
    return [[s.op for s in site.mask_steps] for site in result.sites]


# ---------------------------------------------------------------- mul_mask.py
def _mask_of_unknown_shape(extra_path: bool = False) -> onnx.ModelProto:
    """logits * m + (1 - m) * -1e9 where m (from the attention_mask input) has no known shape, the product and
    the sum declared [batch, heads, seq, seq]; extra_path: m + (Size(x) - Size(x)), a branch the input search
    walks first, reaching the same tensor twice before it comes to the input."""
    model = multiplied(attention_model(opset=18, mask_style="additive_input"), "mul", "attention_mask")
    next(i for i in model.graph.input if i.name == "attention_mask").type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    add = next(n for n in model.graph.node if softmax.input[0] in n.output)
    mul = next(n for n in model.graph.node if add.input[0] in n.output)
    for name in (add.output[0], mul.output[0]):
        model.graph.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4, "seq", "seq"]))
    if extra_path:
        nodes = [helper.make_node("Size", ["x"], ["x_size"], name="extra/Size"),
                 helper.make_node("Cast", ["x_size"], ["x_size_f"], name="extra/Cast", to=TensorProto.FLOAT),
                 helper.make_node("Sub", ["x_size_f", "x_size_f"], ["zero"], name="extra/Sub"),
                 helper.make_node("Add", [mul.input[1], "zero"], ["mask_plus_zero"], name="extra/Add")]
        mul.input[1] = "mask_plus_zero"
        at = list(model.graph.node).index(mul)
        for i, n in enumerate(nodes):
            model.graph.node.insert(at + i, n)
    return model


def test_a_multiplier_of_unknown_shape_from_an_input_is_read_as_a_mask():
    """No shape says what m is; that it comes from a graph input's values makes it a mask."""
    assert _steps(match(_mask_of_unknown_shape())) == [["scale", "add", "mul_mask", "add"]]


def test_the_input_search_walks_on_past_a_tensor_it_has_seen():
    assert _steps(match(_mask_of_unknown_shape(extra_path=True))) == [["scale", "add", "mul_mask", "add"]]


def test_a_per_head_factor_computed_at_run_time_is_a_scale_not_a_mask():
    """logits * f, f [heads, 1, 1] from a graph input (not foldable): constant along the keys, so scale.py
    reads it (and refuses it as not a scalar), not mul_mask.py (which would say 'no offset')."""
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    model.graph.initializer.remove(init)
    model.graph.input.append(helper.make_tensor_value_info("logit_scale", TensorProto.FLOAT, [4, 1, 1]))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason


def test_a_multiplier_of_one_number_computed_at_run_time_is_a_scale_not_a_mask():
    """logits * f, f of shape [1, 1, 1, 1] from a graph input: one number, a scale."""
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    model.graph.initializer.remove(init)
    model.graph.input.append(helper.make_tensor_value_info("logit_scale", TensorProto.FLOAT, [1, 1, 1, 1]))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason


def test_a_multiplier_computed_from_shapes_alone_is_still_a_mask():
    """m = ones([batch, seq]) from Shape(x) (no input's values): its shape varies over the keys, so it is a mask."""
    model = multiplied(attention_model(opset=18, mask_style="additive_input"), "mul", "attention_mask")
    cast = next(n for n in model.graph.node if list(n.input) == ["attention_mask"])
    model.graph.initializer.extend([numpy_helper.from_array(np.asarray([0], np.int64), "ones/start"),
                                    numpy_helper.from_array(np.asarray([2], np.int64), "ones/end")])
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"], name="ones/Shape"),
             helper.make_node("Slice", ["x_shape", "ones/start", "ones/end"], ["batch_seq"], name="ones/Slice"),
             helper.make_node("ConstantOfShape", ["batch_seq"], ["ones"], name="ones/ConstantOfShape",
                              value=numpy_helper.from_array(np.asarray([1.0], np.float32)))]
    _feed_before(model, cast, nodes, "ones")
    assert _steps(match(model)) == [["scale", "add", "mul_mask", "add"]]


# ---------------------------------------------------------------- sink.py
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


# ---------------------------------------------------------------- scale.py
def test_a_constant_factor_that_varies_over_the_keys_is_not_a_per_head_scale():
    """logits * w, w a constant [1, 1, 6] (one weight per key): not constant along the keys, so not a head
    scale (which goes on Q); refused as a tensor that is not a scalar."""
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    init.CopyFrom(numpy_helper.from_array(np.linspace(0.5, 1.5, 6).astype(np.float32).reshape(1, 1, 6), "logit_scale"))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason
    model = per_head_scale("Mul")  # the same factor per head, [4, 1, 1]: a head scale
    assert any("head_scale" in steps for steps in _steps(match(model)))


def test_a_sink_after_a_boolean_mask_fuses_and_a_logit_op_after_the_sink_is_listed():
    from tests.match.logit_ops.test_sink import with_sinks
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


# ---------------------------------------------------------------- probs_mask.py
def test_a_reshape_of_the_probabilities_is_not_a_mask_reapplied():
    """Flatten -> Softmax -> Reshape(Shape(logits)) (the opset-12 form): the Reshape reads the probabilities
    and another tensor, as P * m does, but re-applies no mask."""
    (site,) = match(attention_model(softmax_style="flatten")).sites
    assert not [s.op for s in site.mask_steps if s.op.startswith("probs")]


def test_probabilities_squared_are_not_a_mask_reapplied():
    model = attention_model(opset=18)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    probs = softmax.output[0]
    for n in model.graph.node:
        n.input[:] = ["squared" if i == probs else i for i in n.input]
    model.graph.node.insert(list(model.graph.node).index(softmax) + 1,
                            helper.make_node("Mul", [probs, probs], ["squared"], name="square/Mul"))
    result = match(model)
    assert not any(s.op.startswith("probs") for site in result.sites for s in site.mask_steps)
    assert not result.sites and result.skipped


def test_a_factor_that_varies_over_the_queries_is_not_a_per_head_scale():
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    init.CopyFrom(numpy_helper.from_array(np.linspace(0.5, 1.5, 24).astype(np.float32).reshape(4, 6, 1), "logit_scale"))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason


def test_a_division_by_the_logits_is_refused():
    model = attention_model(scale_style="div_after")
    div = next(n for n in model.graph.node if n.op_type == "Div")
    div.input[:] = [div.input[1], div.input[0]]  # sqrt(d) / logits
    result = match(model)
    assert not result.sites and f"Div {div.name} divides by the logits" in result.skipped[0].reason


def test_a_multiplier_of_unknown_shape_from_shapes_alone_is_not_a_mask():
    """m of unknown shape made from Shape(free) only (no input's values): the input search ends without
    finding one, so mul_mask leaves it and scale.py refuses it."""
    model = _mask_of_unknown_shape()
    cast = next(n for n in model.graph.node if list(n.input) == ["attention_mask"])
    model.graph.input.append(helper.make_tensor_value_info("free", TensorProto.FLOAT, None))
    nodes = [helper.make_node("Shape", ["free"], ["free_shape"], name="ones/Shape"),
             helper.make_node("ConstantOfShape", ["free_shape"], ["ones"], name="ones/ConstantOfShape",
                              value=numpy_helper.from_array(np.asarray([1.0], np.float32)))]
    _feed_before(model, cast, nodes, "ones")
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason


@pytest.mark.parametrize("form", ["mul", "where", "where_not"])
def test_a_mask_on_the_probabilities_alone_is_not_already_normal(form):
    """Scale on Q and no mask but one re-applied to the probabilities: TensorRT's implicit fusion does not take
    that step, so normalize must rewrite the site (already_normal says no)."""
    from tests.match.logit_ops.test_probs_mask import reapply
    from trtattn.rewrite.normalize import already_normal

    (site,) = match(reapply(attention_model(opset=18, scale_style="mul_q"), form, None)).sites
    assert [s.op for s in site.mask_steps] == [{"mul": "probs_mul", "where": "probs_where",
                                                "where_not": "probs_where_not"}[form]]
    assert not already_normal(site)


def _feed_before(model, consumer, nodes, output: str) -> None:
    """Insert `nodes` before `consumer` and make its first input their `output`."""
    consumer.input[0] = output
    at = list(model.graph.node).index(consumer)
    for i, n in enumerate(nodes):
        model.graph.node.insert(at + i, n)
