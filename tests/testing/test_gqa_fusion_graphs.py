"""trtattn/testing/gqa_fusion_graphs.py: onnxscript's GQA fusion test models, rebuilt by hand, run on ONNX Runtime
at the tests' sizes, and onnxscript's own fusions turn the unfused ones into GroupQueryAttention with the same
outputs (as its tests check)."""

import numpy as np
import onnxruntime as ort
import pytest

from trtattn.testing.gqa_fusion_graphs import (
    onnx_fused,
    onnxscript_fused,
    onnxscript_test_feeds,
    onnxscript_test_gqa,
    onnxscript_test_sliced_gqa,
    onnxscript_test_standard_gqa,
)

SOURCES = {"phi": lambda: onnxscript_test_gqa(),
           "gemma-norm-before-transpose": lambda: onnxscript_test_gqa(norm="before_transpose"),
           "gemma-norm-after-transpose": lambda: onnxscript_test_gqa(norm="after_transpose"),
           "gemma-before-no-past": lambda: onnxscript_test_gqa(norm="before_transpose", past=False),
           "gemma-after-no-past": lambda: onnxscript_test_gqa(norm="after_transpose", past=False),
           "sliced-qkv": lambda: onnxscript_test_sliced_gqa()}


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_onnxscript_fuses_each_into_group_query_attention_with_the_same_outputs(name):
    pytest.importorskip("onnxscript")
    model = SOURCES[name]()
    past = 0 if "no-past" in name else 16
    feeds = onnxscript_test_feeds(model, past=past)
    want = _run(model, feeds)
    assert [w.shape for w in want] == [(1, 8, 320), (1, 10, past + 8, 16), (1, 10, past + 8, 16)]
    fused = onnxscript_fused(model)
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("GroupQueryAttention") == 1 and "Softmax" not in ops and "Slice" not in ops
    for w, g in zip(want, _run(fused, feeds)):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_without_a_past_only_an_empty_one_runs():
    """The Gemma test without a past still reads the past's length for its positions and mask: ONNX Runtime runs it
    at P = 0 only (the mask is [S, P + S] over S keys)."""
    model = onnxscript_test_gqa(norm="after_transpose", past=False)
    with pytest.raises(Exception, match="Expand|broadcast|shape"):
        _run(model, onnxscript_test_feeds(model, past=4))


def test_the_misaligned_slices_are_refused_by_onnx_runtime():
    """gqa_packed_qkv_extended_test's key slice off the head boundary: the value is 180 wide, the key 160."""
    model = onnxscript_test_sliced_gqa(key_start=300)
    with pytest.raises(Exception, match="same hidden size as key"):
        _run(model, onnxscript_test_feeds(model))


def test_without_rotary_the_attention_runs_over_any_past():
    model = onnxscript_test_gqa(rotary=False, mask=False)
    for past in (0, 5):
        assert _run(model, onnxscript_test_feeds(model, past=past))[1].shape == (1, 10, past + 8, 16)


def test_the_standard_gqa_source_runs_and_its_onnx_fusion_is_refused_by_onnx_runtime():
    """rules/fusion/_gqa_test.py: the opset-23 source runs; onnxscript's fusion makes one Attention over the 4 kv
    heads with the past but no present, which ONNX Runtime does not run (the test itself skips that check)."""
    pytest.importorskip("onnxscript")
    model = onnxscript_test_standard_gqa()
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.random([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    assert _run(model, feeds)[0].shape == (2, 8, 4, 64)
    fused = onnx_fused(model)
    assert [n.op_type for n in fused.graph.node] == ["Attention"]
    with pytest.raises(Exception, match="past_key provided and present_key being null"):
        _run(fused, feeds)
