"""Issue 18, class 11: a mask applied by multiplication (logits * m + (1 - m) * -big; TF's SelectV2
Where(m, logits, 0) + offset) is fused as the equivalent mask and verified; a product without an offset
after it is listed, never silent."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import mask_step_ops
from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.edits import multiplied
from trtattn.testing.graphs import attention_model


@pytest.mark.parametrize("form", ["mul", "where"])
def test_multiplied_mask_with_offset_is_fused_and_verified(form):
    model = multiplied(attention_model(opset=18, mask_style="additive_input"), form, "attention_mask")
    (site,) = match(model).sites
    assert [s.op for s in site.mask_steps][-2:] == [{"mul": "mul_mask", "where": "where"}[form], "add"]
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


def test_multiplied_mask_without_offset_is_listed():
    model = multiplied(attention_model(opset=18, mask_style="additive_input"), "mul", "attention_mask", offset=False)
    result = match(model)
    assert not result.sites and "no offset" in result.skipped[0].reason


@pytest.mark.parametrize("form", ["mul", "where"])
def test_zoo_bert_with_multiplied_mask_fuses_verified(zoo_export, form):
    model = multiplied(onnx.load(str(zoo_export("bert", "torchscript"))), form, "attention_mask")
    reports = fuse_model(model).reports
    assert len(reports) == 2
    for r in reports:
        assert r.status == "fused" and r.max_abs_err < 1e-4, r.reason


# Survivors of mutating match/logit_ops/mul_mask.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
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
    assert mask_step_ops(match(_mask_of_unknown_shape())) == [["scale", "add", "mul_mask", "add"]]


def test_the_input_search_walks_on_past_a_tensor_it_has_seen():
    assert mask_step_ops(match(_mask_of_unknown_shape(extra_path=True))) == [["scale", "add", "mul_mask", "add"]]


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
    assert mask_step_ops(match(model)) == [["scale", "add", "mul_mask", "add"]]


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


def _feed_before(model, consumer, nodes, output: str) -> None:
    """Insert `nodes` before `consumer` and make its first input their `output`."""
    consumer.input[0] = output
    at = list(model.graph.node).index(consumer)
    for i, n in enumerate(nodes):
        model.graph.node.insert(at + i, n)
