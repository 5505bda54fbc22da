"""Pattern variants beyond the zoo: hand-built graphs in other exporters' styles (tf2onnx's
(1 - mask) * -10000, paddle2onnx's Slice/Split QKV, older torch's rank-3 BMMs and opset 11
Softmax), each verified against itself on ONNX Runtime after fusing."""

import collections
import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

from trtattn.graph.feeds import make_feeds
from trtattn.match import logit_ops, match
from trtattn.rewrite.fuse import fuse_model
from trtattn.site import MaskStep
from trtattn.testing.graphs import attention_model, control_flow_model, luong_model, two_attentions


def fuse_one(**kwargs):
    model = attention_model(**kwargs)
    result = fuse_model(model)
    assert len(result.reports) == 1, [r.row() for r in result.reports]
    report = result.reports[0]
    assert report.status == "fused", report.reason
    assert result.ok and result.verification.max_abs_err <= 1e-4
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
@pytest.mark.parametrize("extra,reason", [("classifier", "a classifier head or a router"), ("reduction", "not a product with V")])
def test_non_attention_softmax_is_left_alone(extra, reason):
    model = attention_model(extra_softmax=extra)
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused"] and result.ok
    assert any(reason in i.reason for i in result.ignored)
    softmaxes = [n for n in result.model.graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == 1 and not softmaxes[0].name.startswith("attn")
    original = next(n for n in model.graph.node if n.name == softmaxes[0].name)
    assert original.input == softmaxes[0].input and original.output == softmaxes[0].output


def test_probabilities_as_graph_output_are_the_fused_ops_own_output():
    """output_attentions: the probabilities leave the model; the site records them (never silently dropped) and the
    fused op returns them itself, as its qk_matmul_output in mode 3 (issue 25)."""
    model = attention_model(extra_softmax="probs_output")
    result = match(model)
    (site,) = result.sites
    assert not result.skipped and not result.ignored
    assert site.qk_output == model.graph.output[1].name and site.qk_mode == 3
    fused = fuse_model(model)
    assert fused.ok and [n.op_type for n in fused.model.graph.node].count("Attention") == 1


def test_wrong_fill_is_not_a_mask():
    """Where(mask, scores, 0) zeroes logits instead of masking them: not fusable, and said so."""
    model = attention_model(mask_style="bool_where")
    for init in model.graph.initializer:
        if init.dims == [] and np.isinf(onnx.numpy_helper.to_array(init)).all():
            init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(0.0, np.float32), init.name))
    result = match(model)
    assert not result.sites and "not a large negative value" in result.skipped[0].reason


# ------------------------------------------------------------------ issue 10's classes, hand-built
def _attention_ops(model):
    return [n for n in model.graph.node if n.op_type == "Attention"]


def _attr(node, name):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


@pytest.mark.parametrize("kwargs", [{"products": "einsum"}, {"products": "einsum", "rank": 3},
                                    {"softmax_style": "flatten"}, {"softmax_style": "merged"},
                                    {"softmax_style": "merged", "mask_style": "additive_input"},
                                    {"shape_reader": True}, {"k_style": "bsnh", "products": "einsum"}])
def test_through_layout_ops(kwargs):
    """Einsum products, 3-D heads-in-batch products, the opset-12 Flatten -> Softmax -> Reshape, heads merged
    around the softmax, a Shape reader of the probabilities: one site, fused with its 4 heads (fuse_one:
    verified, no Softmax left)."""
    report, _ = fuse_one(**kwargs)
    assert report.site.q_heads == 4 and report.site.head_size == 8


def test_layout_frames_of_a_3d_export():
    """What the axis tracking says of [B*N, S, H] products: Q read from the 4-D tensor before the merge,
    where batch and heads are apart; the output handed back as [B*N, S, H]."""
    lay = match(attention_model(rank=3)).sites[0].layout
    assert lay.q == (lay.batch, lay.heads, ("q",), ("d",)) and len(lay.heads) == 1
    assert lay.out == (lay.batch + lay.heads, ("q",), ("e",))


def test_softcap_lowers_to_the_attribute():
    report, result = fuse_one(softcap=2.0, mask_style="causal_range")
    assert report.site.softcap == 2.0
    assert _attr(_attention_ops(result.model)[0], "softcap") == pytest.approx(2.0)
    assert "soft-cap" in logit_ops.unit(MaskStep("softcap")).iattention_why


def test_softcap_after_a_mask_is_listed():
    """Attention caps before the mask; a model that caps after it computes something else."""
    model = attention_model(mask_style="additive_input")
    g = gs.import_onnx(model)
    add = next(n for n in g.nodes if n.op == "Add" and n.outputs[0].outputs[0].op == "Softmax")
    x = add.outputs[0]
    cap = gs.Constant("cap", np.asarray(3.0, np.float32))
    t1, t2, t3 = (gs.Variable(f"cap_{i}") for i in range(3))
    sm = x.outputs[0]
    g.nodes += [gs.Node("Div", inputs=[x, cap], outputs=[t1]), gs.Node("Tanh", inputs=[t1], outputs=[t2]),
                gs.Node("Mul", inputs=[t2, cap], outputs=[t3])]
    sm.inputs[0] = t3
    result = match(gs.export_onnx(g))
    assert not result.sites and "after a mask" in result.skipped[0].reason


@pytest.mark.parametrize("style", ["alibi", "c2p"])
def test_position_biases_computed_in_the_graph(style):
    """ALiBi from Range ops, DeBERTa's c2p term (Q times weights-only position keys): biases in attn_mask."""
    report, result = fuse_one(mask_style=style)
    assert report.bias and report.site.mask.value == "additive"
    assert len(_attention_ops(result.model)[0].input) == 4


