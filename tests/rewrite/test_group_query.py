"""trtattn/rewrite/group_query.py: ONNX Runtime's GroupQueryAttention as the standard op."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.contrib_graphs import group_query_feeds, group_query_model
from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder, shared_buffer_logits
from trtattn.testing.gqa_fusion_graphs import onnxscript_fused, onnxscript_test_feeds, onnxscript_test_gqa


# Survivors of mutating rewrite/group_query.py (benchmarks/mutate.py, base 8bb4c20):
# each test pins an outcome the fast lane left open.
def test_group_query_attention_without_a_past_presents_the_new_keys_and_values():
    """No past_key/past_value: the present outputs are the new K and V ([B, Nkv, S, H]), each its own."""
    model = group_query_model()
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    gqa.input[3] = gqa.input[4] = ""
    kept = [i for i in model.graph.input if i.name not in ("past_key", "past_value")]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert not any(n.op_type == "GroupQueryAttention" for n in result.model.graph.node)
    feeds = {k: v for k, v in group_query_feeds(2, 3, 0, seed=3).items() if not k.startswith("past")}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want, got = run(model), run(result.model)
    assert [w.shape for w in want] == [g.shape for g in got] == [(2, 3, 32), (2, 2, 3, 8), (2, 2, 3, 8)]
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=1e-5)


def _normed(model, name: str, head: int) -> list:
    """`name` ([B, S, width]) through a per-head RMS norm in the default domain (ONNX Runtime's
    SimplifiedLayerNormalization, which ONNX's shape inference does not know, its weight an input [Dh]): the op
    then reads a tensor of unwritten width, as onnxscript's fused Gemma models give it."""
    h = onnx.helper
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    index = list(gqa.input).index(name)
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(np.array([0, 0, -1, head], np.int64), f"{name}_heads"),
        onnx.numpy_helper.from_array(np.array([0, 0, -1], np.int64), f"{name}_merged")])
    model.graph.input.append(h.make_tensor_value_info(f"{name}_scale", onnx.TensorProto.FLOAT, ["Dh"]))
    gqa.input[index] = f"{name}_normed"
    return [h.make_node("Reshape", [name, f"{name}_heads"], [f"{name}_4d"]),
            h.make_node("SimplifiedLayerNormalization", [f"{name}_4d", f"{name}_scale"], [f"{name}_n"], axis=-1,
                        epsilon=1e-6),
            h.make_node("Reshape", [f"{name}_n", f"{name}_merged"], [f"{name}_normed"])]


def _fused_same(model, feeds) -> None:
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert not any(n.op_type == "GroupQueryAttention" for n in result.model.graph.node)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_the_head_size_from_the_past_where_the_packed_width_is_unwritten():
    """A packed QKV computed by an op shape inference does not know: the head size is the past's last axis (was:
    'the query's hidden size is unknown', not fused)."""
    model = group_query_model(packed=True)
    nodes = _normed(model, "query", 8) + list(model.graph.node)  # the norm first: topologically sorted
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    _fused_same(model, {**group_query_feeds(1, 3, 4, seed=5, packed=True),
                        "query_scale": np.linspace(0.5, 1.5, 8).astype(np.float32)})


def test_the_head_size_from_the_value_where_query_and_key_widths_are_unwritten():
    """onnxscript's fused Gemma model without a past: query and key through its norm, no past; the head size is
    the value's width over the key/value heads."""
    pytest.importorskip("onnxscript")
    model = onnxscript_fused(onnxscript_test_gqa(norm="after_transpose", past=False))
    _fused_same(model, onnxscript_test_feeds(model, past=0, seed=5))


def _shared_run(model, feeds: dict) -> dict:
    """`model` run with past_key/present_key and past_value/present_value bound to one buffer each (GenAI's
    past_present_share_buffer): its outputs, the presents being the buffers after the run."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    arrays = {kv: feeds[f"past_{kv}"].copy() for kv in ("key", "value")}  # the buffers' memory, kept alive
    buffers = {kv: ort.OrtValue.ortvalue_from_numpy(a) for kv, a in arrays.items()}
    for name, value in feeds.items():
        if not name.startswith("past_"):
            binding.bind_cpu_input(name, value)
    for kv, buffer in buffers.items():
        binding.bind_ortvalue_input(f"past_{kv}", buffer)
        binding.bind_ortvalue_output(f"present_{kv}", buffer)
    binding.bind_output("y")
    session.run_with_iobinding(binding)
    return {"y": binding.copy_outputs_to_cpu()[-1], **{f"present_{kv}": a.copy() for kv, a in arrays.items()}}


@pytest.mark.parametrize("rows, new, seqlens, total, attributes", [
    (1, 4, [3], 4, {}),  # the first prompt: a buffer of 16 slots, none valid yet
    (2, 1, [5, 9], 10, {}),  # a decode step of rows with ragged pasts (left padding)
    (1, 3, [11], 12, {}),  # a later prompt over a past of 9
    (2, 1, [5, 9], 10, {"local_window_size": 4}),  # a sliding window over absolute slots
], ids=["first-prompt", "ragged-decode", "subsequent-prompt", "window"])
def test_shared_buffer_form_equals_the_kernel_sharing_its_buffer(rows, new, seqlens, total, attributes):
    """shared_buffer: past and present one buffer of 16 slots, as GenAI binds them: the fused op attends over the
    buffer's valid slots and writes the new keys at each row's past (seqlens_k + 1 - S), every other slot kept, as
    ONNX Runtime's kernel does; the form without it cannot even be bound so (its present is 16 + S long)."""
    model = group_query_model(packed=True, **attributes)
    feeds = group_query_feeds(rows, new, 16, seqlens=seqlens, seed=5, packed=True)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    result = fuse_model(model, shared_buffer=True)
    assert result.ok, [r.row() for r in result.reports]
    want, got = _shared_run(model, feeds), _shared_run(result.model, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)
    with pytest.raises(Exception, match="present_key.* has shape"):
        _shared_run(fuse_model(model).model, feeds)


@pytest.mark.parametrize("spec", [GenaiSpec(context_length=32), GenaiSpec(context_length=32, norms="microsoft",
                                                                         window=8, sliding=(0,))],
                         ids=["global-layers", "with-a-window-layer"])
@pytest.mark.parametrize("prompt", [[5, 9, 17], list(range(3, 15))], ids=["short", "longer-than-window"])
def test_shared_buffer_decoder_decodes_as_the_original_over_one_buffer(spec, prompt):
    """A GenAI-shaped decoder fused with shared_buffer, then a prefill and 10 greedy steps with every past and
    present bound to one buffer (context_length slots; window + 16 for the window layer): the original's logits."""
    model = genai_decoder(spec)
    result = fuse_model(model, shared_buffer=True)
    assert result.ok and not any(n.op_type == "GroupQueryAttention" for n in result.model.graph.node)
    want, got = (shared_buffer_logits(m, spec, prompt, 10) for m in (model, result.model))
    assert [int(np.argmax(w)) for w in want] == [int(np.argmax(g)) for g in got]
    np.testing.assert_allclose(np.stack(got), np.stack(want), atol=1e-4)
