"""Every zoo entry x exporter: every expected site found, fused into ONNX Attention and verified
against the original on ONNX Runtime within 1e-4 (fp32), or listed as not fused with the reason the
entry's class calls for; and what the matcher says about each site (the roles) is what the model code
does."""

import collections

import onnx
import pytest

from tests.conftest import exporter_cases, zoo_cases
from trtattn import zoo
from trtattn.rewrite.fuse import fuse_model

_results = {}

# Sites that are listed as not fused, by entry: (what the reason says, how many).
LISTED = {
    "bert-int8": ("logits are quantized", 2),  # ORT's quantize_static quantizes the logits inside the attention
    "led": ("not a product with V", 2),  # Longformer's sliding-chunk encoder attention (the decoder's fuse)
}


def _ops(graph) -> collections.Counter:
    """Op types of a graph and of the subgraphs in it."""
    ops = collections.Counter(n.op_type for n in graph.node)
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                ops += _ops(a.g)
    return ops


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
    reason, listed = LISTED.get(name, ("", 0))
    rows = [r.row() for r in result.reports]
    assert len(rows) == expected, [r["name"] for r in rows]
    not_fused = [(r["name"], r["reason"]) for r in rows if r["status"] != "fused"]
    assert len(not_fused) == listed and all(reason in why for _, why in not_fused), not_fused
    assert result.ok == (not listed)
    if listed < expected:
        assert result.verification.passed and result.verification.max_abs_err <= 1e-4
        assert all(r["max_abs_err"] is not None and r["max_abs_err"] <= 1e-4 for r in rows if r["status"] == "fused")
    ops = _ops(result.model.graph)
    assert ops["Attention"] == (expected - listed if listed < expected else 0)
    assert ops["Softmax"] >= listed and (ops["Softmax"] == 0 or listed)
    assert len({r["name"] for r in rows}) == expected  # unique names


def _sites(zoo_export, name, exporter):
    return [r.site for r in fused(zoo_export, name, exporter)[1].reports]


EXPORTERS = ["torchscript", "dynamo"]


@pytest.mark.parametrize("exporter", exporter_cases())
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


@pytest.mark.parametrize("name", ["bart-sdpa", "llama-sdpa", *(pytest.param(n, marks=pytest.mark.slow)
                                                            for n in ("gemma3-sdpa", "vit-sdpa", "whisper-sdpa"))])
def test_dynamo_sdpa_exports_are_read_from_onnx_attention(zoo_export, name):
    sites = _sites(zoo_export, name, "dynamo")
    assert sites and all(s.source == "onnx:Attention" for s in sites)


@pytest.mark.parametrize("exporter", exporter_cases())
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


@pytest.mark.parametrize("exporter", exporter_cases())
def test_t5_unscaled_with_relative_bias(zoo_export, exporter):
    sites = _sites(zoo_export, "t5", exporter)
    assert all(s.softmax_scale == 1.0 and s.scale_placement.value == "none" for s in sites)
    reports = fused(zoo_export, "t5", exporter)[1].reports
    self_sites = [r for r in reports if r.site.kind.value == "self"]
    assert all(r.bias for r in self_sites)  # relative position bias on every self-attention


@pytest.mark.parametrize("exporter", exporter_cases())
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


@pytest.mark.parametrize("exporter", exporter_cases())
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


@pytest.mark.parametrize("exporter", exporter_cases())
def test_gemma3_sliding_window_and_global(zoo_export, exporter):
    sites = _sites(zoo_export, "gemma3", exporter)
    assert [s.window for s in sites] == [4, None]
    assert all(s.head_size == 256 and s.kv_heads == 2 and s.causal.value == "upper_left" for s in sites)
    assert all(abs(s.softmax_scale - 256 ** -0.5) < 1e-7 for s in sites)


# ------------------------------------------------------------------ issue 10's classes in real exports
@pytest.mark.parametrize("exporter", exporter_cases())
def test_gemma2_softcap_becomes_the_attribute(zoo_export, exporter):
    model, result = fused(zoo_export, "gemma2", exporter)
    assert all(r.site.softcap == 5.0 for r in result.reports)
    attention = [n for n in result.model.graph.node if n.op_type == "Attention"]
    caps = [onnx.helper.get_attribute_value(a) for n in attention for a in n.attribute if a.name == "softcap"]
    assert caps == [5.0, 5.0]


@pytest.mark.parametrize("name,exporter", [("bloom", "torchscript"), pytest.param("bloom", "dynamo", marks=pytest.mark.slow),
                                           ("deberta-v2", "torchscript"),
                                           pytest.param("deberta-v2", "dynamo", marks=pytest.mark.slow)])
def test_biases_computed_in_the_graph_on_heads_merged_products(zoo_export, name, exporter):
    """BLOOM's ALiBi (baddbmm on [B*N, S, S]) and DeBERTa's c2p/p2c terms: additive biases, 4 heads read
    where the exports keep them apart."""
    reports = fused(zoo_export, name, exporter)[1].reports
    assert all(r.bias and r.site.q_heads == 4 and r.site.mask.value == "additive" for r in reports)


def test_xlnet_and_unet_einsum(zoo_export):
    for name in ("xlnet", "unet-einsum"):
        sites = _sites(zoo_export, name, "torchscript")
        assert sites and all("products written as Einsum" in s.notes and s.q_heads == 4 for s in sites)
    kinds = collections.Counter(s.kind.value for s in _sites(zoo_export, "unet-einsum", "torchscript"))
    assert kinds == {"self": 2, "cross": 2}


@pytest.mark.parametrize("exporter", exporter_cases())
def test_luong_single_query(zoo_export, exporter):
    site = _sites(zoo_export, "luong-gru", exporter)[0]
    assert site.scale == 1.0 and site.mask.value == "boolean" and site.q_heads == 1


@pytest.mark.parametrize("name,exporter,where", [("llama-merged", "torchscript", "branch"),
                                                 ("llama-merged", "dynamo", "branch"),
                                                 ("chunked-loop", "torchscript", "body")])
def test_attention_in_control_flow_fused_in_place(zoo_export, name, exporter, where):
    sites = _sites(zoo_export, name, exporter)
    assert sites and all(s.graph and s.graph[0][1].endswith(where) for s in sites)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_int8_sites_record_their_qdq(zoo_export, exporter):
    """ONNX Runtime's static int8 QDQ: every pair around the attention recorded for build and the TensorRT
    route; listed because the logits are quantized too (LISTED)."""
    for r in fused(zoo_export, "bert-int8", exporter)[1].reports:
        q = r.site.quant
        assert all(p is not None and p.dtype == "int8" for p in (q.query, q.key, q.value, q.logits, q.probs))
        assert q.probs.scale == pytest.approx(1 / 255, rel=1e-3)
