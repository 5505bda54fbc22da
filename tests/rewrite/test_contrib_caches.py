"""Linked inputs and ONNX Runtime's contrib attention ops with caches (issue 26, parts 1 and 2).

Integer inputs an op reads as lengths (GroupQueryAttention's seqlens_k and total_sequence_length) get the
values the other inputs' dims make them (graph/roles.py LINKED_LENGTHS), so the dims search has a model
that runs; position_ids [1, S] broadcast over the batch makes it try batch 1 first; `--inputs` fixes every
dim it covers (nothing searched). MultiHeadAttention, Attention and GroupQueryAttention with past/present
become the standard Attention op with past_key/past_value and present outputs, verified on ONNX Runtime."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tests.conftest import ort_run
from trtattn.graph.dims import fit_dims
from trtattn.graph.feeds import make_feeds
from trtattn.graph.roles import input_specs
from trtattn.graph.user_inputs import GivenInputs
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.contrib_graphs import cache_model, group_query_feeds, group_query_model


def _ops(model):
    return collections.Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


# ---------------------------------------------------------------- linked inputs
def test_group_query_lengths_are_linked_to_the_dims():
    roles = {s.name: s.role for s in input_specs(group_query_model())}
    assert roles["total_sequence_length"] == {"kind": "length", "of": ["s", "past"], "add": 0}
    assert roles["seqlens_k"] == {"kind": "length", "of": ["s", "past"], "add": -1}
    feeds = make_feeds(group_query_model(), dims={"b": 1, "s": 3, "past": 5})
    assert feeds["total_sequence_length"].item() == 8 and feeds["seqlens_k"].tolist() == [7]
    ort_run(group_query_model(), feeds)  # ONNX Runtime takes them


def test_lengths_through_casts_follow_the_token_ids_sequence():
    """The query is computed from token ids: the new tokens are the token ids' sequence dim, whatever its name,
    so --dims on it keeps the lengths consistent."""
    from trtattn.testing.contrib_graphs import group_query_decoder

    model = group_query_decoder()
    roles = {s.name: s.role for s in input_specs(model)}
    assert roles["seqlens_k"]["of"] == roles["total_sequence_length"]["of"] == ["sequence_length",
                                                                                "past_sequence_length"]
    result = fuse_model(model, dims={"sequence_length": 1, "past_sequence_length": 5, "batch": 3})
    assert result.ok, [r.row() for r in result.reports]
    assert result.verification.inputs.domains["total_sequence_length"] == "sequence_length + past_sequence_length"


def test_dims_search_with_rotary_positions_broadcast_over_the_batch():
    """RotaryEmbedding takes position_ids [1, S] per row (batch 1 only) and GroupQueryAttention its lengths:
    batch 1 is read from the positions' one row before any search (graph/op_dims.py; was: found by the search's
    second run) and the feeds at those dims run."""
    model = group_query_model(rotary=True)
    fit = fit_dims(model)
    assert fit["b"] == 1 and fit.runs == 1, fit.reasons  # the first run fits: no search
    assert "RotaryEmbedding" in fit.reasons[0] and "position_ids" in fit.reasons[0]
    ort_run(model, make_feeds(model, dims=fit))


def test_given_inputs_fix_the_dims_without_a_search(tmp_path):
    model = group_query_model(rotary=True)
    feeds = group_query_feeds(1, 3, 5)
    feeds["position_ids"] = np.arange(5, 8, dtype=np.int64)[None]
    np.savez(tmp_path / "in.npz", **feeds)
    given = GivenInputs.load(tmp_path / "in.npz", model)
    fit = fit_dims(model, {"s": 4}, given=given)
    assert (fit["b"], fit["s"], fit["past"]) == (1, 3, 5)
    assert "from the inputs given" in fit.reasons[0] and "--dims s=4 set aside" in fit.reasons[1]
    assert fit.runs == 1  # the user's inputs, once
    result = fuse_model(model, inputs=given)
    assert result.ok, [r.row() for r in result.reports]
    assert result.verification.inputs.source == "file" and result.dims["values"]["s"] == 3


def test_given_inputs_the_model_does_not_run_on_are_one_line(tmp_path):
    from trtattn.graph.dims import DimsDoNotFit

    model = group_query_model()
    feeds = group_query_feeds(2, 3, 5)  # batch 2 with a past and more than one new token: the kernel refuses
    np.savez(tmp_path / "in.npz", **feeds)
    with pytest.raises(DimsDoNotFit, match=r"does not run on the inputs given \(--inputs .*in.npz\): "
                                           r"GroupQueryAttention node 'gqa' fails: batch_size must be 1"):
        fit_dims(model, given=GivenInputs.load(tmp_path / "in.npz", model))


# ---------------------------------------------------------------- contrib ops with caches
@pytest.mark.parametrize("op", ["MultiHeadAttention", "Attention"])
@pytest.mark.parametrize("unidirectional,mask", [(0, False), (1, False), (1, True)])
def test_contrib_attention_with_a_cache_becomes_attention_with_past_and_present(op, unidirectional, mask):
    model = cache_model(op, unidirectional=unidirectional, mask=mask)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    (report,) = result.reports
    assert report.site.cache.value == "concat" and report.site.kind.value == "self"
    assert report.site.causal.value == ("lower_right" if unidirectional else "none")
    assert _ops(result.model)["Attention"] == 1 and _ops(result.model)[f"com.microsoft:{op}"] == 0
    (attention,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert len(attention.input) == 6 and len(attention.output) == 3  # past in, present out
    # causal alone is the op's is_causal (bottom-right with a past); next to a mask, the kernel's filter value
    assert [a.i for a in attention.attribute if a.name == "is_causal"] == ([1] if unidirectional and not mask else [])
    assert set(result.verification.outputs) == {o.name for o in model.graph.output}  # the present is compared
    assert result.verification.max_abs_err <= 1e-5
    # at dims of its own: a past of 4, 3 new tokens (the causal mask is aligned to the bottom right)
    rng = np.random.default_rng(1)
    if op == "Attention":
        feeds = {"x": rng.standard_normal((2, 3, 16)), "past": rng.standard_normal((2, 2, 2, 4, 8))}
    else:
        feeds = {**{n: rng.standard_normal((2, 3, 16)) for n in "qkv"},
                 **{n: rng.standard_normal((2, 2, 4, 8)) for n in ("past_key", "past_value")}}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    if mask:  # row 1 padded at the front of its past: the mask spans past + new keys
        feeds["mask"] = np.ones((2, 7), np.int32)
        feeds["mask"][1, :2] = 0
    for want, got in zip(ort_run(model, feeds), ort_run(result.model, feeds)):
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])  # Q, K and V in one input, split before the op
@pytest.mark.parametrize("rows,new,past,seqlens", [(2, 1, 4, None), (1, 3, 4, None), (2, 5, 0, None),
                                                    (3, 5, 0, [4, 2, 0])])  # a first prompt right-padded
def test_group_query_attention_becomes_attention_with_past_and_present(rows, new, past, seqlens, packed):
    model = group_query_model(packed=packed)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    site = result.reports[0].site
    assert (site.q_heads, site.kv_heads, site.head_size, site.scale) == (4, 2, 8, pytest.approx(8 ** -0.5))
    assert _ops(result.model)["Attention"] == 1 and _ops(result.model)["com.microsoft:GroupQueryAttention"] == 0
    (attention,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert attention.input[4:] == ["past_key", "past_value"] and list(attention.output[1:]) == ["present_key",
                                                                                                 "present_value"]
    assert [a.i for a in attention.attribute if a.name == "is_causal"] == [1]  # causal + a padding mask
    feeds = group_query_feeds(rows, new, past, seqlens, packed=packed)
    for want, got in zip(ort_run(model, feeds), ort_run(result.model, feeds)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_group_query_attention_ragged_past_keeps_the_outputs_and_says_the_present_differs():
    """A row whose past is shorter than past_key: the standard op's present is Concat(past, new), ONNX
    Runtime's writes the new keys after the row's own past; the attention output is the same."""
    model = group_query_model()
    result = fuse_model(model)
    assert any("present = Concat(past, new)" in n for n in result.reports[0].site.notes)
    feeds = group_query_feeds(3, 1, 4, seqlens=[4, 2, 3])
    want, got = ort_run(model, feeds), ort_run(result.model, feeds)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    assert not np.allclose(got[1], want[1])


def test_group_query_attention_softcap_becomes_the_standard_ops_softcap():
    """Both cap the logits before the mask: the same outputs, and not those without the cap."""
    from onnx import helper

    model = group_query_model()
    model.graph.node[0].attribute.append(helper.make_attribute("softcap", 2.0))
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    (attention,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert [a.f for a in attention.attribute if a.name == "softcap"] == [2.0]
    feeds = group_query_feeds(3, 5, 0, seqlens=[4, 2, 0])
    feeds["query"] *= 3
    want, got = ort_run(model, feeds), ort_run(result.model, feeds)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    assert not np.allclose(ort_run(group_query_model(), feeds)[0], want[0], atol=1e-2)


@pytest.mark.parametrize("window", [1, 3])
def test_group_query_attention_sliding_window_is_part_of_the_mask(window):
    """local_window_size w: each query sees the last w keys up to its own, as ONNX Runtime's kernel does, on
    a first prompt, a padded one, a chunk after a past and a ragged decode step."""
    from onnx import helper

    model = group_query_model()
    model.graph.node[0].attribute.append(helper.make_attribute("local_window_size", window))
    result = fuse_model(model)
    assert result.ok and result.reports[0].site.window == window, [r.row() for r in result.reports]
    for case in [(2, 5, 0, None), (3, 5, 0, [4, 2, 0]), (1, 3, 4, None), (3, 1, 4, [4, 2, 3])]:
        feeds = group_query_feeds(*case)
        want, got = ort_run(model, feeds), ort_run(result.model, feeds)
        np.testing.assert_allclose(got[0], want[0], atol=1e-5, err_msg=str(case))
        assert not np.allclose(ort_run(group_query_model(), feeds)[0], want[0], atol=1e-3)  # the window matters


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("head,rotary", [(16, 16), (32, 16)])  # the whole head, or half of it
def test_group_query_attention_rotary_inside_becomes_rotary_embedding(head, rotary, interleaved):
    """do_rotary: the standard RotaryEmbedding on the new Q and K at the positions the kernel gives them (the
    row's past length + i), with the op's own tables; the same outputs as the kernel's."""
    from onnx import helper

    from trtattn.testing.contrib_graphs import rotary_tables

    model = group_query_model(head=head)  # the kernel's rotary takes head sizes that are multiples of 16
    model.graph.node[0].attribute.extend([helper.make_attribute("do_rotary", 1),
                                          helper.make_attribute("rotary_interleaved", interleaved)])
    model.graph.node[0].input.extend(["cos_cache", "sin_cache"])
    model.graph.initializer.extend(rotary_tables(rotary))
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    rope = result.reports[0].site.rope
    assert rope is not None and (rope.rotary_dim, rope.interleaved) == (rotary, bool(interleaved))
    assert _ops(result.model)["RotaryEmbedding"] == 2
    rng = np.random.default_rng(0)
    for rows, new, past, seqlens in [(3, 5, 0, [4, 2, 0]), (1, 3, 4, None), (3, 1, 4, [4, 2, 3])]:
        feeds = {"query": rng.standard_normal((rows, new, 4 * head)), "key": rng.standard_normal((rows, new, 2 * head)),
                 "value": rng.standard_normal((rows, new, 2 * head)),
                 "past_key": rng.standard_normal((rows, 2, past, head)),
                 "past_value": rng.standard_normal((rows, 2, past, head))}
        feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
        feeds["seqlens_k"] = np.asarray(seqlens or [past + new - 1] * rows, np.int32)
        feeds["total_sequence_length"] = np.array(past + new, np.int32)
        np.testing.assert_allclose(ort_run(result.model, feeds)[0], ort_run(model, feeds)[0], atol=1e-5)


@pytest.mark.parametrize("bias_shape", [["b", 1, "s", "past+s"], [1, 4, "s", "past+s"]])
def test_group_query_attention_bias_is_read_at_the_kernels_columns(bias_shape):
    """attention_bias columns follow the kernel's compacted present (a new key n at the row's past + n), so a
    ragged decode step gives the kernel's outputs too."""
    from onnx import TensorProto, helper

    model = group_query_model()
    model.graph.node[0].input.extend(["", "", "", "bias"])
    model.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, bias_shape))
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    rng = np.random.default_rng(0)
    for rows, new, past, seqlens in [(3, 5, 0, [4, 2, 0]), (1, 3, 4, None), (3, 1, 4, [4, 2, 3])]:
        feeds = group_query_feeds(rows, new, past, seqlens)
        feeds["bias"] = rng.standard_normal([rows if d == "b" else new if d == "s" else past + new if d == "past+s"
                                             else d for d in bias_shape]).astype(np.float32)
        np.testing.assert_allclose(ort_run(result.model, feeds)[0], ort_run(model, feeds)[0], atol=1e-5)


