"""rewrite/normalize/fusability: a soft-capped site is read from the site's typed cap, whatever wrote it."""

import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.graph.dims import fit_dims
from trtattn.graph.view import GraphView, import_graph
from trtattn.match import match
from trtattn.rewrite.normalize.fusability import verdict
from trtattn.testing.graphs import attention_model


def _sites(model: onnx.ModelProto):
    graph = import_graph(model)
    return match(graph, GraphView(graph, model, dims=fit_dims(model, None))).sites


def _attention_op(softcap: float) -> onnx.ModelProto:
    shape = [2, 4, 8, 16]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], softcap=softcap)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("model", [attention_model(softcap=2.0), _attention_op(2.0)], ids=["pattern", "onnx-op"])
def test_a_soft_capped_site_is_not_one_iattention_however_it_was_written(model):
    [site] = _sites(model)
    assert site.softcap == pytest.approx(2.0)
    v = verdict(site)
    assert not v.iattention and "IAttention has no logit soft-capping" in v.iattention_why


def test_an_uncapped_attention_op_has_no_cap():
    [site] = _sites(_attention_op(0.0))
    assert site.softcap is None and "IAttention has no logit soft-capping" not in verdict(site).iattention_why
