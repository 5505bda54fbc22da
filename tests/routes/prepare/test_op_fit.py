"""Hand-built one-node Attention models, one per configuration class IAttention does not take as it is
(issue 25, part B): each through `fuse --ops trt` converts and verifies, with the rewrite that fits it to
IAttention (routes/prepare/op_fit.py, op_cache.py, qk_beside.py), or names the limit with exit 1."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtattn.cli import main
from trtattn.routes.trt_ops import fuse_trt, runnable

F = TensorProto.FLOAT


def attention(*, q=(2, 4, 5, 8), k=(2, 2, 5, 8), v=None, mask=None, past=None, nonpad=False, opset=24,
              outputs=("Y",), **attrs) -> onnx.ModelProto:
    """Attention(Q, K, V, [mask], [past_key, past_value], [nonpad_kv_seqlen]) with these shapes; mask is
    (shape, elem type); past is the past length (4-D caches [B, Nkv, past, H])."""
    v = v or k
    inputs = [helper.make_tensor_value_info(n, F, s) for n, s in (("Q", q), ("K", k), ("V", v))]
    names = ["Q", "K", "V"]
    if mask is not None:
        inputs.append(helper.make_tensor_value_info("attn_mask", mask[1], mask[0]))
    names.append("attn_mask" if mask is not None else "")
    if past is not None:
        nkv = k[1] if len(k) == 4 else attrs["kv_num_heads"]
        hk = k[3] if len(k) == 4 else k[2] // nkv
        hv = v[3] if len(v) == 4 else v[2] // nkv
        inputs += [helper.make_tensor_value_info("past_key", F, [k[0], nkv, past, hk]),
                   helper.make_tensor_value_info("past_value", F, [k[0], nkv, past, hv])]
        names += ["past_key", "past_value"]
    if nonpad:
        names += [""] * (6 - len(names)) + ["nonpad_kv_seqlen"]
        inputs.append(helper.make_tensor_value_info("nonpad_kv_seqlen", TensorProto.INT64, [q[0]]))
    node = helper.make_node("Attention", names, list(outputs), **attrs)
    outs = [helper.make_tensor_value_info(o, F, None) for o in outputs if o]
    graph = helper.make_graph([node], "attention", inputs, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # the outputs' shapes, as an exporter writes
    ort.InferenceSession(model.SerializeToString())  # every model a test writes loads in ONNX Runtime
    return model


def converted(model, **kwargs):
    result = fuse_trt(model, name="t", **kwargs)
    assert result.ok, result.verification
    ops = [n.op_type for n in result.model.graph.node if n.domain == "trt"]
    return result, ops


def test_v_head_size_unlike_qk_is_zero_padded():
    """4-D and 3-D: V's head 6 padded to Q/K's 8 (and Q/K padded up when V's is larger), output sliced back."""
    for model in (attention(v=(2, 2, 5, 6), opset=23), attention(q=(2, 5, 32), k=(2, 5, 16), v=(2, 5, 24), opset=23,
                                                                  q_num_heads=4, kv_num_heads=2)):
        result, ops = converted(model)
        assert ops == ["TRT_Attention"] and any(n.op_type == "Pad" for n in result.model.graph.node)
        assert any("zero-padded" in note for note in result.prepared.plan.notes)


def test_causal_with_a_mask_and_windows_become_one_mask():
    for model in (attention(mask=([5, 5], TensorProto.BOOL), is_causal=1, opset=23),
                  attention(mask=([2, 1, 5, 5], F), is_causal=1, opset=23),
                  attention(opset=25, is_causal=1, left_window_size=2),
                  attention(opset=25, left_window_size=1, right_window_size=2)):
        result, _ = converted(model)
        (site,) = result.prepared.plan.attentions
        assert site.causal == "none" and site.mask, site
        assert any("as one mask" in note for note in result.prepared.plan.notes)


def test_nonpad_kv_seqlen_is_iattentions_lengths_lower_right():
    result, _ = converted(attention(q=(2, 4, 1, 8), k=(2, 2, 7, 8), nonpad=True, is_causal=1))
    (site,) = result.prepared.plan.attentions
    assert (site.causal, site.kv_lengths, site.mask) == ("lower_right", "nonpad_kv_seqlen", None)


def test_rows_with_no_key_give_zeros_as_onnx_defines():
    """A row length 0 (and causal rows before the row's first key): ONNX gives zeros, TensorRT nothing defined."""
    model = attention(q=(2, 4, 3, 8), k=(2, 2, 6, 8), nonpad=True, is_causal=1)
    result, _ = converted(model)
    from trtattn_plugins.session import Session

    rng = np.random.default_rng(0)
    feeds = {"Q": rng.standard_normal((2, 4, 3, 8), np.float32), "K": rng.standard_normal((2, 2, 6, 8), np.float32),
             "V": rng.standard_normal((2, 2, 6, 8), np.float32), "nonpad_kv_seqlen": np.array([0, 2])}
    with pytest.warns(UserWarning, match="attend to no key"):
        (got,) = Session(runnable(result)).run(["Y"], feeds)
    (want,) = ort.InferenceSession(model.SerializeToString()).run(["Y"], feeds)
    assert not np.isnan(got).any() and np.abs(got - want).max() < 3e-2
    assert (got[0] == 0).all() and (got[1, :, 0] == 0).all()  # row 0 has no key; row 1's first query sees none


@pytest.mark.parametrize("causal", [1, 0])
def test_past_inside_the_op_takes_the_kv_cache_form_without_a_flag(causal):
    """Causal self-attention over a cache, and not causal (prefix or cross-attention over a cache) stays so."""
    model = attention(past=3, outputs=("Y", "present_key", "present_value"), is_causal=causal, opset=23)
    result, ops = converted(model)
    plan = result.prepared.plan
    assert plan.form == "kv-cache" and any("chosen" in n for n in plan.notes)
    assert sorted(ops) == ["TRT_Attention", "TRT_KVCacheUpdate", "TRT_KVCacheUpdate"]
    (site,) = plan.attentions
    assert site.causal == ("lower_right" if causal else "none") and site.kv_lengths and not site.mask
    assert plan.aliases == {"present_key": "past_key", "present_value": "past_value"}


def test_past_with_query_and_new_keys_of_different_lengths_keeps_onnxs_causal_offset():
    """ONNX's causal offset over a past is the past length; where Q and the new K/V may differ in length that is
    not IAttention's lower-right over the row's keys, so it is written as a mask."""
    model = attention(q=(2, 4, 3, 8), k=(2, 2, 2, 8), past=4, outputs=("Y", "present_key", "present_value"),
                      is_causal=1, opset=23)
    result, _ = converted(model)
    (site,) = result.prepared.plan.attentions
    assert site.causal == "none" and site.mask and site.kv_lengths


def test_3d_past_with_a_mask_and_gqa():
    model = attention(q=(2, 5, 32), k=(2, 5, 16), mask=([5, 8], F), past=3, outputs=("Y", "present_key",
                      "present_value"), q_num_heads=4, kv_num_heads=2, opset=23)
    result, ops = converted(model)
    assert result.prepared.plan.form == "kv-cache" and ops.count("TRT_KVCacheUpdate") == 2


@pytest.mark.parametrize("mode,shapes", [
    (0, {"mask": ([5, 5], F)}),
    (1, {"mask": ([2, 1, 5, 5], F), "is_causal": 1}),
    (3, {"mask": ([5, 5], TensorProto.BOOL)}),
    (3, {"q": (2, 5, 32), "k": (2, 5, 16), "mask": ([5, 5], F), "q_num_heads": 4, "kv_num_heads": 2}),
])
def test_qk_output_is_computed_beside_iattention(mode, shapes):
    """qk_matmul_output (the scaled logits, with the mask, or the softmax) from the op's own function body in
    standard ops beside TRT_Attention, which gives Y; both against the original on ONNX Runtime."""
    from trtattn_plugins.session import Session

    model = attention(opset=23, outputs=("Y", "", "", "qk"), qk_matmul_output_mode=mode, **shapes)
    result, ops = converted(model)
    assert ops == ["TRT_Attention"]
    written = result.model.graph
    assert not any(n.op_type == "Attention" for n in written.node) and "qk" in [o.name for o in written.output]
    assert any("qk_matmul_output qk (mode" in note for note in result.prepared.plan.notes)
    assert any(n.op_type == "Softmax" for n in written.node) == (mode == 3)
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    if "attn_mask" in feeds and shapes["mask"][1] == TensorProto.BOOL:
        feeds["attn_mask"] = feeds["attn_mask"] > -0.5
    got = Session(runnable(result)).run(["Y", "qk"], feeds)
    want = ort.InferenceSession(model.SerializeToString()).run(["Y", "qk"], feeds)
    for g, w in zip(got, want):  # an fp16 engine: within half precision of the fp32 original
        finite = np.isfinite(w)
        assert (np.isfinite(g) == finite).all() and np.abs(g - w)[finite].max() < 2e-2 * max(1, np.abs(w[finite]).max())


@pytest.mark.parametrize("mode", [1, 3])
def test_qk_output_over_a_past_cache_in_the_kv_cache_form(mode):
    """Over past + new keys, causal with a query shorter than its new keys: the form's own (fitted) node's body gives
    the logits over the cache's capacity, the original's in each row's first past + new columns."""
    from trtattn.contract import cache_inputs
    from trtattn.routes.prepare import form_adapter
    from trtattn_plugins.session import Session

    model = attention(q=(2, 4, 2, 8), k=(2, 2, 3, 8), past=4, mask=([2, 7], F), is_causal=1, opset=23,
                      outputs=("Y", "present_key", "present_value", "qk"), qk_matmul_output_mode=mode)
    result, ops = converted(model)
    assert result.prepared.plan.form == "kv-cache"
    assert sorted(ops) == ["TRT_Attention", "TRT_KVCacheUpdate", "TRT_KVCacheUpdate"]
    assert any("over the cache's capacity" in note for note in result.prepared.plan.notes)
    form = result.prepared.form_model
    adapter = form_adapter(model, [i.name for i in form.graph.input], cache_inputs(form))
    rng = np.random.default_rng(2)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    session = Session(runnable(result))
    names = [o.name for o in session.get_outputs()]
    types = {i.name: i.type for i in session.get_inputs()}  # the caches take the fp16 attention's dtype
    got = dict(zip(names, session.run(names, {k: v.astype(np.float16) if types.get(k) == "tensor(float16)" else v
                                               for k, v in adapter.feeds(dict(feeds)).items()})))
    assert got["qk"].shape[-1] > 7  # the capacity
    want = dict(zip(["Y", "present_key", "present_value", "qk"], ort.InferenceSession(model.SerializeToString()).run(
        None, feeds)))
    ref, out = adapter.line_up(feeds, want, got)
    from trtattn.verify.compare import max_abs_error

    assert max_abs_error(ref["qk"], out["qk"]) < 2e-2 * max(1.0, float(np.abs(ref["qk"][np.isfinite(ref["qk"])]).max()))


@pytest.mark.parametrize("limit,kwargs,why", [
    ("softcap", {"softcap": 2.0}, "soft-capped"),
    ("softcap_over_a_cache", {"softcap": 2.0, "past": 3, "outputs": ("Y", "present_key", "present_value", "qk")},
     "soft-capped"),
])
def test_limits_exit_1_with_the_site_named(tmp_path, capsys, limit, kwargs, why):
    path = tmp_path / f"{limit}.onnx"
    onnx.save(attention(opset=23, **kwargs), path)
    assert main(["-q", "fuse", str(path), "-o", str(tmp_path / "out.onnx"), "--ops", "trt"]) == 1
    out = capsys.readouterr().out
    assert why in out and "not written" in out
    assert not (tmp_path / "out.onnx").exists()


def test_soft_capped_rows_without_keys_stay_a_named_limit(tmp_path, capsys):
    """A soft-capped site kept in TensorRT's implicit form gives zeros on a row its mask leaves without keys, as
    ONNX defines (not NaN), so the form verifies and the soft-cap is the limit named (exit 1), not a broken form."""
    path, inputs = tmp_path / "capped.onnx", tmp_path / "inputs.npz"
    onnx.save(attention(opset=23, softcap=2.0, mask=([5, 5], TensorProto.BOOL)), path)
    rng = np.random.default_rng(0)
    mask = np.ones((5, 5), bool)
    mask[1] = False  # query 1 may attend no key
    np.savez(inputs, Q=rng.standard_normal((2, 4, 5, 8), np.float32), K=rng.standard_normal((2, 2, 5, 8), np.float32),
             V=rng.standard_normal((2, 2, 5, 8), np.float32), attn_mask=mask)
    assert main(["-q", "fuse", str(path), "-o", str(tmp_path / "out.onnx"), "--ops", "trt", "--inputs",
                 str(inputs)]) == 1
    assert "soft-capped" in capsys.readouterr().out


def test_a_model_reading_its_past_length_is_refused_by_name():
    """In the kv-cache form a cache's length is its capacity: a node reading the past's length is named."""
    from trtattn.errors import TrtattnError

    model = attention(past=3, outputs=("Y", "present_key", "present_value"), opset=23)
    model.graph.node.extend([helper.make_node("Shape", ["past_key"], ["past_length"], name="past_length", start=2, end=3),
                             helper.make_node("Cast", ["past_length"], ["positions"], to=F)])
    model.graph.output.append(helper.make_tensor_value_info("positions", F, [1]))
    with pytest.raises(TrtattnError, match="past_length reads the length of the past cache past_key"):
        fuse_trt(model, name="t")


def test_masked_logits_agree_in_verification():
    """ONNX Runtime's Attention writes float's lowest in qk_matmul_output where the standard writes -inf: both are
    a masked logit to the verifier; a masked logit against a real one is not."""
    from trtattn.verify.compare import max_abs_error

    lowest = np.finfo(np.float32).min
    assert max_abs_error(np.array([lowest, 1.0], np.float32), np.array([-np.inf, 1.0], np.float32)) == 0.0
    assert max_abs_error(np.array([lowest, 1.0], np.float32), np.array([0.0, 1.0], np.float32)) > 1e30
    assert max_abs_error(np.array([-np.inf], np.float32), np.array([-1e4], np.float32)) == np.inf
