"""One attention per head (SHA), as NPU toolchains export it: proved one multi-head attention, merged, fused as
one Attention op per layer and verified (match/heads_merge.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from trtattn.graph.view import GraphView, import_graph
from trtattn.match import match
from trtattn.match.heads_merge import find_merges
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.sha import UNPACKS, select_mask_model, sha_folded_model, sha_model


def _merges(model):
    graph = import_graph(model)
    view = GraphView(graph, model)
    result = match(graph, view)
    return result, find_merges(view, result.sites)


def _attention_nodes(model):
    return [n for n in model.graph.node if n.op_type == "Attention"]


def _same_outputs(a, b, batch=2, seq=6, dim=32, seed=3):
    """Original and fused on ONNX Runtime (default session options) on inputs of our own, a padded mask too."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq, seq), dtype=np.int64)
    mask[1, :, -2:] = 0
    feeds = {"x": rng.standard_normal((batch, seq, dim)).astype(np.float32), "attention_mask": mask}
    want, got = (ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0] for m in (a, b))
    return float(np.abs(want - got).max())


@pytest.mark.parametrize("unpack", UNPACKS)
@pytest.mark.parametrize("pack", ["unsqueeze", "concat"])
def test_the_heads_of_each_layer_are_proved_one_attention(unpack, pack):
    result, merges = _merges(sha_model(unpack=unpack, pack=pack))
    assert len(result.sites) == 8 and len(merges) == 2
    for proof in merges:
        assert proof.heads == 4 and proof.query.split and proof.key.split and proof.value.split
        assert proof.query.tensor != proof.key.tensor and len(set(proof.sites)) == 4
        # the head atom sits in the heads axis of [B, T, N, H]; a Concat over features merges it with V's head dim
        assert proof.query.frame[2] == (proof.atom,)
        assert proof.out_frame[2] == ((proof.atom,) if pack == "unsqueeze" else (proof.atom, "e"))
    order = [s.name for s in result.sites]
    assert [list(p.sites) for p in merges] == [order[:4], order[4:]]


@pytest.mark.parametrize("unpack", UNPACKS)
@pytest.mark.parametrize("pack", ["unsqueeze", "concat"])
def test_sha_fuses_as_one_multi_head_attention_per_layer(unpack, pack):
    model = sha_model(unpack=unpack, pack=pack)
    result = fuse_model(model)
    assert result.ok and len(result.reports) == 2
    assert [r.site.q_heads for r in result.reports] == [4, 4]
    assert all(len(r.row()["merged"]) == 4 and "4 single-head sites merged" in r.row()["notes"][-1]
               for r in result.reports)
    ops = {n.op_type for n in result.model.graph.node}
    assert len(_attention_nodes(result.model)) == 2 and "Softmax" not in ops
    assert not ops & {"Split", "Gather", "Squeeze"}  # the unpacking folded away with the heads
    assert _same_outputs(model, result.model) < 1e-5


def test_heads_folded_into_the_query_over_one_kv_head_merge():
    model = sha_folded_model()
    result = fuse_model(model)
    assert result.ok and [(r.site.q_heads, r.site.kv_heads) for r in result.reports] == [(4, 1), (4, 1)]
    assert "one K and V read by every head" in result.reports[0].site.notes[-1]
    assert len(_attention_nodes(result.model)) == 2
    assert _same_outputs(model, result.model) < 1e-5


def test_heads_packed_out_of_order_are_not_merged_and_fuse_one_by_one():
    model = sha_model(order=[1, 0, 2, 3])
    assert _merges(model)[1] == []
    result = fuse_model(model)
    assert result.ok and len(result.reports) == 8 and all(r.site.q_heads == 1 for r in result.reports)
    assert _same_outputs(model, result.model) < 1e-5


def test_heads_with_different_scales_are_not_merged():
    assert _merges(sha_model(scales=[0.35, 0.35, 0.5, 0.35]))[1] == []


def test_a_head_unpacked_twice_is_not_a_cover():
    """Gather indices evaluated: head 3 reading head 2's piece is no partition of the heads axis."""
    model = sha_model(unpack="gather")
    gathers = [n for n in model.graph.node if n.op_type == "Gather"]
    index = {i.name: i for i in model.graph.initializer}[gathers[3].input[1]]
    index.CopyFrom(numpy_helper.from_array(np.asarray(2, dtype=np.int64), index.name))
    assert _merges(model)[1][1:] == [] and len(_merges(model)[1]) == 1  # layer 0 broken, layer 1 intact


def test_the_select_mask_shared_by_layers_with_a_transposed_output_fuses():
    model = select_mask_model()
    result = fuse_model(model)
    assert result.ok and [r.site.q_heads for r in result.reports] == [4, 4]
    assert len(_attention_nodes(result.model)) == 2
    assert _same_outputs(model, result.model) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
def test_torch_code_looping_over_heads_fuses_one_op_per_layer(tmp_path, dynamo):
    pytest.importorskip("torch")
    from trtattn.testing.sha_torch import export_sha

    model = onnx.load(export_sha(tmp_path / "sha.onnx", dynamo=dynamo))
    assert sum(n.op_type == "Softmax" for n in model.graph.node) == 8
    result = fuse_model(model)
    assert result.ok and [r.site.q_heads for r in result.reports] == [4, 4]
    assert len(_attention_nodes(result.model)) == 2
    assert _same_outputs(model, result.model) < 1e-4


def test_fuse_command_reports_the_merged_sites(tmp_path):
    from trtattn.cli import main

    src, out, report = tmp_path / "sha.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(sha_model(unpack="gather"), str(src))
    assert main(["--quiet", "fuse", str(src), "-o", str(out), "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert [len(s["merged"]) for s in data["sites"]] == [4, 4] and all(s["q_heads"] == 4 for s in data["sites"])
    assert data["counts"]["softmaxes"] == 8 and data["counts"]["fused"] == 2
    assert len(_attention_nodes(onnx.load(str(out)))) == 2


@pytest.mark.slow
@pytest.mark.parametrize("build", [sha_model, sha_folded_model])
def test_sha_reaches_one_tensorrt_attention_per_layer(tmp_path, build):
    """fuse --ops trt: one TRT_Attention (IAttention) per layer, with every head, checked on CPU through plugins/."""
    from trtattn.cli import main

    src, out = tmp_path / "sha.onnx", tmp_path / "trt.onnx"
    onnx.save(build(), str(src))
    assert main(["--quiet", "fuse", str(src), "-o", str(out), "--ops", "trt"]) == 0
    assert sum(n.op_type == "TRT_Attention" for n in onnx.load(str(out)).graph.node) == 2
