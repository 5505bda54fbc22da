"""ONNX Runtime's contrib attention ops (its transformer optimizer's output) become the standard
ONNX Attention op, verified against ONNX Runtime's own contrib kernels."""

import collections

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model


def ops(model):
    return collections.Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def test_ort_optimized_bert(zoo_export, tmp_path):
    from onnxruntime.transformers import optimizer

    src = zoo_export("bert", "torchscript")
    optimized = optimizer.optimize_model(str(src), model_type="bert", num_heads=4, hidden_size=64, opt_level=0,
                                         use_gpu=False, only_onnxruntime=False).model
    assert ops(optimized)["com.microsoft:Attention"] == 2
    sites = match(optimized).sites
    assert [s.source for s in sites] == ["com.microsoft:Attention"] * 2 and all(s.padding for s in sites)
    result = fuse_model(optimized)
    assert result.ok and [r.status for r in result.reports] == ["fused", "fused"]
    assert ops(result.model)["Attention"] == 2 and ops(result.model)["com.microsoft:Attention"] == 0
    assert result.verification.max_abs_err <= 1e-4


def _mha_model(unidirectional=0, mask=True, bias=True, attention_bias=False, heads=2, width=16, seed=0):
    rng = np.random.default_rng(seed)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", width]) for n in ("q", "k", "v")]
    names = ["q", "k", "v", "", "", ""]
    inits = []
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal(3 * width) * 0.5).astype(np.float32), "bias"))
        names[3] = "bias"
    if mask:
        inputs.append(helper.make_tensor_value_info("key_padding_mask", TensorProto.INT32, ["b", "s"]))
        names[4] = "key_padding_mask"
    if attention_bias:
        inputs.append(helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT, [1, heads, "s", "s"]))
        names[5] = "attention_bias"
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=heads,
                            unidirectional=unidirectional)
    graph = helper.make_graph([node], "mha", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    import json

    roles = {"key_padding_mask": {"kind": "padding_mask"}}
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(
        {"inputs": {i.name: roles.get(i.name, {"kind": "float"}) for i in inputs}, "dims": {"b": 2, "s": 6}}))
    return model


@pytest.mark.parametrize("kwargs", [{}, {"unidirectional": 1}, {"mask": False, "bias": False},
                                    {"attention_bias": True}, {"unidirectional": 1, "attention_bias": True}])
def test_multi_head_attention(kwargs):
    model = _mha_model(**kwargs)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert ops(result.model)["Attention"] == 1 and ops(result.model)["com.microsoft:MultiHeadAttention"] == 0
    assert result.verification.max_abs_err <= 1e-4


def test_group_query_attention_is_reported_not_converted():
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 4, 16])
    node = helper.make_node("GroupQueryAttention", ["q", "", "", "", "", "seqlens_k", "total"], ["y", "pk", "pv"],
                            domain="com.microsoft", num_heads=2, kv_num_heads=1)
    graph = helper.make_graph([node], "gqa", [q, helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
                                              helper.make_tensor_value_info("total", TensorProto.INT32, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    (site,) = match(model).sites
    assert site.source == "com.microsoft:GroupQueryAttention" and site.causal.value == "lower_right"
    assert site.q_heads == 2 and site.kv_heads == 1


def _projected_mha(kv_from: str, width=16, heads=2):
    """MultiHeadAttention over Q = x Wq and K, V projected from `kv_from` (ONNX Runtime's optimizer writes self-
    attention this way too, when it does not pack Q, K and V)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), f"w{x}") for x in "qkv"]
    nodes = [helper.make_node("MatMul", ["x" if x == "q" else kv_from, f"w{x}"], [x]) for x in "qkv"]
    nodes.append(helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft",
                                  num_heads=heads, name="mha"))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", width]) for n in sorted({"x", kv_from})]
    graph = helper.make_graph(nodes, "mha", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_multi_head_attention_kind_is_read_from_its_projections():
    """MultiHeadAttention takes Q, K and V as given: one hidden state projected to them is self-attention, two
    are cross-attention, Q/K/V given as graph inputs say neither (was: cross whenever it had no past)."""
    ((self_site,), (cross_site,), (given,)) = (match(m).sites for m in (
        _projected_mha("x"), _projected_mha("enc"), _mha_model(mask=False, bias=False)))
    assert (self_site.kind.value, cross_site.kind.value, given.kind.value) == ("self", "cross", "unknown")
