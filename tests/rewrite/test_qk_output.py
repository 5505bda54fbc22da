"""Issue 25: a model that returns its attention probabilities (what the ONNX Attention op gives as its
qk_matmul_output in mode 3: the softmax after the fully-masked-row guard) or its logits at the point of mode 0 (scaled
Q.K^T), 1 (soft-capped) or 2 (masked) is fused into one Attention op whose own fourth output makes them; logits
anywhere else stay computed beside the op. Hand-built graphs in the form of the op's function body. The TensorRT route
names such a site as IAttention's limit (exit 1): IAttention outputs only Y."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tests.conftest import ort_outputs
from trtattn.cli import main
from trtattn.graph import validate
from trtattn.graph.user_inputs import GivenInputs
from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model

B, N, S, T, D = 2, 2, 3, 4, 8
F = TensorProto.FLOAT


def _body(*, returned: str = "p_safe", merged_heads: bool = False, key_length=T) -> onnx.ModelProto:
    """q.k^T * scale + bias -> Softmax -> Where(rows of bias all -inf, 0, P) -> . v, returning `returned` through an
    Identity as `weights`. merged_heads: q, k, v are [B*N, S, D] (heads folded into the batch, as bmm exports)."""
    rank = 3 if merged_heads else 4
    lead = [B * N] if merged_heads else [B, N]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1] if merged_heads else [0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
        helper.make_node("ReduceMax", ["bias", "last"], ["row_max"], keepdims=1),
        helper.make_node("Equal", ["row_max", "neg_inf"], ["all_masked"]),
        helper.make_node("CastLike", ["zero", "p"], ["zero_t"]),
        helper.make_node("Where", ["all_masked", "zero_t", "p"], ["p_safe"]),
        helper.make_node("MatMul", ["p_safe", "v"], ["y"]),
        helper.make_node("Identity", [returned], ["weights"]),
    ]
    inputs = [helper.make_tensor_value_info(n, F, s) for n, s in
              (("q", lead + [S, D]), ("k", lead + [key_length, D]), ("v", lead + [key_length, D]),
               ("bias", [1] * (rank - 2) + [S, key_length]))]
    inits = [helper.make_tensor("scale", F, [], [D ** -0.5]), helper.make_tensor("last", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("neg_inf", F, [], [-np.inf]), helper.make_tensor("zero", F, [], [0.0])]
    outputs = [helper.make_tensor_value_info("y", F, lead + [S, D]),
               helper.make_tensor_value_info("weights", F, lead + [S, key_length])]
    model = helper.make_model(helper.make_graph(nodes, "body", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model, full_check=True)
    ort.InferenceSession(model.SerializeToString())  # every model a test writes loads in ONNX Runtime
    return model


def _feeds(model) -> dict:
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value or T for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    feeds["bias"] = np.where(rng.random(feeds["bias"].shape) < 0.3, -np.inf, 0.0).astype(np.float32)
    feeds["bias"][..., 1, :] = -np.inf  # the second query row masked at every key: the guard zeroes it
    return feeds


def _fused_into_one_op(model):
    feeds = _feeds(model)
    result = fuse_model(model, inputs=GivenInputs("weights", [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.ok, r.reason
    assert r.site.qk_output == "p_safe" and r.site.qk_mode == 3
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == 1 and not ops["Softmax"] and not ops["MatMul"], ops
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["qk_matmul_output_mode"] == 3 and len(node.output) == 4 and node.output[3] and not node.output[1]
    validate.check(result.model, "the fused model")  # strict ONNX inference: as valid as it was read
    want, got = ort_outputs(model, feeds), ort_outputs(result.model, feeds)
    for name in ("y", "weights"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-6, rtol=1e-6, err_msg=name)
    assert not np.any(got["weights"][..., 1, :])  # the fully masked row: zeros, as the guard wrote
    return result


def test_returned_probabilities_are_the_ops_own_output_in_mode_3():
    _fused_into_one_op(_body())


def test_with_a_symbolic_key_length():
    _fused_into_one_op(_body(key_length="keys"))


def test_with_the_heads_folded_into_the_batch():
    """[B*N, S, T] probabilities: the op's [B*N, 1, S, T] output converted to the frame the model returns."""
    _fused_into_one_op(_body(merged_heads=True))


def test_probabilities_returned_before_the_guard_stay_as_written():
    """The softmax before the guard is not what the op returns (its fully masked rows are not zeroed): listed."""
    (skipped,) = match(_body(returned="p")).skipped
    assert "graph output (as 'weights')" in skipped.reason and "comes after them" in skipped.reason


