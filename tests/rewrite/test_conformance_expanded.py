"""Issue 25: onnx's backend node cases of the Attention op (opset 23/24), each as its `_expanded` form (the op
replaced by its function body, as onnx.inliner and function expansion write it), through trtattn's fuse as the
command runs it: exactly one Attention op replaces the body, with the op's scale and softcap, and the fused model
reproduces onnx's reference outputs (the case's tolerance; FP16_ATOL for fp16). A case whose model returns its
softmax probabilities or its logits (the op's qk_matmul_output) gets them from that op's own fourth output, in the
case's qk_matmul_output_mode: nothing is computed beside the op.
Through normalize, each body is either written and verified (matching onnx's reference) or its site named with
why: never a verification failure of normalize's own rewrite (its fully-masked-row guard moves after the second
MatMul). bf16 cases (ONNX Runtime's CPU provider cannot run them) are fused in bf16 and run emulated in fp32
(precision/emulate.py), compared with onnx's reference at the bf16 rewrite tolerance. The RotaryEmbedding cases have no
attention around them: fuse leaves them as they are (exit 0, the output is the input); put on Q and K of an
attention, the rotation is read as the site's rope (match/rotation.py) and written back as RotaryEmbedding ops."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import onnx
import pytest

from trtattn.graph.user_inputs import GivenInputs
from trtattn.rewrite.fuse import fuse_model
from trtattn.rewrite.precision.emulate import EMULATION
from trtattn.testing.conformance import (
    conformance_cases,
    fuse_case,
    fuse_rotation_case,
    inside_attention,
    normalize_case,
    op_node,
)

ATTENTION = conformance_cases("Attention", expanded=True)
ROPE = conformance_cases("RotaryEmbedding", expanded=True)
# one of each kind stays in the fast run: 4-D, fp16, GQA + causal, 3-D, bool mask, softcap, past/present, fully
# masked rows, a -inf logits output, a local window, batch and heads of 1, the probabilities returned
FAST = {"attention_4d_expanded", "attention_4d_fp16_expanded", "attention_4d_gqa_causal_expanded",
        "attention_3d_diff_heads_sizes_scaled_expanded", "attention_4d_attn_mask_bool_expanded",
        "attention_4d_gqa_softcap_expanded", "attention_4d_gqa_with_past_and_present_expanded",
        "attention_23_boolmask_fullymasked_row_nan_robustness_expanded",
        "attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal_expanded",
        "attention_local_window_with_past_expanded", "attention_4d_softcap_neginf_mask_poison_expanded",
        "attention_24_fullymasked_qk_matmul_output_mode3_zero_expanded",
        "attention_3d_with_past_and_present_qk_matmul_softmax_expanded", "attention_4d_with_qk_matmul_expanded",
        "attention_3d_with_past_and_present_qk_matmul_softcap_expanded", "attention_4d_attn_mask_causal_bf16_expanded"}


def _param(case):
    marks = [] if case.name in FAST else [pytest.mark.slow]
    return pytest.param(case, id=case.name, marks=marks)


def test_the_suite_is_the_installed_onnx_one():
    names = {c.name for c in ATTENTION}
    assert len(ATTENTION) >= 88 and FAST <= names
    assert sum(c.cpu_unrunnable is not None for c in ATTENTION) >= 1


def _qk_mode(op: onnx.NodeProto) -> int | None:
    """The case's qk_matmul_output_mode when its op returns qk_matmul_output, else None."""
    if len(op.output) < 4 or not op.output[3]:
        return None
    return next((a.i for a in op.attribute if a.name == "qk_matmul_output_mode"), 0)


def _expected_scale(case, op: onnx.NodeProto) -> float:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in op.attribute}
    if "scale" in attrs:
        return float(attrs["scale"])
    q = case.inputs[op.input[0]]
    head = q.shape[-1] if q.ndim == 4 else q.shape[-1] // attrs["q_num_heads"]
    return 1.0 / np.sqrt(head)


@pytest.mark.parametrize("case", [_param(c) for c in ATTENTION])
def test_expanded_attention_fuses_into_one_op(case):
    op = op_node(case)
    out = fuse_case(case)
    assert out.fused, out.reason
    assert (out.run_on == EMULATION) == (case.cpu_unrunnable == "bf16"), out.run_on
    assert out.ops.get("Attention") == 1 and not out.ops.get("Softmax"), out.ops
    assert out.within, f"{case.name}: max abs error {out.max_abs_err} against onnx's reference"
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in op.attribute}
    assert out.attention is not None
    # the logits or probabilities returned: the op's own output in the case's mode, no product left beside it
    assert out.attention.get("qk_matmul_output_mode") == _qk_mode(op) and not out.ops.get("MatMul"), out
    assert np.isclose(out.attention.get("softcap", 0.0), attrs.get("softcap", 0.0))
    # the body multiplies Q and K by sqrt(scale) in their own precision: in fp16 that factor is rounded
    rtol = {np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1e-2}.get(case.inputs[op.input[0]].dtype, 1e-5)
    assert np.isclose(out.attention["scale"], _expected_scale(case, op), rtol=rtol), out.attention


