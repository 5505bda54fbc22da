"""tests/trtsim, part 3: the numpy reference executor (layers after TensorRT's documented semantics; IAttention and
KV-cache updates through trtattn_plugins.reference) against ONNX Runtime's standard Attention, TensorScatter,
RotaryEmbedding and basic ops."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from trtsim.checked import aliased_inputs
from trtsim.execute import (
    DroppedCacheWritesWarning,
    ExecutionError,
    FullyMaskedRowsWarning,
    run,
)
from trtsim.graph import plan
from trtsim.values import NotAnEngine
from trtsim_cases import (
    TOL,
    add_inputs,
    attention_network,
    new_network,
    onnx_attention,
    ort_run,
    rand,
    two_output_model,
)

conformance = pytest.mark.conformance
reference = pytest.mark.reference


# --------------------------------------------------------------------------- part 3: reference executor


@reference
def test_staged_onnx_execution_through_a_placeholder(checked_trt):
    """The ONNX output `a` feeds a TensorRT layer whose result replaces the ONNX input `p`."""
    trt = checked_trt
    builder, net = new_network(trt)
    parser = trt.OnnxParser(net, builder.logger)
    assert parser.parse(two_output_model().SerializeToString())
    onnx_layer = net.get_layer(0)
    a = next(net.get_output(i) for i in range(net.num_outputs) if net.get_output(i).name == "a")
    placeholder = next(net.get_input(i) for i in range(net.num_inputs) if net.get_input(i).name == "p")
    net.unmark_output(a)
    exp = net.add_unary(a, trt.UnaryOperation.EXP).get_output(0)
    slot = next(i for i in range(onnx_layer.num_inputs) if onnx_layer.get_input(i) is placeholder)
    onnx_layer.set_input(slot, exp)
    net.remove_tensor(placeholder)
    assert trt.sim.problems == [] and net.num_inputs == 1

    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    out = run(net, {"x": x})
    np.testing.assert_allclose(out["y"], np.exp(2 * x) + x, **TOL)
    steps, unresolved = plan(net)
    assert [st.kind for st, _ in steps] == ["ONNX", "IUnaryLayer", "ONNX"] and unresolved == []

    # A real cycle (y needs p, p computed from y) is reported, not looped on.
    builder, net = new_network(trt)
    trt.OnnxParser(net, builder.logger).parse(two_output_model().SerializeToString())
    layer = net.get_layer(0)
    y = next(net.get_output(i) for i in range(net.num_outputs) if net.get_output(i).name == "y")
    p = next(net.get_input(i) for i in range(net.num_inputs) if net.get_input(i).name == "p")
    layer.set_input(next(i for i in range(layer.num_inputs) if layer.get_input(i) is p),
                    net.add_identity(y).get_output(0))
    net.remove_tensor(p)
    with pytest.raises(ExecutionError, match=r"outputs \['y'\] cannot be computed"):
        run(net, {"x": x})


ATTENTION_CASES = {
    # name: (Nq, Nkv, Sq, Skv, causal, mask kind)
    "mha": (4, 4, 3, 5, "NONE", None),
    "bool_mask": (4, 4, 3, 5, "NONE", "bool"),
    "float_mask": (4, 4, 3, 5, "NONE", "float"),
    "upper_left": (4, 4, 3, 5, "UPPER_LEFT", None),
    "lower_right": (4, 4, 3, 5, "LOWER_RIGHT", None),
    "lower_right_square": (2, 2, 4, 4, "LOWER_RIGHT", None),
    "gqa": (4, 2, 3, 5, "LOWER_RIGHT", None),
    "mqa": (4, 1, 3, 5, "NONE", "bool"),
}


@reference
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_padded_matches_onnx_attention(checked_trt, case):
    nq, nkv, sq, skv, causal, mask_kind = ATTENTION_CASES[case]
    rng = np.random.default_rng(1)
    b, h = 2, 8
    feeds = {"q": rand(rng, b, nq, sq, h, scale=h ** -0.5), "k": rand(rng, b, nkv, skv, h), "v": rand(rng, b, nkv, skv, h)}
    mask = None
    if mask_kind == "bool":
        mask = rng.random((b, 1, sq, skv)) < 0.7
        mask[..., 0] = True  # every row attends somewhere
    elif mask_kind == "float":
        mask = rand(rng, 1, 1, sq, skv)
    if mask is not None:
        feeds["mask"] = mask
    _, net, _ = attention_network(checked_trt, feeds, causal=causal)
    got = run(net, feeds)["out"]
    want = onnx_attention(feeds["q"], feeds["k"], feeds["v"], causal=causal, mask=mask)
    assert got.shape == feeds["q"].shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, **TOL)


@reference
@pytest.mark.parametrize("causal", ["NONE", "LOWER_RIGHT"])
def test_attention_padded_kv_lengths_match_nonpad_kv_seqlen(checked_trt, causal):
    rng = np.random.default_rng(2)
    feeds = {"q": rand(rng, 2, 4, 2, 8), "k": rand(rng, 2, 2, 6, 8), "v": rand(rng, 2, 2, 6, 8),
             "key_value_lengths": np.array([3, 6], np.int32)}
    _, net, _ = attention_network(checked_trt, feeds, causal=causal)
    got = run(net, feeds)["out"]
    want = onnx_attention(feeds["q"], feeds["k"], feeds["v"], causal=causal, nonpad=feeds["key_value_lengths"])
    np.testing.assert_allclose(got, want, **TOL)
    # Keys past the length really are ignored: garbage there changes nothing.
    feeds["k"][0, :, 3:] = 1e3
    np.testing.assert_allclose(run(net, feeds)["out"], got, **TOL)


def _per_sequence_reference(q_seqs, k_seqs, v_seqs, causal):
    """Packed reference: ONNX Attention on each sequence alone ([N, S, H] pieces)."""
    outs = [onnx_attention(q[None], k[None], v[None], causal=causal)[0] for q, k, v in zip(q_seqs, k_seqs, v_seqs)]
    return np.concatenate([o.transpose(1, 0, 2) for o in outs])


@reference
@pytest.mark.parametrize("causal", ["NONE", "LOWER_RIGHT"])
def test_attention_packed_matches_per_sequence_runs(checked_trt, causal):
    rng = np.random.default_rng(3)
    nq, nkv, h = 4, 2, 8
    q_lens, kv_lens = [2, 3], [4, 5]
    q_seqs = [rand(rng, nq, n, h, scale=h ** -0.5) for n in q_lens]
    k_seqs = [rand(rng, nkv, n, h) for n in kv_lens]
    v_seqs = [rand(rng, nkv, n, h) for n in kv_lens]
    pack = lambda seqs: np.concatenate([s.transpose(1, 0, 2) for s in seqs])  # noqa: E731
    feeds = {"q": pack(q_seqs), "k": pack(k_seqs), "v": pack(v_seqs),
             "query_lengths": np.array([0, 2, 5], np.int32), "key_value_lengths": np.array([0, 4, 9], np.int32)}
    _, net, _ = attention_network(checked_trt, feeds, causal=causal, q_packed=True, kv_packed=True)
    got = run(net, feeds)["out"]
    assert got.shape == (5, nq, h)
    np.testing.assert_allclose(got, _per_sequence_reference(q_seqs, k_seqs, v_seqs, causal), **TOL)


@reference
def test_attention_packed_query_on_padded_cache(checked_trt):
    """Decode: one new token per sequence (packed) against a padded cache with per-batch lengths."""
    rng = np.random.default_rng(4)
    nq, nkv, h, max_s = 4, 2, 8, 6
    kv_lens = [3, 5]
    cache_k, cache_v = rand(rng, 2, nkv, max_s, h), rand(rng, 2, nkv, max_s, h)
    q_seqs = [rand(rng, nq, 1, h, scale=h ** -0.5) for _ in kv_lens]
    feeds = {"q": np.concatenate([s.transpose(1, 0, 2) for s in q_seqs]), "k": cache_k, "v": cache_v,
             "query_lengths": np.array([0, 1, 2], np.int32), "key_value_lengths": np.array(kv_lens, np.int32)}
    _, net, _ = attention_network(checked_trt, feeds, causal="LOWER_RIGHT", q_packed=True)
    want = _per_sequence_reference(q_seqs, [cache_k[b, :, :n] for b, n in enumerate(kv_lens)],
                                   [cache_v[b, :, :n] for b, n in enumerate(kv_lens)], "LOWER_RIGHT")
    np.testing.assert_allclose(run(net, feeds)["out"], want, **TOL)


@reference
def test_attention_fully_masked_rows_are_zero_and_reported(checked_trt):
    rng = np.random.default_rng(5)
    mask = np.ones((1, 1, 3, 4), bool)
    mask[0, 0, 1] = False
    feeds = {"q": rand(rng, 1, 2, 3, 8), "k": rand(rng, 1, 2, 4, 8), "v": rand(rng, 1, 2, 4, 8), "mask": mask}
    _, net, _ = attention_network(checked_trt, feeds)
    with pytest.warns(FullyMaskedRowsWarning, match="2 query rows attend to no key"):
        got = run(net, feeds)["out"]
    assert np.all(got[:, :, 1] == 0)
    np.testing.assert_allclose(got, onnx_attention(feeds["q"], feeds["k"], feeds["v"], mask=mask), **TOL)


@reference
def test_attention_mask_with_causal_is_an_error(checked_trt):
    rng = np.random.default_rng(6)
    feeds = {"q": rand(rng, 1, 2, 3, 8), "k": rand(rng, 1, 2, 3, 8), "v": rand(rng, 1, 2, 3, 8),
             "mask": np.ones((1, 1, 3, 3), bool)}
    _, net, _ = attention_network(checked_trt, feeds, causal="UPPER_LEFT")
    with pytest.raises(ExecutionError, match="mask together with causal_kind UPPER_LEFT"):
        run(net, feeds)


def _kv_network(trt, feeds, packed=False):
    builder, net = new_network(trt)
    t = add_inputs(trt, net, feeds, dynamic=True)
    layer = net.add_kv_cache_update(t["cache"], t["update"], t["write_indices"], trt.KVCacheMode.LINEAR)
    if packed:
        layer.update_form = trt.AttentionIOForm.PACKED_NHD
        layer.update_lengths = t["update_lengths"]
    out = layer.get_output(0)
    out.name = "present"
    net.mark_output(out)
    return net


def onnx_tensor_scatter(cache, update, write_indices):
    node = helper.make_node("TensorScatter", ["c", "u", "w"], ["o"], axis=-2)
    feeds = {"c": cache, "u": update, "w": write_indices.astype(np.int64)}
    return ort_run([node], feeds, [("o", cache.dtype)], opset=24)[0]


@reference
def test_kv_cache_update_matches_tensor_scatter(checked_trt):
    rng = np.random.default_rng(7)
    feeds = {"cache": rand(rng, 2, 2, 6, 4), "update": rand(rng, 2, 2, 2, 4), "write_indices": np.array([1, 4], np.int32)}
    net = _kv_network(checked_trt, feeds)
    assert aliased_inputs(net) == {"present": "cache"}  # in place, like engine.get_aliased_input_tensor
    got = run(net, feeds)["present"]
    np.testing.assert_allclose(got, onnx_tensor_scatter(feeds["cache"], feeds["update"], feeds["write_indices"]), **TOL)


@reference
def test_kv_cache_update_packed_matches_tensor_scatter(checked_trt):
    rng = np.random.default_rng(8)
    cache = rand(rng, 2, 2, 6, 4)
    seqs = [rand(rng, 2, 1, 4), rand(rng, 2, 3, 4)]  # [N, S_b, H]
    w = np.array([2, 0], np.int32)
    feeds = {"cache": cache, "update": np.concatenate([s.transpose(1, 0, 2) for s in seqs]), "write_indices": w,
             "update_lengths": np.array([0, 1, 4], np.int32)}
    got = run(_kv_network(checked_trt, feeds, packed=True), feeds)["present"]
    want = np.concatenate([onnx_tensor_scatter(cache[b:b + 1], seqs[b][None], w[b:b + 1]) for b in range(2)])
    np.testing.assert_allclose(got, want, **TOL)


@reference
def test_kv_cache_update_drops_writes_past_the_end(checked_trt):
    rng = np.random.default_rng(9)
    feeds = {"cache": rand(rng, 1, 2, 6, 4), "update": rand(rng, 1, 2, 3, 4), "write_indices": np.array([4], np.int32)}
    with pytest.warns(DroppedCacheWritesWarning, match="1 cache writes"):
        got = run(_kv_network(checked_trt, feeds), feeds)["present"]
    np.testing.assert_array_equal(got[0, :, 4:], feeds["update"][0, :, :2])
    np.testing.assert_array_equal(got[0, :, :4], feeds["cache"][0, :, :4])


ROPE_CASES = [(interleaved, dim, ids) for interleaved in (False, True) for dim in (0, 4) for ids in (False, True)]


@reference
@pytest.mark.parametrize("interleaved,rotary_dim,with_ids", ROPE_CASES)
def test_rotary_embedding_matches_onnx(checked_trt, interleaved, rotary_dim, with_ids):
    trt = checked_trt
    rng = np.random.default_rng(10)
    b, n, s, h, max_pos = 2, 3, 4, 8, 10
    half = (rotary_dim or h) // 2
    feeds = {"x": rand(rng, b, n, s, h)}
    if with_ids:
        angles = rng.random((max_pos, half)) * 3
        feeds["position_ids"] = rng.integers(0, max_pos, (b, s)).astype(np.int64)
    else:
        angles = rng.random((b, s, half)) * 3
    feeds["cos"], feeds["sin"] = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    _, net = new_network(trt)
    t = add_inputs(trt, net, feeds, dynamic=True)
    layer = net.add_rotary_embedding(t["x"], t["cos"], t["sin"], interleaved, rotary_dim)
    if with_ids:
        layer.set_input(3, t["position_ids"])
    out = layer.get_output(0)
    out.name = "out"
    net.mark_output(out)
    got = run(net, feeds)["out"]

    names = ["x", "cos", "sin"] + (["position_ids"] if with_ids else [])
    node = helper.make_node("RotaryEmbedding", names, ["y"], interleaved=int(interleaved),
                            rotary_embedding_dim=rotary_dim)
    want = ort_run([node], {k: feeds[k] for k in names}, [("y", np.float32)], opset=23)[0]
    np.testing.assert_allclose(got, want, **TOL)
    if rotary_dim:
        np.testing.assert_array_equal(got[..., rotary_dim:], feeds["x"][..., rotary_dim:])  # passes through


@reference
def test_rotary_embedding_packed_with_position_ids(checked_trt):
    trt = checked_trt
    rng = np.random.default_rng(11)
    t_tokens, n, h, max_pos = 5, 2, 8, 12
    angles = rng.random((max_pos, h // 2)) * 3
    feeds = {"x": rand(rng, t_tokens, n, h), "cos": np.cos(angles).astype(np.float32),
             "sin": np.sin(angles).astype(np.float32), "position_ids": np.array([0, 1, 0, 1, 2], np.int32)}
    _, net = new_network(trt)
    t = add_inputs(trt, net, feeds)
    layer = net.add_rotary_embedding(t["x"], t["cos"], t["sin"], False, 0)
    layer.set_input(3, t["position_ids"])
    layer.get_output(0).name = "out"
    net.mark_output(layer.get_output(0))
    got = run(net, feeds)["out"]
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "ids"], ["y"])
    want = ort_run([node], {"x": feeds["x"].transpose(1, 0, 2)[None], "cos": feeds["cos"], "sin": feeds["sin"],
                            "ids": feeds["position_ids"][None].astype(np.int64)}, [("y", np.float32)])[0]
    np.testing.assert_allclose(got, want[0].transpose(1, 0, 2), **TOL)


# Simple layers against the equivalent ONNX op: (build TensorRT layer, ONNX node(s), feeds, attrs)


@reference
def test_executor_checks_feeds(checked_trt):
    trt = checked_trt
    _, net = new_network(trt)
    x = net.add_input("x", trt.float32, (-1, 3))
    net.mark_output(net.add_identity(x).get_output(0))
    with pytest.raises(ExecutionError, match="is float64, the network declares FLOAT"):
        run(net, {"x": np.zeros((2, 3))})
    with pytest.raises(ExecutionError, match=r"shape \(2, 4\), the network declares \(-1, 3\)"):
        run(net, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(ExecutionError, match="not network inputs"):
        run(net, {"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run(net, {"x": np.ones((2, 3), np.float32)}, return_all=True)["x"].shape == (2, 3)


def _attention_block(cut: bool, b=2, s=5, n=2, h=8):
    """x [B, S, D] -> q, k, v [B, N, S, H] -> attention -> [B, S, D] @ Wo. With cut=True the graph stops at
    q, k, v (outputs) and restarts from a placeholder input `attn`, as the builder cuts models."""
    d = n * h
    rng = np.random.default_rng(13)
    inits = [helper.make_tensor(f"W{r}", TensorProto.FLOAT, [d, d], rng.standard_normal((d, d)).astype(np.float32).ravel())
             for r in "qkvo"]
    inits += [helper.make_tensor("heads", TensorProto.INT64, [4], [0, 0, n, h]),
              helper.make_tensor("merged", TensorProto.INT64, [3], [0, 0, d])]
    nodes = []
    for r in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"W{r}"], [f"{r}_flat"]),
                  helper.make_node("Reshape", [f"{r}_flat", "heads"], [f"{r}_bsnh"]),
                  helper.make_node("Transpose", [f"{r}_bsnh"], [r], perm=[0, 2, 1, 3])]
    if not cut:
        nodes.append(helper.make_node("Attention", ["q", "k", "v"], ["attn"], is_causal=1))
    nodes += [helper.make_node("Transpose", ["attn"], ["attn_bsnh"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["attn_bsnh", "merged"], ["attn_flat"]),
              helper.make_node("MatMul", ["attn_flat", "Wo"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", d])
    bnsh = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", n, "seq", h])  # noqa: E731
    inputs, outputs = [x], [y]
    if cut:
        inputs.append(bnsh("attn"))
        outputs += [bnsh(r) for r in "qkv"]
    model = helper.make_model(helper.make_graph(nodes, "block", inputs, outputs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model, rng.standard_normal((b, s, d)).astype(np.float32), h


@reference
def test_cut_graph_with_native_attention_matches_the_uncut_model(checked_trt):
    """The builder's pattern end to end: parse the cut model, put IAttention between its q/k/v outputs
    and its placeholder input, and compare with the uncut model (ONNX Attention) on ONNX Runtime."""
    trt = checked_trt
    cut, x, h = _attention_block(cut=True)
    full, _, _ = _attention_block(cut=False)
    builder, net = new_network(trt)
    assert trt.OnnxParser(net, builder.logger).parse(cut.SerializeToString())
    outputs = {net.get_output(i).name: net.get_output(i) for i in range(net.num_outputs)}
    for name in "qkv":
        net.unmark_output(outputs[name])
    scale = net.add_constant((1, 1, 1, 1), np.array([h ** -0.5], np.float32)).get_output(0)
    q = net.add_elementwise(outputs["q"], scale, trt.ElementWiseOperation.PROD).get_output(0)
    attn = net.add_attention_v2(q, outputs["k"], outputs["v"], trt.AttentionNormalizationOp.SOFTMAX,
                                trt.CausalMaskKind.UPPER_LEFT)
    placeholder = next(net.get_input(i) for i in range(net.num_inputs) if net.get_input(i).name == "attn")
    for i in range(net.num_layers):
        layer = net.get_layer(i)
        for j in range(layer.num_inputs):
            if layer.get_input(j) is placeholder:
                layer.set_input(j, attn.get_output(0))
    net.remove_tensor(placeholder)
    assert [net.get_output(i).name for i in range(net.num_outputs)] == ["y"] and trt.sim.problems == []

    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 1, 16), x.shape, (4, 64, 16))
    config.add_optimization_profile(profile)
    assert isinstance(builder.build_serialized_network(net, config), NotAnEngine)

    got = run(net, {"x": x})["y"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    want = ort.InferenceSession(full.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