def test_the_tensorrt_route_computes_the_returned_probabilities_beside_iattention(tmp_path, capsys):
    """IAttention outputs only Y: `fuse --ops trt` fuses the body into the op with its qk output, then computes that
    output beside IAttention by the op's own function body, verified like Y (the written model returns both)."""
    path, out_path = tmp_path / "weights.onnx", tmp_path / "out.onnx"
    onnx.save(_body(), path)
    assert main(["-q", "fuse", str(path), "-o", str(out_path), "--ops", "trt"]) == 0
    out = capsys.readouterr().out
    assert "its qk_matmul_output p_safe (mode 3) computed beside IAttention" in out, out
    assert "verification on CPU (trtattn_plugins): passed" in out, out
    written = onnx.load(out_path)
    assert [o.name for o in written.graph.output] == [o.name for o in _body().graph.output] == ["y", "weights"]
    assert [n.op_type for n in written.graph.node].count("TRT_Attention") == 1
    assert all(len(n.output) == 1 for n in written.graph.node if n.op_type == "TRT_Attention")


def test_normalize_names_them_as_iattentions_limit():
    """normalize's verdict for IAttention says why: the model also returns the probabilities."""
    from trtattn.rewrite.normalize.fusability import verdict

    (site,) = match(_body()).sites
    v = verdict(site, precision="fp16")
    assert not v.iattention and any("also returns p_safe (qk_matmul_output mode 3)" in w for w in v.iattention_why)