@pytest.mark.parametrize("case", [_param(c) for c in ATTENTION])
def test_expanded_attention_through_normalize_is_verified_or_named(case):
    """normalize on the body (its fully-masked-row guard included): either written and verified, matching onnx's
    reference, or the site named with why (exit 1); never a verification failure of its own rewrite."""
    if case.cpu_unrunnable:
        pytest.skip(f"{case.name}: {case.cpu_unrunnable}, which ONNX Runtime's CPU provider cannot run")
    out = normalize_case(case)
    assert out.verified is not False, out
    if out.exit == 0:
        assert out.within, f"{case.name}: max abs error {out.max_abs_err} against onnx's reference"
    else:
        assert out.named and all(len(a) > len("skipped: ") for a in out.named), out
        assert out.max_abs_err is None and not out.within, out  # nothing written: nothing within a tolerance


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in ROPE])
def test_lone_expanded_rotary_embedding_is_left_as_it_is(case):
    """No attention reads it: nothing to fuse, so fuse writes the input unchanged (exit 0)."""
    out = fuse_case(case)
    assert not out.fused and out.reason == "nothing fused" and "Softmax" not in out.ops
    assert sum(out.ops.values()) == len(case.model.graph.node)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in ROPE])
def test_expanded_rotary_embeddings_inside_an_attention_read_back_as_ops(case):
    """The RotaryEmbedding body on Q and K of an attention (interleaved, partial, 3-D, without position ids): read
    as the site's rope by what it computes, written back as one RotaryEmbedding op per rotated input with the op's
    attributes and caches, the attention fused; the written op reproduces onnx's reference output."""
    model, feeds = inside_attention(case)
    onnx.checker.check_model(model, full_check=True)
    result = fuse_model(model, inputs=GivenInputs(case.name, [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.verification.passed, r.reason
    rope = r.site.rope
    assert rope is not None and rope.op_caches, rope
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == 1 and ops["RotaryEmbedding"] == 2 and not ops["Split"] and not ops["Gather"], ops
    want = {a.name: onnx.helper.get_attribute_value(a) for a in op_node(case).attribute}
    rotations = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    for n in rotations:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert {k: v for k, v in attrs.items() if v} == {k: v for k, v in want.items() if v}, (attrs, want)
        assert list(n.input[1:]) == [i for i in ("cos_cache", "sin_cache", "position_ids") if i in case.inputs]
    out = fuse_rotation_case(case)  # the case's own input as Q: the op written on Q gives onnx's reference output
    assert out.fused and out.within, f"{case.name}: max abs error {out.max_abs_err} against onnx's reference"


def test_expanded_rotary_embedding_on_projections_with_stored_caches_and_dynamic_dims():
    """As an exporter writes it: Q and K projected from hidden states ([batch, seq] symbolic), the caches stored
    as initializers, only the positions an input. The rotation is still read by value and written as the op."""
    (case,) = [c for c in ROPE if c.name == "rotary_embedding_with_interleaved_rotary_dim_expanded"]
    model, feeds = inside_attention(case)
    b, n, s, h = case.inputs["input"].shape
    rng = np.random.default_rng(1)
    graph = model.graph
    for name in ("cos_cache", "sin_cache"):
        graph.initializer.append(onnx.numpy_helper.from_array(feeds.pop(name), name))
    projections = []
    for side in "qkv":
        graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal((n * h, n * h)).astype(np.float32),
                                                              f"w_{side}"))
        projections += [onnx.helper.make_node("MatMul", ["hidden", f"w_{side}"], [f"{side}_flat"]),
                        onnx.helper.make_node("Reshape", [f"{side}_flat", "heads_shape"], [f"{side}_bsnh"]),
                        onnx.helper.make_node("Transpose", [f"{side}_bsnh"], [side], perm=[0, 2, 1, 3])]
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([0, 0, n, h], np.int64), "heads_shape"))
    nodes = projections + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [i for i in graph.input if i.name == "position_ids"]
    del graph.input[:]
    graph.input.extend([onnx.helper.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, ["batch", "seq", n * h]),
                        *kept])
    graph.input[1].type.tensor_type.shape.dim[0].dim_param = "batch"
    graph.input[1].type.tensor_type.shape.dim[1].dim_param = "seq"
    del graph.output[:]
    graph.output.append(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", n, "seq", h]))
    onnx.checker.check_model(model, full_check=True)
    feeds = {"hidden": rng.standard_normal((b, s, n * h)).astype(np.float32), "position_ids": feeds["position_ids"]}
    result = fuse_model(model, inputs=GivenInputs(case.name, [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.verification.passed, r.reason
    assert r.site.rope is not None and r.site.rope.op_caches and r.site.rope.interleaved
    rotations = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(rotations) == 2 and all(list(n.input[1:]) == ["cos_cache", "sin_cache", "position_ids"]
                                       for n in rotations)


def test_positions_shared_over_the_batch_are_not_read_as_the_op():
    """position_ids [1, S] the body broadcasts over a batch of 2: the op takes [B, S], so the rotation is not
    read as it (the probes, at the graph's own shapes, disagree) and stays as written; the attention fuses."""
    (case,) = [c for c in ROPE if c.name == "rotary_embedding_expanded"]
    model, feeds = inside_attention(case)
    pos = next(i for i in model.graph.input if i.name == "position_ids")
    pos.type.tensor_type.shape.dim[0].dim_value = 1
    feeds["position_ids"] = feeds["position_ids"][:1]
    onnx.checker.check_model(model, full_check=True)
    result = fuse_model(model, inputs=GivenInputs(case.name, [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.verification.passed, r.reason
    assert r.site.rope is None
    assert not any(n.op_type == "RotaryEmbedding" for n in result.model.graph.node)


def test_a_rotation_that_does_not_verify_is_left_as_written(monkeypatch):
    """Should the written RotaryEmbedding ops not verify (here: written with the wrong pairing on purpose), the
    site is fused again with the rotation left as the graph computes it, and says so."""
    import dataclasses

    import trtattn.rewrite.fuse as fuse
    from trtattn.rewrite.rope import write_rotations

    def wrong_pairing(graph, tensors, site):
        rope = dataclasses.replace(site.rope, interleaved=not site.rope.interleaved) if site.rope else None
        return write_rotations(graph, tensors, site.replace(rope=rope))

    monkeypatch.setattr(fuse, "write_rotations", wrong_pairing)
    (case,) = [c for c in ROPE if c.name == "rotary_embedding_expanded"]
    model, feeds = inside_attention(case)
    result = fuse_model(model, inputs=GivenInputs(case.name, [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.verification.passed, r.reason
    assert r.site.rope is None and any("did not verify" in n for n in r.site.notes)
    assert not any(n.op_type == "RotaryEmbedding" for n in result.model.graph.node)


def test_a_look_alike_that_does_not_rotate_is_not_read_as_the_op():
    """The body with its Sub turned into an Add (cos.x1 + sin.x2: the same ops and tables, not a rotation) is
    decided by value: not read as a RotaryEmbedding, left as written, and the attention still fuses."""
    (case,) = [c for c in ROPE if c.name == "rotary_embedding_expanded"]
    model, feeds = inside_attention(case)
    subs = [n for n in model.graph.node if n.op_type == "Sub" and n.output[0].endswith("_Real")]
    assert len(subs) == 2
    for n in subs:
        n.op_type = "Add"
    result = fuse_model(model, inputs=GivenInputs(case.name, [feeds]))
    (r,) = result.reports
    assert r.status == "fused" and result.verification.passed, r.reason
    assert r.site.rope is None and not any("did not verify" in n for n in r.site.notes)  # never read, not dropped
    assert not any(n.op_type == "RotaryEmbedding" for n in result.model.graph.node)


def test_no_case_is_read_as_cross_attention():
    """Every case gives Q, K and V as graph inputs: nothing in the graph says they come from two hidden states, so
    no site is cross-attention; over a past concatenated with the new keys it is self-attention over a cache,
    elsewhere its kind is unknown. The op's cases and their expanded bodies read alike."""
    from trtattn.match import match

    kinds = collections.Counter()
    for case in {c.name: c for c in ATTENTION + conformance_cases("Attention", expanded=False)}.values():
        for site in match(case.model).sites:
            kinds[site.kind.value, site.cache.value == "concat"] += 1
    assert kinds[("self", True)] >= 20 and kinds[("unknown", False)] >= 60
    assert set(kinds) == {("self", True), ("unknown", False)}, kinds


def test_the_packed_form_names_why_graph_input_queries_and_keys_are_not_packed():
    """Packing reads Q and K as one sequence's tokens: with both given as graph inputs nothing says so."""
    from trtattn.errors import TrtattnError
    from trtattn.routes.prepare.pipeline import prepare

    case = next(c for c in ATTENTION if c.name == "attention_3d_expanded")
    with pytest.raises(TrtattnError, match="Q and K are graph inputs"):
        prepare(case.model, name="case", form="packed", precision="fp32")
