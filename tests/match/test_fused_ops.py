"""ONNX's own Attention op read as a site (match/fused_ops.py)."""

import numpy as np
from onnx import TensorProto, helper

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.contrib_graphs import group_query_model


def _attention(inputs: list[str], dtype: int = TensorProto.FLOAT):
    shape = [1, 2, 4, 8]
    names = [i for i in inputs if i]
    graph = helper.make_graph(
        [helper.make_node("Attention", inputs, ["y"], name="attn")], "g",
        [helper.make_tensor_value_info(i, dtype, shape) for i in names],
        [helper.make_tensor_value_info("y", dtype, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_past_key_without_past_value_is_listed_with_the_reason():
    result = match(_attention(["q", "k", "v", "", "past_k"]))
    assert not result.sites
    assert [s.reason for s in result.skipped] == ["Attention attn has only one of past_key and past_value"]


def test_plain_attention_op_is_a_site():
    result = match(_attention(["q", "k", "v"]))
    assert [s.output for s in result.sites] == ["y"] and not result.skipped
    assert result.sites[0].dtype == "float32"


def test_an_attention_ops_precision_is_its_querys():
    [site] = match(_attention(["q", "k", "v"], TensorProto.FLOAT16)).sites
    assert site.dtype == "float16"


def _projected(q_from: str, kv_from: str, project_kv: bool = True):
    """A 3-D Attention op over Q = x Wq and K/V projected from `kv_from` (or read as graph inputs)."""
    from onnx import numpy_helper

    d = 16
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), f"w{x}") for x in "qkv"]
    nodes = [helper.make_node("MatMul", [q_from, "wq"], ["q"])]
    kv = ["k", "v"]
    if project_kv:
        nodes += [helper.make_node("MatMul", [kv_from, f"w{x}"], [x]) for x in kv]
    else:
        kv = [f"{kv_from}_k", f"{kv_from}_v"]
    nodes.append(helper.make_node("Attention", ["q", *kv], ["y"], name="attn", q_num_heads=2, kv_num_heads=2))
    inputs = sorted({q_from, kv_from} if project_kv else {q_from, *kv})
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [1, "s", d])
                                           for i in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", d])],
                              initializer=[i for i in inits if project_kv or i.name == "wq"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_kind_is_read_from_the_projections():
    """One hidden state projected to Q and K: self; two: cross; a projected query over K/V read from graph
    inputs: cross over a static cache."""
    ((self_site,), (cross_site,), (static_site,)) = (
        match(m).sites for m in (_projected("x", "x"), _projected("x", "enc"), _projected("x", "enc", False)))
    assert (self_site.kind.value, self_site.cache.value) == ("self", "none")
    assert (cross_site.kind.value, cross_site.cache.value) == ("cross", "none")
    assert (static_site.kind.value, static_site.cache.value) == ("cross", "cross_static")


def test_unprojected_graph_inputs_say_no_kind():
    """Q, K and V given as graph inputs: no projection says whether they are one sequence (the kind is unknown);
    over a past concatenated with the new keys, self-attention over a cache."""
    (plain,) = match(_attention(["q", "k", "v"])).sites
    (cached,) = match(_attention(["q", "k", "v", "", "past_k", "past_v"])).sites
    assert plain.kind.value == "unknown"
    assert (cached.kind.value, cached.cache.value) == ("self", "concat")


# Survivors of mutating match/ and testing/ (benchmarks/mutate.py, seed 20261128): each test fails when the line its
# docstring names is mutated.
def test_group_query_attention_softcap_is_on_the_site():
    """match/fused_ops.py:142: the site of a GroupQueryAttention with softcap says its cap (None without one)."""
    model = group_query_model()
    assert fuse_model(model).reports[0].site.softcap is None
    model.graph.node[0].attribute.append(helper.make_attribute("softcap", 2.0))
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert result.reports[0].site.softcap == 2.0