def _logits_body(returned: str, *, bias: bool = True) -> onnx.ModelProto:
    """q.k^T -> * scale -> [+ bias] -> + causal (a constant -inf triangle) -> Softmax -> . v over T queries and keys,
    returning `returned` through an Identity as `logits`."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
             helper.make_node("Add", ["biased" if bias else "scaled", "causal"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"]),
             helper.make_node("Identity", [returned], ["logits"])]
    if bias:
        nodes.insert(3, helper.make_node("Add", ["scaled", "bias"], ["biased"]))
    shape = [B, N, T, D]
    inputs = [helper.make_tensor_value_info(n, F, shape) for n in "qkv"]
    inputs += [helper.make_tensor_value_info("bias", F, [B, 1, T, T])] if bias else []
    triangle = np.where(np.tril(np.ones((T, T))) > 0, 0.0, -np.inf).astype(np.float32)
    inits = [helper.make_tensor("scale", F, [], [D ** -0.5]), onnx.numpy_helper.from_array(triangle, "causal")]
    outputs = [helper.make_tensor_value_info("y", F, shape), helper.make_tensor_value_info("logits", F, [B, N, T, T])]
    model = helper.make_model(helper.make_graph(nodes, "body", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model, full_check=True)
    ort.InferenceSession(model.SerializeToString())
    return model


def _fused_logits(model):
    """`model` fused and verified; its outputs on ONNX Runtime equal the original's (the -inf logits too)."""
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    result = fuse_model(model, inputs=GivenInputs("logits", [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.ok, r.reason
    validate.check(result.model, "the fused model")
    want, got = ort_outputs(model, feeds), ort_outputs(result.model, feeds)
    for name in ("y", "logits"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-6, rtol=1e-6, err_msg=name)
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    return r.site, attrs, ops


def test_scaled_logits_are_the_ops_output_in_mode_0():
    site, attrs, ops = _fused_logits(_logits_body("scaled"))
    assert (site.qk_output, site.qk_mode, attrs["qk_matmul_output_mode"]) == ("scaled", 0, 0)
    assert not ops["MatMul"] and not ops["Softmax"], ops


def test_masked_logits_are_mode_2_with_the_causal_mask_written_as_a_tensor():
    """ONNX Runtime fills is_causal's masked logits with the lowest float where the graph has -inf: the op of a mode-2
    site takes the causal mask as its attn_mask, and its output equals the graph's, -inf included."""
    site, attrs, ops = _fused_logits(_logits_body("masked", bias=False))
    assert (site.qk_output, site.qk_mode, attrs["qk_matmul_output_mode"]) == ("masked", 2, 2)
    assert attrs["is_causal"] == 0 and not ops["MatMul"], (attrs, ops)


def test_logits_no_mode_gives_stay_computed_beside_the_op():
    """Before the scale (the op's mode 0 is scaled) or between two masks: no mode of the op gives them, so the graph
    still computes them for the output, beside the op."""
    for returned in ("qk", "biased"):
        site, attrs, ops = _fused_logits(_logits_body(returned))
        assert site.qk_output is None and "qk_matmul_output_mode" not in attrs and ops["MatMul"] == 1, returned


def test_a_mode_that_does_not_verify_falls_back_to_the_logits_beside(monkeypatch):
    """Should the op's own output not verify (here: its mode written wrong on purpose), the site is fused again with
    the logits computed beside the op, and says so."""
    import trtattn.rewrite.fuse as fuse

    wrong = fuse.rewrite_site

    def wrong_mode(graph, tensors, site, meaning, *rest):
        return wrong(graph, tensors, site.replace(qk_mode=2) if site.qk_mode == 0 else site, meaning, *rest)

    monkeypatch.setattr(fuse, "rewrite_site", wrong_mode)
    site, attrs, ops = _fused_logits(_logits_body("scaled"))
    assert site.qk_output is None and "qk_matmul_output_mode" not in attrs and ops["MatMul"] == 1
    assert any("did not verify: computed beside the op" in n for n in site.notes), site.notes


def test_fp16_probabilities_returned_in_the_softmax_precision():
    """An fp16 attention whose softmax runs in fp32 (Cast around it) returning the fp32 probabilities: the op gives
    them in its own precision (fp16), cast to the type the model returns; within fp16's tolerance."""
    h16 = TensorProto.FLOAT16
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scaled"]), helper.make_node("Add", ["scaled", "bias"], ["logits"]),
             helper.make_node("Cast", ["logits"], ["logits32"], to=F), helper.make_node("Softmax", ["logits32"], ["p32"]),
             helper.make_node("Cast", ["p32"], ["p16"], to=h16), helper.make_node("MatMul", ["p16", "v"], ["y"]),
             helper.make_node("Identity", ["p32"], ["weights"])]
    inputs = [helper.make_tensor_value_info(n, h16, s) for n, s in
              (("q", [B, N, S, D]), ("k", [B, N, T, D]), ("v", [B, N, T, D]), ("bias", [1, 1, S, T]))]
    outputs = [helper.make_tensor_value_info("y", h16, [B, N, S, D]),
               helper.make_tensor_value_info("weights", F, [B, N, S, T])]
    scale = helper.make_tensor("scale", h16, [], [D ** -0.5])
    model = helper.make_model(helper.make_graph(nodes, "fp16", inputs, outputs, [scale]),
                              opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(2)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float16)
             for i in model.graph.input}
    result = fuse_model(model, inputs=GivenInputs("fp16", [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.ok and r.site.qk_mode == 3, r.reason
    validate.check(result.model, "the fused model")
    want, got = ort_outputs(model, feeds), ort_outputs(result.model, feeds)
    assert got["weights"].dtype == np.float32
    np.testing.assert_allclose(got["weights"], want["weights"], atol=1e-3)
    assert collections.Counter(n.op_type for n in result.model.graph.node)["Attention"] == 1


def test_logits_masked_by_a_boolean_are_mode_2_with_their_minus_inf():
    """Where(allowed, logits, -inf) returned: ONNX Runtime's mode-2 output fills a boolean attn_mask with the lowest
    float, so the op takes the mask as a -inf bias and returns exactly the graph's logits, -inf included."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
             helper.make_node("Where", ["allowed", "scaled", "neg_inf"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"]), helper.make_node("MatMul", ["p", "v"], ["y"]),
             helper.make_node("Identity", ["masked"], ["logits"])]
    inputs = [helper.make_tensor_value_info(n, F, s) for n, s in (("q", [B, N, S, D]), ("k", [B, N, T, D]),
                                                                   ("v", [B, N, T, D]))]
    inputs.append(helper.make_tensor_value_info("allowed", TensorProto.BOOL, [B, 1, S, T]))
    outputs = [helper.make_tensor_value_info("y", F, [B, N, S, D]), helper.make_tensor_value_info("logits", F, [B, N, S, T])]
    inits = [helper.make_tensor("scale", F, [], [D ** -0.5]), helper.make_tensor("neg_inf", F, [], [-np.inf])]
    model = helper.make_model(helper.make_graph(nodes, "bool", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in (("q", [B, N, S, D]), ("k", [B, N, T, D]),
                                                                      ("v", [B, N, T, D]))}
    feeds["allowed"] = rng.random((B, 1, S, T)) < 0.7
    feeds["allowed"][..., 0] = True  # every row keeps a key
    result = fuse_model(model, inputs=GivenInputs("bool", [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.ok and r.site.qk_mode == 2, (r.reason, r.site.notes)
    want, got = ort_outputs(model, feeds), ort_outputs(result.model, feeds)
    np.testing.assert_array_equal(np.isneginf(got["logits"]), np.isneginf(want["logits"]))
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-6)
    assert not collections.Counter(n.op_type for n in result.model.graph.node)["MatMul"]


def test_a_site_within_its_bound_whose_model_output_is_not_keeps_the_original_unchanged(monkeypatch):
    """Each site within its own bound but a model output off (here: the returned probabilities made off on purpose):
    the original is kept, the site named with the output, and the result says the model did not change."""
    import trtattn.rewrite.fuse as fuse

    compare = fuse.compare_models

    def weights_off(*args, **kwargs):
        outcome = compare(*args, **kwargs)
        outcome.output_errors["weights"], outcome.passed = 1.0, False
        return outcome

    monkeypatch.setattr(fuse, "compare_models", weights_off)
    model = _body()
    result = fuse_model(model, inputs=GivenInputs("weights off", [_feeds(model)]))
    (r,) = result.reports
    assert r.status != "fused" and "within its own bound, but the model's output 'weights' is off" in r.reason, r
    assert result.changed is False and result.model is model and result.verification.passed is False