def test_group_query_attention_bias_is_reported_as_an_additive_mask():
    """attention_bias (input 10) is the site's mask, additive, and the report says it is a bias (not probed: its
    columns are the kernel's compacted present, not the logits')."""
    from onnx import TensorProto, helper

    from trtattn.match import match

    model = group_query_model()
    model.graph.node[0].input.extend(["", "", "", "bias"])
    model.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["b", 1, "s", "past+s"]))
    (site,) = match(model).sites
    assert (site.mask.value, site.padding, [s.operand for s in site.mask_steps]) == ("additive", False, ["bias"])
    (row,) = [r.row() for r in fuse_model(model).reports]
    assert (row["mask"], row["bias"], row["padding"], row["status"]) == ("additive", True, False, "fused")
    (plain,) = match(group_query_model()).sites
    assert plain.mask.value == "none" and not plain.mask_steps


def test_contrib_mask_inputs_are_where_onnx_runtime_declares_them():
    """The inputs each contrib attention op takes its padding mask and attention_bias at, against ONNX Runtime's
    own schemas: every op with an attention_bias input is read, at that input."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    from trtattn.match.fused_ops import ATTENTION_BIAS, MICROSOFT_OPS, PADDING_MASK

    schemas = {s.name: [i.name for i in s.inputs] for s in get_all_operator_schema()
               if s.domain == "com.microsoft" and s.name in MICROSOFT_OPS}
    assert len(schemas) >= 10
    for op, names in schemas.items():
        assert ATTENTION_BIAS.get(op) == (names.index("attention_bias") if "attention_bias" in names else None), op
        padding = [i for i, n in enumerate(names) if n in ("mask_index", "key_padding_mask", "mask")]
        assert ([PADDING_MASK[op]] if op in PADDING_MASK else []) == padding, op


def test_group_query_attention_it_cannot_convert_is_listed_with_why():
    from onnx import helper

    model = group_query_model()
    model.graph.node[0].attribute.append(helper.make_attribute("smooth_softmax", 1))
    result = fuse_model(model)
    assert not result.ok and "smooth softmax" in result.reports[0].reason


def test_group_query_attention_with_a_window_buffer_cache_is_fused_at_its_window():
    """sliding_window_cache=1 (GenAI's Gemma 2 sliding layer): the dims search feeds the W-slot buffer the op keeps
    and verifies the fused W-slot present (rewrite/window_cache.py; tests/rewrite/test_window_cache.py)."""
    model = group_query_model(local_window_size=4, sliding_window_cache=1)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert result.dims["values"]["past"] == 4 and _ops(result.model)["GatherElements"] == 2


def test_multi_head_attention_with_keys_and_values_in_heads_is_a_static_cross_attention_cache():
    """K/V [B, N, T, H] (a cross-attention's cache, computed once) go to the standard op as they are, with a
    key padding mask; with a bias on them the site is listed with why."""
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", "s", 16]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, ["b", 2, "t", 8]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, ["b", 2, "t", 8]),
              helper.make_tensor_value_info("mask", TensorProto.INT32, ["b", "t"])]
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "mask"], ["y"], domain="com.microsoft",
                            num_heads=2, name="mha")
    graph = helper.make_graph([node], "cross", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert result.reports[0].site.cache.value == "cross_static"
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((2, 3, 16)), "k": rng.standard_normal((2, 2, 5, 8)),
             "v": rng.standard_normal((2, 2, 5, 8))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    feeds["mask"] = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    np.testing.assert_allclose(ort_run(result.model, feeds)[0], ort_run(model, feeds)[0], atol=1e-5)
    model.graph.node[0].input[3] = "bias"
    model.graph.initializer.append(helper.make_tensor("bias", TensorProto.FLOAT, [48], np.zeros(48, np.float32)))
    listed = fuse_model(model)
    assert not listed.ok and "BNSH with a bias" in listed.reports[0].reason


# ---------------------------------------------------------------- the TensorRT route (issues 25 and 26 meet)
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_multi_head_attention_with_a_cache_becomes_iattention_with_the_kv_cache_update(unidirectional):
    """No --form: the converted op's past takes the kv-cache form (TRT_KVCacheUpdate in place, per-row lengths),
    verified through trtattn_plugins on ONNX Runtime against the contrib model itself, present included."""
    from trtattn.routes.trt_ops import fuse_trt

    result = fuse_trt(cache_model("MultiHeadAttention", unidirectional=unidirectional), name="mha")
    assert result.ok, result.verification
    plan = result.prepared.plan
    assert plan.form == "kv-cache" and plan.aliases == {"present_key": "past_key", "present_value": "past_value"}
    assert sorted(n.op_type for n in result.model.graph.node if n.domain == "trt") == [
        "TRT_Attention", "TRT_KVCacheUpdate", "TRT_KVCacheUpdate"]
    (site,) = plan.attentions
    assert site.causal == ("lower_right" if unidirectional else "none") and site.kv_lengths
    assert {"y", "present_key", "present_value"} <= set(result.verification.outputs)  # (+ the caches' free slots)
    assert result.verification.passed and result.verification.max_abs_err < 1e-2  # fp16 attention


@pytest.mark.parametrize("command", ["fuse", "build"])
@pytest.mark.parametrize("op,kwargs,why", [
    ("Attention", {}, "stacks key and value in one past"),
    ("MultiHeadAttention", {"mask": True}, "the causal part is a mask placed by the past's length"),
    ("GroupQueryAttention", {"local_window_size": 2}, "its sliding window or attention_bias is a mask placed"),
    ("GroupQueryAttention", {"bias": ["b", 1, "s", "past+s"]}, "its sliding window or attention_bias is a mask placed"),
])
def test_contrib_caches_the_kv_cache_form_cannot_take_are_listed_with_why(tmp_path, capsys, command, op, kwargs, why):
    """Exit 1 with the site named and the reason (was: exit 2, an error naming a Shape node)."""
    import onnx

    from trtattn.cli import main

    if op == "GroupQueryAttention":
        model = group_query_model()
        if "bias" in kwargs:  # attention_bias (input 10): the probes may read it as no mask; the form must not drop it
            model.graph.node[0].input.extend(["", "", "", "bias"])
            model.graph.input.append(onnx.helper.make_tensor_value_info("bias", onnx.TensorProto.FLOAT, kwargs["bias"]))
        else:
            model.graph.node[0].attribute.extend(onnx.helper.make_attribute(k, v) for k, v in kwargs.items())
    else:
        model = cache_model(op, unidirectional=1, **kwargs)
    path = tmp_path / "contrib.onnx"
    onnx.save(model, path)
    args = ["fuse", str(path), "-o", str(tmp_path / "out.onnx"), "--ops", "trt"] if command == "fuse" else \
        ["build", str(path), "--out-dir", str(tmp_path / "engines")]
    assert main(["-q", *args]) == 1
    out = capsys.readouterr().out
    assert "cannot be TensorRT's attention ops" in out and why in out and "not written" in out
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("packed", [False, True])
def test_group_query_attention_with_a_cache_becomes_iattention_writing_at_each_rows_past(packed):
    """The kv-cache form of GroupQueryAttention is ONNX Runtime's kernel, ragged pasts too (which the standard op
    in between cannot say: its present is Concat(past, new)): TRT_KVCacheUpdate writes each row's new keys at
    its own past length (cache_write_index), IAttention reads that row's write index + new keys, causal from its
    past. Verified against the contrib model by fuse; here also on a ragged decode step, outputs and presents."""
    from trtattn.routes.trt_ops import fuse_trt
    from trtattn_plugins import Session

    model = group_query_model(packed=packed)
    result = fuse_trt(model, name="gqa")
    assert result.ok, result.verification
    assert sorted(n.op_type for n in result.model.graph.node if n.domain == "trt") == [
        "TRT_Attention", "TRT_KVCacheUpdate", "TRT_KVCacheUpdate"]
    (site,) = result.prepared.plan.attentions
    assert site.causal == "lower_right" and site.kv_lengths and not site.mask
    pasts = [4, 2, 3]  # each row's own past, the rest of past_key unused
    feeds = group_query_feeds(3, 1, 4, seqlens=pasts, packed=packed)  # seqlens_k: past + 1 new - 1
    want = dict(zip(["y", "present_key", "present_value"], ort_run(model, feeds)))
    (past_input,) = [i for i in result.model.graph.input if i.name == "past_key"]
    capacity = past_input.type.tensor_type.shape.dim[2].dim_value  # the engine's static capacity
    form_feeds = {**feeds, "cache_write_index": np.asarray(pasts, np.int64)}
    for name in ("past_key", "past_value"):
        cache = np.zeros((3, 2, capacity, 8), np.float16)
        cache[:, :, :4] = feeds[name]
        form_feeds[name] = cache
    names = [o.name for o in result.model.graph.output]
    got = dict(zip(names, Session(result.model).run(None, form_feeds)))
    np.testing.assert_allclose(got["y"], want["y"], atol=1e-2)
    for name in ("present_key", "present_value"):  # each row: its own past, then its new key
        for row, p in enumerate(pasts):
            np.testing.assert_allclose(got[name][row, :, :p + 1], want[name][row, :, :p + 1], atol=1e-2)


def test_contrib_rotary_before_group_query_attention_becomes_the_standard_op_on_the_tensorrt_route():
    """com.microsoft RotaryEmbedding on Q and K (position_ids [1, S]) as the standard op, which TensorRT lowers to
    its rotary layer and AutoCast takes (was: AutoCast refused the contrib op, exit 2); verified at fp16."""
    from trtattn.routes.trt_ops import fuse_trt

    result = fuse_trt(group_query_model(rotary=True), name="gqa")
    assert result.ok, result.verification
    ropes = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(ropes) == 2 and {n.domain for n in ropes} == {""}
    assert not [n for n in result.model.graph.node if n.domain == "com.microsoft"]
    # over 3-D [B, S, N*H] inputs (num_heads set): IRotaryEmbeddingLayer reads 3-D as packed [T, N, H], so
    # the plan splits the heads around the rotary layer (tests/trt/test_lower.py runs it against ONNX Runtime)
    assert all(next(a.i for a in n.attribute if a.name == "num_heads") > 0 for n in ropes)
    assert sorted(r.num_heads for r in result.prepared.plan.ropes) == [2, 4]
    assert result.prepared.plan.form == "kv-cache"
