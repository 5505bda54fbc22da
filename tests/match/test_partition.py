"""match/partition.py: attention written in pieces proved one attention (issue 32): a key axis split into
blocks (the Gemma3 split-cache prefill, MHA with the heads folded into the query rows, and SHA), and a Softmax
shared by two value products (differential attention)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.site import CacheKind, SiteStatus
from trtattn.testing.pieces import shared_softmax_model, split_cache_model


def _with_bounds(model: onnx.ModelProto, bounds: dict[str, tuple[int, int]]) -> onnx.ModelProto:
    """`model` with the named Slices of the probabilities given other [start, end) bounds."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    for n in out.graph.node:
        if n.name in bounds:
            for name, value in zip(n.input[1:3], bounds[n.name]):
                inits[name].CopyFrom(numpy_helper.from_array(np.array([value], np.int64), name))
    return out


def _runs(model: onnx.ModelProto) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(0)
    return session.run(None, {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in session.get_inputs()})


@pytest.mark.parametrize("v_transposed", [True, False])
def test_split_cache_mha_is_one_attention_over_the_joined_blocks(v_transposed):
    model = split_cache_model(v_transposed=v_transposed, kv_len=6, seq=4)
    (site,) = match(model).sites
    assert site.partition is not None and site.partition.bounds == ((0, 6), (6, None))
    assert (site.q_heads, site.kv_heads, site.head_size) == (4, 1, 8)  # heads unfolded from the query rows
    assert site.cache == CacheKind.CONCAT and (site.past_key, site.past_value) == ("k_cache", "v_cache")
    assert site.key == site.partition.key and site.value == site.partition.value


def test_split_cache_sha_is_four_attentions():
    sites = match(split_cache_model(form="sha")).sites
    assert len(sites) == 4 and all(s.partition is not None and s.q_heads == 1 for s in sites)


@pytest.mark.parametrize("form", ["mha", "sha"])
def test_split_cache_fuses_verified_as_one_op_per_attention(form):
    model = split_cache_model(form=form)
    result = fuse_model(model)
    assert [r.status for r in result.reports] == [SiteStatus.FUSED] * (1 if form == "mha" else 4)
    assert result.verification.passed
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("Attention") == len(result.reports) and "Softmax" not in ops
    for got, want in zip(_runs(result.model), _runs(model)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_blocks_sliced_out_of_key_order_are_still_exact():
    """The cache's values weigh the last 6 probabilities and the new slice's the first 4: P.Concat(V_new, V_cache),
    one attention still (the slices are sorted, the values follow them)."""
    model = _with_bounds(split_cache_model(kv_len=4, seq=4), {"attn/p_cache": (4, 8), "attn/p_new": (0, 4)})
    (site,) = match(model).sites
    assert site.partition.bounds == ((0, 4), (4, None))
    assert site.partition.values[0].startswith("v_new")
    result = fuse_model(model)
    assert result.reports[0].status == SiteStatus.FUSED and result.verification.passed


@pytest.mark.parametrize("bounds, why", [
    ({"attn/p_cache": (0, 4), "attn/p_new": (3, 7)}, "do not cover their axis once"),  # key 3 twice
    ({"attn/p_cache": (0, 4), "attn/p_new": (4, 7)}, "not at the end of the axis"),  # the last key never
])
def test_slices_that_do_not_partition_the_keys_are_listed(bounds, why):
    model = split_cache_model(kv_len=4, seq=4)
    if bounds["attn/p_new"][1] - bounds["attn/p_new"][0] != 4:  # keep the model valid: V_new's rows cut to match
        model = _cut_new_values(model, 3)
    model = _with_bounds(model, bounds)
    _runs(model)  # the model itself runs
    result = match(model)
    assert not result.sites and len(result.skipped) == 1 and why in result.skipped[0].reason


def _cut_new_values(model: onnx.ModelProto, rows: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    product = next(n for n in out.graph.node if n.name == "attn/pv_new")
    out.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), f"cut_{i}")
                                  for i, v in enumerate(([0], [rows], [2]))])
    out.graph.node.append(helper.make_node("Slice", [product.input[1], "cut_0", "cut_1", "cut_2"], ["v_new_cut"],
                                           name="cut_values"))
    product.input[1] = "v_new_cut"
    out.graph.ClearField("value_info")
    sorted_nodes = _toposorted(out.graph)
    del out.graph.node[:]
    out.graph.node.extend(sorted_nodes)
    return out


def _toposorted(graph) -> list:
    made = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    left, order = list(graph.node), []
    while left:
        ready = [n for n in left if all(i in made or not i for i in n.input)]
        order += ready
        made |= {o for n in ready for o in n.output}
        left = [n for n in left if n not in ready]
    return order


def test_shared_probabilities_are_one_attention_per_value_product():
    model = shared_softmax_model()
    result = match(model)
    assert len(result.sites) == 2 and not result.skipped
    assert {s.value for s in result.sites} == {"v1_heads_out", "v2_heads_out"}
    assert all("feed 2 value products" in " ".join(s.notes) for s in result.sites)
    fused = fuse_model(model)
    assert all(r.status == SiteStatus.FUSED for r in fused.reports) and fused.verification.passed
    np.testing.assert_allclose(_runs(fused.model)[0], _runs(model)[0], atol=1e-5)