def test_qdq_on_q_k_v_stays_outside_and_is_recorded():
    report, result = fuse_one(qdq="qkv")
    q = report.site.quant
    assert q.query.dtype == "int8" and q.query.scale == pytest.approx(0.05) and q.logits is None
    attention = _attention_ops(result.model)[0]
    producers = {o: n for n in result.model.graph.node for o in n.output}
    assert all(producers[i].op_type in ("DequantizeLinear", "Transpose") for i in attention.input[:3])


def test_quantized_logits_are_listed_with_why():
    model = attention_model(qdq="logits")
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["not fused"] and not result.ok
    assert "logits are quantized" in result.reports[0].reason


@pytest.mark.parametrize("fill", [float("-inf"), float(np.finfo(np.float32).min)])
def test_single_query_true_at_padding(fill):
    """Luong's decoder step: one query, no scale, masked_fill where the mask is True (padding)."""
    model = luong_model(fill=fill)
    result = fuse_model(model)
    assert result.ok and [r.status for r in result.reports] == ["fused"], [r.reason for r in result.reports]
    report = result.reports[0]
    assert report.site.scale == 1.0 and report.site.mask.value == "boolean" and report.padding


def test_fully_masked_row_keeps_the_models_answer():
    """The cause of the single-query failure (and of the fuzzer's wrong-written value_mask cases): a
    Where with a finite fill *replaces* the masked logits, so a row masked everywhere is the mean of V;
    ONNX Runtime's Attention gives 0 there for a boolean mask. The fill lowers to an additive bias far
    below any logit, which keeps the mean; with verification inputs that never mask a whole row this
    went unseen."""
    model = luong_model(fill=float(np.finfo(np.float32).min))
    fused = fuse_model(model).model
    feeds = make_feeds(model)
    feeds["src_key_padding_mask"][0, :] = True  # the first row masked everywhere
    a, b = (ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0] for m in (model, fused))
    assert np.abs(a - b).max() < 1e-5


@pytest.mark.parametrize("kind,sites", [("if", 2), ("loop", 1)])
def test_attention_in_control_flow(kind, sites):
    result = fuse_model(control_flow_model(kind))
    assert result.ok and [r.status for r in result.reports] == ["fused"] * sites
    assert all(r.site.graph for r in result.reports)
    body_ops = [n.op_type for top in result.model.graph.node for a in top.attribute
                if a.type == onnx.AttributeProto.GRAPH for n in a.g.node]
    assert body_ops.count("Attention") == sites and "Softmax" not in body_ops


def test_attention_like_softmax_is_never_ignored():
    """A Softmax between a product of two activations and a product with a third is attention-like: listed
    as not fused when it cannot be fused (here its logits are quantized, which no fused op computes)."""
    result = fuse_model(attention_model(qdq="logits"))
    assert not result.ignored and [r.status for r in result.reports] == ["not fused"] and not result.ok


# ------------------------------------------------------------------ the command line: never silent
def _cli(*args):
    import contextlib
    import io

    from trtattn.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["-q", *map(str, args)])
    return code, out.getvalue()


def test_fuse_exits_nonzero_on_a_listed_attention_unless_allow_partial(tmp_path):
    """One attention fuses, the other cannot (its logits are quantized): exit 1, nothing written,
    the summary counts both; with --allow-partial the fused one is written, verified, exit 0."""
    src = tmp_path / "two.onnx"
    onnx.save(two_attentions(second={"qdq": "logits"}), str(src))
    code, text = _cli("fuse", src, "-o", tmp_path / "out.onnx")
    assert code == 1 and not (tmp_path / "out.onnx").exists()
    assert "2 attention-like softmaxes: 1 fused, 1 not fused" in text and "not fused" in text
    code, text = _cli("fuse", src, "-o", tmp_path / "partial.onnx", "--allow-partial", "--report", tmp_path / "r.json")
    assert code == 0 and (tmp_path / "partial.onnx").exists()
    written = onnx.load(str(tmp_path / "partial.onnx"))
    assert [n.op_type for n in written.graph.node].count("Attention") == 1
    counts = json.loads((tmp_path / "r.json").read_text())["counts"]
    assert counts["fused"] == 1 and counts["not_fused"] == 1 and counts["softmaxes"] == 2


def test_no_attention_found_only_when_there_is_none(tmp_path):
    model = attention_model(extra_softmax="classifier")
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    code, text = _cli("fuse", src, "-o", tmp_path / "out.onnx")
    assert code == 0 and "1 attention-like softmax: 1 fused, 0 not fused (1 other softmax: not attention)" in text


def test_an_output_off_with_every_site_within_its_bound_keeps_the_original(monkeypatch):
    """Each site within its bound but a model output not (fp16 over many layers, say): fuse keeps the original
    and says so on every site, naming the output; build stops there with the same words."""
    from trtattn.errors import TrtattnError
    from trtattn.rewrite import fuse as fuse_module
    from trtattn.routes import prepare as prepare_mod

    real = fuse_module.compare_models

    def output_off(*args, **kwargs):
        outcome = real(*args, **kwargs)
        name = next(iter(outcome.output_errors))
        outcome.output_errors[name] = 10 * outcome.bounds[name]
        outcome.passed = False
        return outcome

    monkeypatch.setattr(fuse_module, "compare_models", output_off)
    model = two_attentions()
    out = model.graph.output[0].name
    result = fuse_model(model)
    assert not result.ok and result.model is model and result.reports
    assert all(r.status != "fused" and f"output '{out}' is off by" in r.reason and "original is kept" in r.reason
               for r in result.reports), [r.reason for r in result.reports]
    with pytest.raises(TrtattnError, match=f"output '{out}' is off by"):
        prepare_mod.all_fused(result)
