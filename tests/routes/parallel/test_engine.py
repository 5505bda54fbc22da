"""Tensor parallelism on the TensorRT side: each rank's network (the rank form parsed, its collectives
lowered to add_dist_collective) is checked against the real 11.4 bindings, and the N networks run
together by trtsim's reference executor equal the original model on ONNX Runtime."""

import numpy as np
import pytest
from trtsim.errors import BuildValidationError
from trtsim.execute import run_ranks

from trtattn.graph.evaluate import ort_session
from trtattn.routes.parallel import rank_feeds, split_model
from trtattn.routes.parallel.engine import rank_network_plan
from trtattn.testing import write_llama
from trtattn.testing.graphs import attention_model
from trtattn.trt.network import build_network

pytestmark = [pytest.mark.conformance, pytest.mark.reference]


def _networks(trt, forms, name):
    nets = []
    for r, model in enumerate(forms.models):
        plan, cut_model = rank_network_plan(model, name, r, forms.plan.ranks)
        builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
        nets.append(build_network(trt, builder, trt.Logger(trt.Logger.WARNING), cut_model, plan))
    assert trt.sim.problems == []
    return nets


def _layers(net, kind):
    return [net.get_layer(i) for i in range(net.num_layers) if str(net.get_layer(i).type).endswith(kind)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_rank_networks_all_reduce_match_onnx_runtime(checked_trt, ranks):
    trt = checked_trt
    model = attention_model(heads=4, kv_heads=2)
    forms = split_model(model, ranks)
    nets = _networks(trt, forms, "attn")
    (collective,) = _layers(nets[0], "DIST_COLLECTIVE")
    assert collective.num_ranks == ranks
    feeds = forms.feeds[0]
    expected = ort_session(model).run(None, feeds)[0]
    outs = run_ranks(nets, rank_feeds(feeds, forms.plan.split.input_shards, ranks))
    for out in outs:
        (got,) = out.values()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_rank_networks_gather_logits_and_keep_rank_caches(checked_trt, tmp_path):
    """The writer's cached Llama with a vocabulary-parallel LM head: ALL_GATHER along the logits' last axis
    (moved to the front and back by shuffles), each rank's present K/V its own heads."""
    from trtattn.graph import io

    trt = checked_trt
    path = write_llama.write_llama(tmp_path / "tiny.onnx", **{**write_llama.PRESETS["tiny"], "form": "cache",
                                                              "dtype": "float32"})
    model = io.load(path)
    forms = split_model(model, 2, gather_bytes=0)
    nets = _networks(trt, forms, "tiny")
    kinds = [layer.num_ranks for layer in _layers(nets[1], "DIST_COLLECTIVE")]
    assert len(kinds) == 6 and set(kinds) == {2}  # embedding, 2 x (attention, MLP), LM head
    feeds = forms.feeds[0]
    session = ort_session(model)
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    split = forms.plan.split
    outs = run_ranks(nets, rank_feeds(feeds, split.input_shards, 2))
    for out in outs:
        np.testing.assert_allclose(out["logits"], expected["logits"], rtol=1e-4, atol=1e-5)
    for name, shard in split.cached.items():
        got = np.concatenate([o[name] for o in outs], axis=shard.axis)
        np.testing.assert_allclose(got, expected[name], rtol=1e-4, atol=1e-5)


def test_rank_network_plan_profiles_the_rank_inputs(checked_trt):
    """Each rank's plan has its own I/O (past K/V with the rank's heads) and a profile over its dynamic
    dims; the recorded network takes the config TensorRT would build with."""
    from trtattn.trt.config import create_config

    trt = checked_trt
    forms = split_model(attention_model(heads=4, kv_heads=2), 2)
    plan, cut_model = rank_network_plan(forms.models[1], "attn", 1, 2, max_positions=16)
    assert plan.name == "attn.rank1of2" and [c.kind for c in plan.collectives] == ["ALL_REDUCE"]
    (profile,) = plan.profiles
    assert profile["x"]["max"][1] == 16
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = build_network(trt, builder, trt.Logger(trt.Logger.WARNING), cut_model, plan)
    config = create_config(trt, builder, network, plan.profiles)
    assert builder.build_serialized_network(network, config) is not None  # trtsim's build-time checks
    assert trt.sim.problems == []


def test_gather_without_num_ranks_is_refused_at_build(checked_trt):
    """An ALL_GATHER whose num_ranks was left at 1 has no output shape: trtsim's build check names it."""
    trt = checked_trt
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    x = network.add_input("x", trt.DataType.FLOAT, (2, 3))
    layer = network.add_dist_collective(x, trt.CollectiveOperation.ALL_GATHER, trt.ReduceOperation.NONE, 0, [0, 1])
    network.mark_output(layer.get_output(0))
    config = builder.create_builder_config()
    with pytest.raises(BuildValidationError, match="ALL_GATHER with num_ranks 1"):
        builder.build_serialized_network(network, config)


@pytest.mark.trt
def test_rank_engines_build_on_a_gpu(tmp_path):
    """On a GPU with TensorRT >= 11 (docker/): the rank forms of the hand-built GQA block build into one
    engine per rank (run on GPUs: tests/runtime/test_ranks.py)."""
    from trtattn.routes.parallel.engine import build_ranks
    from trtattn.trt import compat
    from trtattn.trt.session import trt_available

    ok, why = trt_available()
    if not ok:
        pytest.skip(f"TensorRT engines cannot be built here ({why}); this test runs in the docker/ container")
    trt = compat.import_tensorrt()
    forms = split_model(attention_model(heads=4, kv_heads=2), 2)
    engines = build_ranks(forms.models, trt, tmp_path, "attn", max_positions=16)
    assert [e.name for e in engines] == ["attn.rank0of2.engine", "attn.rank1of2.engine"]
    assert all(e.stat().st_size > 0 for e in engines)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("form", ["padded", "kv-cache"])
def test_rank_networks_of_the_build_form_keep_iattention(checked_trt, zoo_export, form, ranks):
    """The split of build's verified form (ONNX Attention, RotaryEmbedding, KV-cache update): each rank's
    network has its IAttention over its heads (2 of 4 query heads, 1 of 2 KV heads), its RoPE and cache
    layers, and its ALL_REDUCEs; the recorded ranks run together equal the one-GPU network. In the
    kv-cache form each rank's cache (input, update, output) holds its own KV head; over 4 ranks the 2 KV
    heads are replicated (each rank the one its query head uses)."""
    from trtsim.dtypes import to_numpy
    from trtsim.execute import run

    from trtattn.graph import io
    from trtattn.routes.parallel.engine import rank_plan_from_prepared
    from trtattn.routes.parallel.ranks import slice_array
    from trtattn.routes.prepare import forms as forms_mod
    from trtattn.routes.prepare import prepare

    trt = checked_trt
    name = "llama-cache" if form == "kv-cache" else "llama"
    original = io.load(zoo_export(name, "torchscript"))
    prepared = prepare(original, name=name, form=form, precision="fp32")
    forms = split_model(prepared.form_model, ranks)
    if form == "kv-cache":
        caches = {c.cache for c in prepared.plan.cache_updates}
        assert set(forms.plan.split.input_shards) == caches and len(caches) == 4
        assert {c.output for c in prepared.plan.cache_updates} == set(forms.plan.split.cached)
    logger = trt.Logger(trt.Logger.WARNING)
    single = build_network(trt, trt.Builder(logger), logger, prepared.cut, prepared.plan)
    nets = []
    for r in range(ranks):
        plan, cut_model = rank_plan_from_prepared(prepared, forms, r)
        assert [(a.q_heads, a.kv_heads) for a in plan.native] == [(4 // ranks, 1)] * 2
        if form == "kv-cache":  # the engine's cache inputs are the rank's heads at the cache capacity
            shapes = {i.name: i.shape for i in plan.inputs}
            assert {tuple(shapes[c.cache][1:]) for c in plan.cache_updates} == {(1, plan.limits.max_cache, 16)}
        assert len(plan.collectives) == 4
        nets.append(build_network(trt, trt.Builder(logger), logger, cut_model, plan))
    assert trt.sim.problems == []
    kinds = [str(nets[0].get_layer(i).type) for i in range(nets[0].num_layers)]
    assert sum(k.endswith("DIST_COLLECTIVE") for k in kinds) == 4
    adapter = forms_mod.form_adapter(original, [i.name for i in prepared.plan.inputs],
                                     [c.cache for c in prepared.plan.cache_updates], prepared.plan.limits.max_cache)
    types = {t._name: t._dtype for t in single._inputs}
    feeds = {k: np.asarray(v).astype(to_numpy(types[k])) for k, v in adapter.feeds(adapter.original_feeds(None, 0)).items()}
    expected = run(single, feeds)
    outs = run_ranks(nets, rank_feeds(feeds, forms.plan.split.input_shards, ranks))
    for name_, value in expected.items():
        shard = forms.plan.split.cached.get(name_)
        for r, out in enumerate(outs):  # each rank's cache: its KV heads (a replicated head on each holder)
            want = slice_array(np.asarray(value), shard, ranks, r) if shard else value
            np.testing.assert_allclose(out[name_], want, rtol=1e-4, atol=1e-5, err_msg=name_)


# Survivors of mutating routes/parallel (benchmarks/mutate.py): each test pins an outcome the fast lane left open.
def test_mqa_rank_plan_keeps_its_one_whole_kv_head():
    """One KV head over 2 ranks stays whole on every rank: each rank's IAttention has half the query heads
    and the one KV head. A plan whose KV heads shape inference left unknown (None) keeps them unknown."""
    from trtattn.routes.parallel.engine import rank_plan_from_prepared
    from trtattn.routes.prepare import prepare
    from trtattn.testing.graphs import attention_model

    prepared = prepare(attention_model(heads=4, kv_heads=1), name="attn", precision="fp32")
    forms = split_model(prepared.form_model, 2)
    (site,) = forms.plan.sites
    assert (site.q_per_rank, site.kv_per_rank) == (2, None)
    for r in range(2):
        plan, _ = rank_plan_from_prepared(prepared, forms, r)
        assert [(a.q_heads, a.kv_heads) for a in plan.attentions] == [(2, 1)]
    prepared.plan.attentions[0].kv_heads = None  # as plan.py records a 4-D Attention's K of unknown heads
    plan, _ = rank_plan_from_prepared(prepared, forms, 0)
    assert [(a.q_heads, a.kv_heads) for a in plan.attentions] == [(2, None)]
