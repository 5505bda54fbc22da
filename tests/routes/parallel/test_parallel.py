"""Tensor parallelism (routes/parallel): the split is found from the graph, each rank's form is a valid ONNX
model with its collectives explicit, and N ranks run on ONNX Runtime with the collectives in numpy equal the
original within verification's tolerance."""

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import graph_model
from trtattn.graph import external, io, validate
from trtattn.routes.parallel import DOMAIN, collective, split_model
from trtattn.routes.parallel.cost import llama_costs
from trtattn.testing import write_llama
from trtattn.testing.graphs import attention_model


def _collectives(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.domain == DOMAIN)


def test_collectives_in_numpy():
    parts = [np.full((2, 3), r + 1, np.float32) for r in range(4)]
    assert np.array_equal(collective("AllReduce", parts), np.full((2, 3), 10, np.float32))
    gathered = collective("AllGather", parts, axis=1)
    assert gathered.shape == (2, 12) and gathered[0, 3] == 2
    with pytest.raises(ValueError, match="AllReduce or AllGather"):
        collective("Broadcast", parts)


@pytest.mark.parametrize("ranks, q_rank, kv_rank", [(2, 2, 1), (4, 1, 1)])
def test_gqa_block_splits_by_whole_kv_groups(ranks, q_rank, kv_rank):
    """4 query / 2 KV heads: over 2 ranks each takes one KV group with its two query heads; over 4 the KV
    heads are replicated as TensorRT-LLM lays them out: each rank holds the one KV head its query head
    uses (KV head r * 2 // 4), its K/V projections that head's columns, and reads its query head's copy
    after GQA's repeat."""
    model = attention_model(heads=4, kv_heads=2)
    forms = split_model(model, ranks)
    (site,) = forms.plan.sites
    assert (site.q_per_rank, site.kv_per_rank) == (q_rank, kv_rank)
    assert not forms.plan.replicated
    assert ("replicated" in site.note) == (ranks == 4)
    assert len(forms.plan.split.narrowed) == (2 if ranks == 4 else 0)  # K and V after the repeat
    assert forms.plan.split.shape_fixes  # the heads constants of its Reshapes are the rank's
    columns = [[onnx.numpy_helper.to_array(t) for t in m.graph.initializer if list(t.dims) == [32, 8]]
               for m in forms.models]
    assert all(len(c) == (2 if ranks == 2 else 3) for c in columns)  # K, V (and Q at 4): one head's columns
    if ranks == 4:  # ranks 0 and 1 hold KV head 0, ranks 2 and 3 KV head 1
        assert np.array_equal(columns[0][1], columns[1][1]) and not np.array_equal(columns[1][1], columns[2][1])
    for r, rank in enumerate(forms.models):
        validate.check(rank, f"rank {r}")
        assert _collectives(rank) == {"AllReduce": 1}
        q_weight = {i.name: i for i in rank.graph.initializer}
        assert any(list(w.dims) == [32, 32 // ranks] for w in q_weight.values())  # Q's columns, sliced
    check = forms.verify()
    assert check.passed, check.errors
    assert max(check.errors.values()) < 1e-5


@pytest.mark.parametrize("style", ["split", "slice"])
def test_fused_qkv_projection_splits_in_blocks(style):
    """One [d, 3d] projection then Split (or three Slices) into Q, K, V: its columns split as 3 blocks, so each
    rank holds its heads of Q, of K and of V; the Split sizes / Slice bounds are the rank's."""
    forms = split_model(attention_model(heads=4, qkv_style=style), 2)
    assert list(forms.plan.split.groups.values()) == [3]
    (site,) = forms.plan.sites
    assert (site.q_per_rank, site.kv_per_rank) == (2, 2)
    check = forms.verify()
    assert check.passed, check.errors


def test_gemm_bias_is_added_once_after_the_reduce():
    """Gemm(x, W1, b1) -> Relu -> Gemm(., W2, b2): W1/b1 by columns, W2 by rows; b2 is added after the
    ALL_REDUCE, not on every rank."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 16)), ("b2", (16,)))]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="up"), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="down")], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    forms = split_model(model, 2)
    assert len(forms.plan.split.bias_after) == 1
    assert [n.op_type for n in forms.models[0].graph.node if n.op_type in ("AllReduce", "Add")] == ["AllReduce", "Add"]
    check = forms.verify()
    assert check.passed, check.errors


def test_heads_that_do_not_split_stay_whole():
    model = attention_model(heads=6)
    forms = split_model(model, 4)
    (site,) = forms.plan.sites
    assert site.q_per_rank is None and "do not split" in site.note
    reasons = " ".join(r for _, r in forms.plan.replicated)
    assert "[2, 6, 48] -> [2, 6, 6, 8]" in reasons
    assert all(_collectives(m) == {} for m in forms.models)
    assert forms.verify().passed


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    path = write_llama.write_llama(out / "tiny-cache.onnx", **{**write_llama.PRESETS["tiny"], "form": "cache",
                                                               "dtype": "float32"})
    return io.load(path)


def test_cache_holds_rank_heads_and_lm_head_gathers(tiny_llama):
    """The writer's Llama with a cache: each rank's past/present K/V hold its KV heads; with the gather
    threshold at 0 the LM head splits by vocabulary (its logits ALL_GATHERed) and so does the embedding
    (each rank's lookups ALL_REDUCEd)."""
    forms = split_model(tiny_llama, 2, gather_bytes=0)
    split = forms.plan.split
    assert set(split.input_shards) == {f"past_key_values.{i}.{p}" for i in range(2) for p in ("key", "value")}
    assert set(split.cached) == {f"present.{i}.{p}" for i in range(2) for p in ("key", "value")}
    assert set(split.gathered) == {"logits"}
    (lookup,) = split.vocab  # the embedding too: each rank its vocabulary rows (plus one of zeros)
    assert forms.plan.nodes[lookup].op == "Gather" and not forms.plan.replicated
    rank = forms.models[1]
    assert [list(t.dims) for t in rank.graph.initializer if t.name.endswith(".vocabulary")] == [[129, 64]]
    past = next(i for i in rank.graph.input if i.name == "past_key_values.0.key")
    assert past.type.tensor_type.shape.dim[1].dim_value == 1  # 2 KV heads over 2 ranks
    assert _collectives(rank) == {"AllReduce": 5, "AllGather": 1}
    check = forms.verify()
    assert check.passed, check.errors
    assert set(check.errors) == {"logits"} | set(split.cached)


def test_small_lm_head_and_embedding_stay_whole(tiny_llama):
    forms = split_model(tiny_llama, 2)
    assert not forms.plan.split.gathered and not forms.plan.split.vocab
    reasons = [r for _, r in forms.plan.replicated]
    assert len(reasons) == 2 and all("threshold" in r for r in reasons)
    assert any(r.startswith("embedding table [256, 64]") for r in reasons)


def test_split_in_slices_of_layers_keeps_each_session_under_the_model(tiny_llama, monkeypatch):
    """A model over half the memory is measured and checked in slices of layers (graph/slices.py) and its
    rank set one rank's wave (between collectives) at a time: forced here with a budget of a fraction of
    the tiny Llama's weights, no ONNX Runtime session the split opens holds the whole model, and the split
    and its errors are those of the unsliced run."""
    from trtattn.graph import slices
    from trtattn.routes.parallel import collectives, facts

    whole = split_model(tiny_llama, 2)
    held = []
    for module in (slices, collectives, facts):
        real = module.ort_session

        def recording(model, *args, real=real, **kwargs):
            held.append(slices.resident_size(model))
            return real(model, *args, **kwargs)
        monkeypatch.setattr(module, "ort_session", recording)
    weights = slices.resident_size(tiny_llama)
    forms = split_model(tiny_llama, 2, budget=weights // 6)
    assert len(slices.plan(tiny_llama, [o.name for o in tiny_llama.graph.output], weights // 6)) > 2
    check = forms.verify()
    assert check.passed, check.errors
    assert held and max(held) < weights * 2 // 3, (max(held), weights)
    assert forms.plan.split.input_shards == whole.plan.split.input_shards
    assert forms.plan.split.rows == whole.plan.split.rows
    assert check.errors == whole.verify().errors


def test_rank_forms_are_written_one_rank_and_weight_at_a_time_and_checked_from_their_files(tmp_path, monkeypatch):
    """forms.write (what build --tp does): each rank's form goes to NAME.rankRofN.onnx as it is made, rank after
    rank, its sliced weights written to NAME.rankRofN.onnx.data one by one (from the original's weights, left
    on disk); the forms are then those files, weights on disk, and the check reads them: it equals the
    in-memory forms' check, and fails once a rank's data file is changed."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from trtattn.routes.parallel import ranks as ranks_mod

    io.save(attention_model(heads=4, kv_heads=2, head=64), tmp_path / "attn.onnx", external_data=True)
    model = io.load(tmp_path / "attn.onnx", load_external_data=False)  # [256, 256] weights stay on disk
    whole = external.external_bytes(model)
    forms = split_model(model, 2)
    in_memory = forms.verify()
    stored = []  # (rank, the files in the folder) at each weight written
    real = ranks_mod.on_disk

    def recording(data):
        store = real(data)

        def put(name, value):
            stored.append((name.split(".rank")[1][0], sorted(p.name for p in (tmp_path / "ranks").iterdir())))
            return store(name, value)
        return put
    monkeypatch.setattr(ranks_mod, "on_disk", recording)
    monkeypatch.setattr("trtattn.routes.parallel.on_disk", recording)
    forms.__dict__.pop("models", None)
    paths = forms.write(tmp_path / "ranks", "attn", protect=(str(tmp_path / "attn.onnx"),))
    assert [p.name for p in paths] == ["attn.rank0of2.onnx", "attn.rank1of2.onnx"]
    order = [r for r, _ in stored]  # Q, K, V, O and the biases sliced: rank 0's, then rank 1's
    assert len(order) >= 8 and order == ["0"] * (len(order) // 2) + ["1"] * (len(order) // 2)
    assert all("attn.rank1of2.onnx" not in files for r, files in stored if r == "0")
    assert all("attn.rank0of2.onnx" in files for r, files in stored if r == "1")  # rank 0 done before rank 1
    for r, (path, rank) in enumerate(zip(paths, forms.models)):
        assert external.data_dir(rank) == path.parent and not rank.graph.initializer[0].HasField("raw_data")
        weights = [t for t in rank.graph.initializer if uses_external_data(t)]
        assert {ExternalDataInfo(t).location for t in weights} == {path.name + ".data"}
        split = sum(external.nbytes(t) for t in model.graph.initializer if f"{t.name}.rank{r}of2" in
                    {w.name for w in weights})  # the original's weights this rank holds a slice of
        assert split >= whole and external.external_bytes(rank) == split // 2  # half of each, all on disk
        assert path.with_name(path.name + ".data").stat().st_size >= split // 2
        validate.check(io.load(path), path.name)
    check = forms.verify()
    assert check.passed and check.errors == in_memory.errors and max(check.errors.values()) < 1e-5
    data = paths[1].with_name(paths[1].name + ".data")
    data.write_bytes(bytes(data.stat().st_size))  # rank 1's weights zeroed: the check must see it
    assert not forms.verify().passed


@pytest.mark.parametrize("ranks", [2, 4])
def test_zoo_llama(zoo_export, ranks):
    model = io.load(zoo_export("llama", "torchscript"))
    forms = split_model(model, ranks)
    assert len(forms.plan.split.rows) == 4  # per layer: the out projection and the MLP's down projection
    assert all(s.q_per_rank == 4 // ranks for s in forms.plan.sites)
    check = forms.verify()
    assert check.passed, check.errors


@pytest.mark.slow
@pytest.mark.parametrize("name, exporter", [("bart", "torchscript"), ("t5", "torchscript"),
                                            ("llama-cache", "torchscript"), ("llama", "dynamo"),
                                            ("gpt2", "torchscript")])
@pytest.mark.parametrize("ranks", [2, 4])
def test_zoo_split(zoo_export, name, exporter, ranks):
    model = io.load(zoo_export(name, exporter))
    forms = split_model(model, ranks)
    assert forms.plan.split.rows and all(s.q_per_rank for s in forms.plan.sites)
    check = forms.verify()
    assert check.passed, check.errors


def test_build_tp_writes_rank_forms_and_plans_then_exits_4(tmp_path, capsys):
    """Without TensorRT, `build --tp 2` splits build's verified form, verifies the ranks, writes one form and
    one build plan per rank and the set's plan (per rank weights, KV cache, collective bytes; the single-GPU
    figures beside), and exits 4."""
    import json

    from trtattn.cli import main
    from trtattn.trt import compat

    try:
        compat.import_tensorrt()
        pytest.skip("TensorRT is installed: build would go on to the engines")
    except Exception:
        pass
    src = tmp_path / "attn.onnx"
    io.save(attention_model(heads=4, kv_heads=2), src)
    out = tmp_path / "engines"
    assert main(["-q", "build", str(src), "--tp", "2", "--out-dir", str(out), "--max-cache", "32",
                 "--precision", "fp32"]) == 4
    plan = json.loads((out / "attn.tp.json").read_text())
    assert plan["tensor_parallel"] == 2 and plan["verification"]["passed"]
    assert plan["verification"]["against"] == "the verified form" and plan["form"] == "padded"
    rank_plan = json.loads((out / plan["ranks"][1]["plan"]).read_text())  # the rank's own build plan
    assert [(a["q_heads"], a["kv_heads"]) for a in rank_plan["attentions"]] == [(2, 1)]
    assert [c["kind"] for c in rank_plan["collectives"]] == ["ALL_REDUCE"]
    assert [c["kind"] for c in plan["collectives"]] == ["ALL_REDUCE"]
    assert plan["sites"][0]["q_heads_per_rank"] == 2 and plan["sites"][0]["kv_heads_per_rank"] == 1
    ranks = plan["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["kv_cache_bytes"] * 2 == plan["single_gpu"]["kv_cache_bytes"] == 2 * 2 * 8 * 32 * 4
    assert ranks[0]["weight_bytes"] < plan["single_gpu"]["weight_bytes"]
    assert ranks[0]["all_reduce_bytes"] == 32 * 4  # the out-projection's 32 floats per token
    for r in ranks:
        validate.check(io.load(out / r["form"]), r["form"])
        assert (out / (r["form"] + ".data")).is_file()  # each rank's weights beside it, written as it was made
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # the scratch the check read is gone
    assert "KV cache at 32" in capsys.readouterr().out


def test_build_tp_of_a_model_over_half_the_memory_slices_its_ranks_from_the_file(tmp_path, monkeypatch):
    """A model over half the memory (forced: slices of 1 MB) is not read in by build --tp: its weights stay on
    disk, each rank's are sliced from the file as it is written, and the ranks checked from their files pass
    (run from another folder than the model's: the matcher finds its sites from anywhere)."""
    import json

    from trtattn.cli import main
    from trtattn.graph import slices
    from trtattn.trt import compat

    try:
        compat.import_tensorrt()
        pytest.skip("TensorRT is installed: build would go on to the engines")
    except Exception:
        pass
    (tmp_path / "model").mkdir()
    src = write_llama.write_llama(tmp_path / "model" / "llama.onnx", layers=2, hidden=256, heads=4, kv_heads=2,
                                  ffn=512, vocab=512, max_positions=64, dtype="float32")
    monkeypatch.setenv(slices.SLICE_ENV, "1")
    monkeypatch.chdir(tmp_path)
    loads = []
    real = io.load
    monkeypatch.setattr(io, "load", lambda path, load_external_data=True: loads.append(load_external_data) or
                        real(path, load_external_data))
    out = tmp_path / "engines"
    assert main(["-q", "build", str(src), "--tp", "2", "--out-dir", str(out), "--max-cache", "64",
                 "--precision", "fp16"]) == 4  # AutoCast's staging copy finds the weights left on disk too
    assert loads[0] is False and True not in loads[:2]  # the model's weights were never read in
    plan = json.loads((out / "llama.tp.json").read_text())
    assert plan["precision"] == "fp16"
    assert plan["verification"]["passed"] and plan["verification"]["max_abs_err"] < 1e-2
    assert [s["q_heads_per_rank"] for s in plan["sites"]] == [2, 2]
    for r in plan["ranks"]:
        rank = real(out / r["form"], load_external_data=False)
        assert external.external_bytes(rank) > 0 and external.data_dir(rank) == out


@pytest.mark.parametrize("ranks", [2, 4])
def test_build_tp_kv_cache_form_keeps_each_rank_its_own_cache(tiny_llama, tmp_path, ranks):
    """build's kv-cache form updates the cache with a ScatterND addressing KV heads by index: the split takes
    it (each rank's indices shifted into its own heads), so a rank's cache input, update and output hold its
    KV head only; its plan's cache inputs and the set's KV bytes are the rank's share. Over 4 ranks the 2 KV
    heads are replicated (TensorRT-LLM's layout): each rank holds the one its query head uses."""
    import json

    from trtattn.cli import main
    from trtattn.trt import compat

    try:
        compat.import_tensorrt()
        pytest.skip("TensorRT is installed: build would go on to the engines")
    except Exception:
        pass
    src = tmp_path / "tiny.onnx"
    io.save(tiny_llama, src)
    out = tmp_path / "engines"
    assert main(["-q", "build", str(src), "--tp", str(ranks), "--form", "kv-cache", "--out-dir", str(out),
                 "--max-cache", "32", "--precision", "fp32"]) == 4
    plan = json.loads((out / "tiny.tp.json").read_text())
    assert plan["verification"]["passed"] and plan["form"] == "kv-cache"
    caches = {f"past_key_values.{i}.{p}" for i in range(2) for p in ("key", "value")}
    assert plan["sharded_inputs"] == dict.fromkeys(caches, 1)
    assert [(s["q_heads_per_rank"], s["kv_heads_per_rank"], s["ranks_per_kv_head"]) for s in plan["sites"]] \
        == [(4 // ranks, 1, ranks // 2)] * 2
    whole = plan["single_gpu"]["kv_cache_bytes"]
    assert whole == 2 * 2 * 2 * 16 * 32 * 4 and all(r["kv_cache_bytes"] * 2 == whole for r in plan["ranks"])
    for r in plan["ranks"]:
        rank_plan = json.loads((out / r["plan"]).read_text())
        shapes = {i["name"]: i["shape"] for i in rank_plan["inputs"]}
        assert all(shapes[c][1:] == [1, 32, 16] for c in caches)  # one KV head at the cache capacity
        form = io.load(out / r["form"])
        validate.check(form, r["form"])
        assert sum(n.op_type == "ScatterND" for n in form.graph.node) == 4
        assert [(a["q_heads"], a["kv_heads"]) for a in rank_plan["attentions"]] == [(4 // ranks, 1)] * 2


def test_rank_costs_match_the_llama_formula(tiny_llama):
    """The README's 8B/70B figures come from llama_costs; on the tiny preset it must give what the split
    of the written model holds (N=4: only the K/V slices' few index constants differ)."""
    from trtattn.routes.parallel.cost import rank_costs

    tiny = write_llama.PRESETS["tiny"]
    for ranks in (2, 4):
        forms = split_model(tiny_llama, ranks, gather_bytes=0)
        measured = rank_costs(forms, 64)[0]
        formula = llama_costs(tiny, ranks, 64, dtype_bytes=4, gather_bytes=0)
        assert abs(measured.weight_bytes - formula.weight_bytes) <= 128
        assert (measured.kv_cache_bytes, measured.all_reduces, measured.all_reduce_bytes, measured.all_gather_bytes) \
            == (formula.kv_cache_bytes, formula.all_reduces, formula.all_reduce_bytes, formula.all_gather_bytes)


def test_build_folder_tp_splits_the_verified_form_of_each_part(tmp_path, tiny_llama, capsys):
    """`build DIR --tp 2` prepares the parts as `build DIR` does (a decoder-only export: the kv-cache form)
    and splits each part's verified form, so every rank's plan has its IAttentions over its heads and its
    cache its KV head (was: the parts split as exported, no IAttention)."""
    import json

    from trtattn.cli import main
    from trtattn.trt import compat

    try:
        compat.import_tensorrt()
        pytest.skip("TensorRT is installed: build would go on to the engines")
    except Exception:
        pass
    folder = tmp_path / "export"
    folder.mkdir()
    io.save(tiny_llama, folder / "model.onnx")
    assert main(["-q", "build", str(folder), "--tp", "2", "--precision", "fp32", "--max-cache", "32",
                 "--out-dir", str(tmp_path / "engines")]) == 4
    out = tmp_path / "engines" / "export"
    index = json.loads((out / "tp.json").read_text())
    assert index == {"tensor_parallel": 2, "parts": {"decoder": {"source": "model.onnx", "form": "kv-cache",
                                                                 "plan": "decoder.tp.json"}}}
    plan = json.loads((out / "decoder.tp.json").read_text())
    assert plan["verification"]["passed"] and plan["form"] == "kv-cache"
    assert set(plan["sharded_inputs"]) == {f"past_key_values.{i}.{p}" for i in range(2) for p in ("key", "value")}
    for r in plan["ranks"]:
        rank_plan = json.loads((out / r["plan"]).read_text())
        assert [(a["q_heads"], a["kv_heads"]) for a in rank_plan["attentions"]] == [(2, 1)] * 2
        assert len(rank_plan["cache_updates"]) == 4
        validate.check(io.load(out / r["form"]), r["form"])
    # pipeline.json as `build DIR` writes it (was: none), each part naming its rank set and each rank's engine
    from trtattn.errors import TrtattnError
    from trtattn.runtime.pipeline import load_pipeline

    pipeline = json.loads((out / "pipeline.json").read_text())
    assert (pipeline["tensor_parallel"], pipeline["kind"], pipeline["built"]) == (2, "decoder-only", False)
    decoder = pipeline["parts"]["decoder"]
    assert (decoder["form"], decoder["onnx"], decoder["plan"], decoder["ranks"]) == (
        "kv-cache", "decoder.kv-cache.onnx", "decoder.tp.json", ["decoder.rank0of2.engine", "decoder.rank1of2.engine"])
    # loadable as the one-device folder: on ONNX Runtime its verified form, generating the export's tokens
    assert load_pipeline(out, backend="ort").parts == {"decoder": out / "decoder.kv-cache.onnx"}
    capsys.readouterr()
    tokens = []
    for target, extra in ((folder, []), (out, ["--backend", "ort"])):
        assert main(["-q", "run", str(target), *extra, "--generate", "4", "--prompt", "5,17,33", "--json"]) == 0
        tokens.append(json.loads(capsys.readouterr().out)["requests"][0]["tokens"])
    assert tokens[0] == tokens[1] and len(tokens[0]) == 4
    # on TensorRT each rank process takes its own engines; outside one, the set is named, and here (no GPU)
    # `run` says in one line that it needs 2 GPUs
    with pytest.raises(TrtattnError, match="each part is a set of 2 rank engines"):
        load_pipeline(out)
    assert main(["-q", "run", str(out), "--generate", "2", "--prompt", "5,17"]) == 4
    assert "needs 2 GPUs" in capsys.readouterr().err


@pytest.mark.slow
def test_bart_generation_parts_keep_their_caches_per_rank(zoo_dir):
    """BART's encoder, first decoder step and decoder step with a cache (zoo/generation.py): the first step's
    presents (self and cross K/V) are each rank's heads, the step reads its pasts in slices."""
    from trtattn.zoo import generation

    parts = generation.export_family("bart", zoo_dir / "family-bart")
    layers = 2
    expected_cached = {"bart-decoder-init": 4 * layers, "bart-decoder-step": 2 * layers}
    for name, path in parts.items():
        forms = split_model(io.load(path), 2)
        split = forms.plan.split
        assert len(split.cached) == expected_cached.get(name, 0), name
        assert len(split.input_shards) == (4 * layers if name == "bart-decoder-step" else 0), name
        check = forms.verify()
        assert check.passed, (name, check.errors)


def test_an_attention_the_matcher_did_not_read_is_named_not_split_silently():
    """Exp / (ReduceSum + eps) looks like attention but is not proven a softmax: the split names it."""
    import onnx_graphsurgeon as gs

    from trtattn.errors import TrtattnError
    from trtattn.testing.fuzz.softmax_forms import write_softmax

    g = gs.import_onnx(attention_model(opset=18))
    write_softmax(g, next(n for n in g.nodes if n.op == "Softmax"), "sum_eps")
    model = gs.export_onnx(g)
    with pytest.raises(TrtattnError, match="did not read: .*cannot be proven"):
        split_model(model, 2)


# Survivors of mutating routes/parallel (benchmarks/mutate.py): each test pins an outcome the fast lane left open.
def _weights(*specs):
    rng = np.random.default_rng(0)
    return [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in specs]


def test_gemm_bias_of_one_row_splits_with_its_columns():
    """A column-split Gemm's bias of shape [1, N] is sliced by its last axis like the weight's columns."""
    inits = _weights(("w1", (16, 32)), ("b1", (1, 32)), ("w2", (32, 16)))
    model = graph_model([helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="up"),
                    helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Gemm", ["r", "w2"], ["y"], name="down")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], inits)
    forms = split_model(model, 2)
    biases = [[list(t.dims) for t in m.graph.initializer if t.name.startswith("b1")] for m in forms.models]
    assert biases == [[[1, 16]], [[1, 16]]]
    check = forms.verify()
    assert check.passed, check.errors


def test_split_along_an_unsharded_axis_keeps_the_shard():
    """Heads sharded on axis 2, then a rotate-half Split of each head's axis 3: both halves stay sharded by
    heads, and the ranks' outputs match the original."""
    inits = _weights(("w1", (16, 16)), ("w2", (16, 16))) + [
        onnx.numpy_helper.from_array(np.array([0, 0, 4, 4], np.int64), "heads"),
        onnx.numpy_helper.from_array(np.array([0, 0, 16], np.int64), "flat"),
        onnx.numpy_helper.from_array(np.array([2, 2], np.int64), "halves")]
    model = graph_model([helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
                    helper.make_node("Reshape", ["h", "heads"], ["hh"], name="to_heads"),
                    helper.make_node("Split", ["hh", "halves"], ["a", "b"], axis=3, name="halve"),
                    helper.make_node("Neg", ["b"], ["nb"]),
                    helper.make_node("Concat", ["nb", "a"], ["rot"], axis=3, name="rotate"),
                    helper.make_node("Reshape", ["rot", "flat"], ["f"], name="from_heads"),
                    helper.make_node("MatMul", ["f", "w2"], ["y"], name="down")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])], inits)
    forms = split_model(model, 2)
    assert not forms.plan.replicated, forms.plan.replicated
    assert all(any(n.op_type == "AllReduce" for n in m.graph.node) for m in forms.models)
    check = forms.verify()
    assert check.passed, check.errors
