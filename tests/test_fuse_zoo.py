"""Every zoo entry x exporter: every expected site found, fused into ONNX Attention and verified
against the original on ONNX Runtime within 1e-4 (fp32); and what the matcher says about each site
(the roles) is what the model code does."""

import collections

import onnx
import pytest
from conftest import zoo_cases

from trtattn import zoo
from trtattn.rewrite.fuse import fuse_model

_results = {}


def fused(zoo_export, name, exporter):
    key = (name, exporter)
    if key not in _results:
        model = onnx.load(str(zoo_export(name, exporter)))
        _results[key] = (model, fuse_model(model))
    return _results[key]


@pytest.mark.parametrize("name,exporter", zoo_cases())
def test_every_site_fuses_and_verifies(zoo_export, name, exporter):
    model, result = fused(zoo_export, name, exporter)
    expected = zoo.get(name).expected_sites
    rows = [r.row() for r in result.reports]
    assert len(rows) == expected, [r["name"] for r in rows]
    assert all(r["status"] == "fused" for r in rows), [(r["name"], r["reason"]) for r in rows]
    assert result.ok and result.verification["passed"]
    assert result.verification["max_abs_err"] <= 1e-4
    assert all(r["max_abs_err"] is not None and r["max_abs_err"] <= 1e-4 for r in rows)
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == expected and ops["Softmax"] == 0
    assert len({r["name"] for r in rows}) == expected  # unique names


def _sites(zoo_export, name, exporter):
    return [r.site for r in fused(zoo_export, name, exporter)[1].reports]


EXPORTERS = ["torchscript", "dynamo"]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_bart_roles(zoo_export, exporter):
    sites = _sites(zoo_export, "bart", exporter)
    kinds = collections.Counter((s.kind.value, s.causal.value) for s in sites)
    assert kinds == {("self", "none"): 2, ("self", "upper_left"): 2, ("cross", "none"): 2}
    assert all(s.q_heads == 4 and s.kv_heads == 4 and s.head_size == 16 for s in sites)
    assert all(abs(s.softmax_scale - 0.25) < 1e-7 for s in sites)
    assert all(s.scale_placement.value == "after_bmm1" for s in sites)  # BART multiplies the scores


@pytest.mark.parametrize("name", ["bart-sdpa", "llama-sdpa", "bert-sdpa"])
def test_torchscript_sdpa_puts_sqrt_scale_on_q_and_k(zoo_export, name):
    sites = _sites(zoo_export, name, "torchscript")
    assert all(s.scale_placement.value == "sqrt_on_qk" for s in sites)
    assert all(abs(s.softmax_scale - 0.25) < 1e-6 for s in sites)


@pytest.mark.parametrize("name", ["bart-sdpa", "llama-sdpa", "gemma3-sdpa", "vit-sdpa", "whisper-sdpa"])
def test_dynamo_sdpa_exports_are_read_from_onnx_attention(zoo_export, name):
    sites = _sites(zoo_export, name, "dynamo")
    assert sites and all(s.source == "onnx:Attention" for s in sites)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_whisper_prescales_q_before_the_head_split(zoo_export, exporter):
    sites = _sites(zoo_export, "whisper", exporter)
    assert all(s.scale_placement.value == "on_q" and abs(s.prescale - 0.25) < 1e-7 for s in sites)
    assert collections.Counter(s.kind.value for s in sites) == {"self": 4, "cross": 2}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_whisper_decoder_cache(zoo_export, exporter):
    sites = _sites(zoo_export, "whisper-decoder-cache", exporter)
    by_kind = collections.defaultdict(list)
    for s in sites:
        by_kind[s.kind.value].append(s)
    assert all(s.cache.value == "concat" and s.past_key.startswith("past_key_values") for s in by_kind["self"])
    assert all(s.cache.value == "cross_static" and "encoder" in s.key for s in by_kind["cross"])
    assert len(by_kind["self"]) == len(by_kind["cross"]) == 2


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_t5_unscaled_with_relative_bias(zoo_export, exporter):
    sites = _sites(zoo_export, "t5", exporter)
    assert all(s.softmax_scale == 1.0 and s.scale_placement.value == "none" for s in sites)
    reports = fused(zoo_export, "t5", exporter)[1].reports
    self_sites = [r for r in reports if r.site.kind.value == "self"]
    assert all(r.bias for r in self_sites)  # relative position bias on every self-attention


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_swin_window_attention_bias_and_shift_mask(zoo_export, exporter):
    reports = fused(zoo_export, "swin", exporter)[1].reports
    assert all(r.bias for r in reports)  # relative position bias (plus the shift mask on odd blocks)
    assert all(r.site.causal.value == "none" and not r.padding for r in reports)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_bert_padding_mask(zoo_export, exporter):
    reports = fused(zoo_export, "bert", exporter)[1].reports
    assert all(r.padding and r.site.causal.value == "none" for r in reports)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_vit_has_no_mask(zoo_export, exporter):
    reports = fused(zoo_export, "vit", exporter)[1].reports
    assert all(not r.padding and r.site.causal.value == "none" and not r.bias for r in reports)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_gpt2_fused_qkv_causal(zoo_export, exporter):
    sites = _sites(zoo_export, "gpt2", exporter)
    assert all(s.kind.value == "self" and s.causal.value == "upper_left" and s.padding for s in sites)


@pytest.mark.parametrize("name,exporter", [("llama", "torchscript"), ("llama", "dynamo"), ("llama-sdpa", "dynamo")])
def test_llama_gqa_rope_causal(zoo_export, name, exporter):
    sites = _sites(zoo_export, name, exporter)
    assert all(s.q_heads == 4 and s.kv_heads == 2 for s in sites)
    assert all(s.rope is not None and s.rope.kind.value == "half_split" and s.rope.rotary_dim == 16 for s in sites)
    assert all(s.causal.value == "upper_left" for s in sites)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_llama_cache_concat_lower_right(zoo_export, exporter):
    sites = _sites(zoo_export, "llama-cache", exporter)
    assert all(s.cache.value == "concat" and s.causal.value == "lower_right" and s.kv_heads == 2 for s in sites)
    assert all(s.past_key.startswith("past_key_values") and s.past_value.startswith("past_key_values") for s in sites)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_gemma3_sliding_window_and_global(zoo_export, exporter):
    sites = _sites(zoo_export, "gemma3", exporter)
    assert [s.window for s in sites] == [4, None]
    assert all(s.head_size == 256 and s.kv_heads == 2 and s.causal.value == "upper_left" for s in sites)
    assert all(abs(s.softmax_scale - 256 ** -0.5) < 1e-7 for s in sites)
