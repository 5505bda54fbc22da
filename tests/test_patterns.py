"""Pattern variants beyond the zoo: hand-built graphs in other exporters' styles (tf2onnx's
(1 - mask) * -10000, paddle2onnx's Slice/Split QKV, older torch's rank-3 BMMs and opset 11
Softmax), each verified against itself on ONNX Runtime after fusing."""

import collections

import numpy as np
import onnx
import pytest
from graphs import attention_model

from trtattn.rewrite.fuse import fuse_model
from trtattn.match import match


def fuse_one(**kwargs):
    model = attention_model(**kwargs)
    result = fuse_model(model)
    assert len(result.reports) == 1, [r.row() for r in result.reports]
    report = result.reports[0]
    assert report.status == "fused", report.reason
    assert result.ok and result.verification["max_abs_err"] <= 1e-4
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == 1 and ops["Softmax"] == 0
    return report, result


@pytest.mark.parametrize("opset", [11, 12, 13, 15, 17, 18, 21, 23])
def test_opsets(opset):
    report, result = fuse_one(opset=opset)
    assert report.site.scale_placement.value == "after_bmm1"
    assert abs(report.site.softmax_scale - 8 ** -0.5) < 1e-6


@pytest.mark.parametrize("style,placement", [("div_after", "after_bmm1"), ("mul_after", "after_bmm1"),
                                             ("mul_q", "on_q"), ("mul_k", "on_k"), ("sqrt_qk", "sqrt_on_qk"),
                                             ("mul_q_proj", "on_q"), ("none", "none")])
def test_scale_placements(style, placement):
    report, _ = fuse_one(scale_style=style)
    assert report.site.scale_placement.value == placement
    expected = 1.0 if style == "none" else 8 ** -0.5
    assert abs(report.site.softmax_scale - expected) < 1e-6


def test_scale_computed_from_the_shape_is_read_after_folding():
    # div_after divides by Sqrt(8) computed in the graph, not a literal
    report, _ = fuse_one(scale_style="div_after")
    assert abs(report.site.scale - 8 ** -0.5) < 1e-6


@pytest.mark.parametrize("style,kind", [("additive_input", "additive"), ("bool_where", "boolean"),
                                        ("notequal_where", "boolean"), ("where_not", "boolean")])
def test_padding_masks(style, kind):
    report, _ = fuse_one(mask_style=style)
    assert report.site.mask.value == kind
    assert report.padding and report.site.causal.value == "none"


@pytest.mark.parametrize("style", ["causal_trilu", "causal_range"])
def test_causal_masks_become_is_causal(style):
    report, result = fuse_one(mask_style=style)
    assert report.site.causal.value == "upper_left" and report.pattern == "causal" and not report.padding
    node = next(n for n in result.model.graph.node if n.op_type == "Attention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["is_causal"] == 1 and len(node.input) == 3  # the mask subgraph is gone


def test_sliding_window_from_range_comparisons():
    report, _ = fuse_one(mask_style="window_range", window=3, seq=9)
    assert report.pattern == "window" and report.site.window == 3


@pytest.mark.parametrize("style", ["bias_gather", "bias_and_mask"])
def test_biases_gathered_from_other_inputs(style):
    report, _ = fuse_one(mask_style=style)
    assert report.bias and report.site.mask.value == "additive"


def test_key_pretransposed_from_bsnh():
    report, _ = fuse_one(k_style="bsnh")
    assert report.site.k_layout.value == "BSNH" and report.site.key_perm == (0, 2, 1, 3)


@pytest.mark.parametrize("qkv", ["split", "slice"])
def test_fused_qkv_projection(qkv):
    report, _ = fuse_one(qkv_style=qkv)
    assert report.site.kind.value == "self"


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_gqa_and_mqa_head_repeat_is_dropped(kv_heads):
    report, result = fuse_one(kv_heads=kv_heads)
    assert report.site.q_heads == 4 and report.site.kv_heads == kv_heads
    assert not any(n.op_type == "Expand" for n in result.model.graph.node)  # the repeat went with the site


def test_rank3_batched_matmuls():
    report, _ = fuse_one(rank=3)
    assert report.site.rank == 3


def test_identity_cast_dropout_in_the_chain():
    report, _ = fuse_one(noise=True, cast_softmax=True)
    assert report.site.scale_placement.value == "after_bmm1"


def test_tf2onnx_style_opset11():
    report, _ = fuse_one(opset=11, qkv_style="split", mask_style="additive_input", k_style="bsnh", noise=True)
    assert report.padding and report.site.k_layout.value == "BSNH"


# ------------------------------------------------------------------ negatives
@pytest.mark.parametrize("extra,reason", [("classifier", "graph output"), ("reduction", "not a product with V")])
def test_non_attention_softmax_is_left_alone(extra, reason):
    model = attention_model(extra_softmax=extra)
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused"] and result.ok
    assert any(reason in i.reason for i in result.ignored)
    softmaxes = [n for n in result.model.graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == 1 and not softmaxes[0].name.startswith("attn")
    original = next(n for n in model.graph.node if n.name == softmaxes[0].name)
    assert original.input == softmaxes[0].input and original.output == softmaxes[0].output


def test_probabilities_as_graph_output_are_listed_not_fused():
    """output_attentions: the probabilities leave the model, so no fused op can replace them; the
    attention is listed as not fused (never silently ignored)."""
    model = attention_model(extra_softmax="probs_output")
    result = match(model)
    assert result.sites == [] and not result.ignored
    assert "graph output" in result.skipped[0].reason


def test_wrong_fill_is_not_a_mask():
    """Where(mask, scores, 0) zeroes logits instead of masking them: not fusable, and said so."""
    model = attention_model(mask_style="bool_where")
    for init in model.graph.initializer:
        if init.dims == [] and np.isinf(onnx.numpy_helper.to_array(init)).all():
            init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(0.0, np.float32), init.name))
    result = match(model)
    assert not result.sites and "not a large negative value" in result.skipped[0].reason
