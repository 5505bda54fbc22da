"""rewrite/window_cache.py: GroupQueryAttention's fixed window buffer (sliding_window_cache=1, GenAI's Gemma 2/3
sliding layers) as the standard Attention op plus a gather, against ONNX Runtime's kernel at many lengths."""

import numpy as np
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import helper

from trtattn.errors import TrtattnError
from trtattn.rewrite.fuse import fuse_model
from trtattn.rewrite.group_query import convert_group_query
from trtattn.testing.contrib_graphs import group_query_feeds, group_query_model

W = 4


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _feeds(past_len: int, new: int, seed: int, packed: bool = False) -> dict:
    """A W-slot buffer (random keys in every slot: the kernel reads only the valid ones) at an absolute past."""
    feeds = group_query_feeds(1, new, W, seed=seed, packed=packed)
    feeds["seqlens_k"] = np.array([past_len + new - 1], np.int32)
    feeds["total_sequence_length"] = np.array(past_len + new, np.int32)
    return feeds


@pytest.fixture(scope="module", params=[False, True], ids=["separate", "packed"])
def pair(request):
    model = group_query_model(local_window_size=W, sliding_window_cache=1, softcap=50.0, packed=request.param)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert not any(n.op_type == "GroupQueryAttention" for n in result.model.graph.node)
    return _session(model), _session(result.model), request.param


@pytest.mark.parametrize("past_len", [0, 1, 3, W - 1, W, 2 * W])
@pytest.mark.parametrize("new", [1, 3, W + 2])
def test_window_buffer_matches_the_kernel(pair, past_len, new):
    """Outputs everywhere; the present on its valid slots (the last min(v + S, W) keys: the kernel leaves the
    others stale), which are all W once v + S >= W."""
    original, fused, packed = pair
    feeds = _feeds(past_len, new, seed=10 * past_len + new, packed=packed)
    want, got = original.run(None, feeds), fused.run(None, feeds)
    assert [g.shape for g in got] == [w.shape for w in want] and got[1].shape[2] == W
    valid = min(min(past_len, W) + new, W)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    for w, g in zip(want[1:], got[1:]):
        np.testing.assert_allclose(g[:, :, :valid], w[:, :, :valid], atol=1e-6)


def _resident(length: int, slots: int) -> int:
    """The keys the kernel's buffer of `slots` holds after `length` (measured: rewrite/window_cache.py's r(L))."""
    return length if length < W else W + (length - W) % (slots - W + 1)


@pytest.mark.parametrize("slots", [W, W + 2, W + 3])
def test_decoding_step_by_step_keeps_the_kernels_buffer(pair, slots):
    """A prompt, single tokens and a few longer steps (one longer than W), each fed the previous present, with a
    buffer of W slots and of more (GenAI gives CPU W + 16, or max_length): the outputs agree at every step, and
    so do the presents on the slots the kernel keeps (r(total) of them; the others are stale in the kernel)."""
    original, fused, packed = pair
    buffers = {"past_key": np.zeros((1, 2, slots, 8), np.float32), "past_value": np.zeros((1, 2, slots, 8), np.float32)}
    states, past = [dict(buffers), dict(buffers)], 0
    for step, new in enumerate([2, 1, 1, 1, 1, 1, 1, 3, 1, 1, W + 1, 1, 1]):
        feeds = _feeds(past, new, seed=100 + step, packed=packed)
        outs = [session.run(None, {**feeds, **state}) for session, state in zip((original, fused), states)]
        kept = _resident(past + new, slots)
        np.testing.assert_allclose(outs[1][0], outs[0][0], atol=1e-5, err_msg=f"step {step}")
        for w, g in zip(outs[0][1:], outs[1][1:]):
            assert g.shape == w.shape == (1, 2, slots, 8)
            np.testing.assert_allclose(g[:, :, :kept], w[:, :, :kept], atol=1e-6, err_msg=f"step {step}")
        for state, out in zip(states, outs):
            state.update(past_key=out[1], past_value=out[2])
        past += new


def test_a_buffer_shorter_than_the_window_is_refused_by_name():
    """The kernel refuses a buffer of fewer than W slots: a static one is refused at conversion, a dynamic one
    fails in a node that names the buffer."""
    result = fuse_model(group_query_model(local_window_size=W, sliding_window_cache=1))
    with pytest.raises(Exception, match="past_key_has_at_least_4_slots"):
        _session(result.model).run(None, group_query_feeds(1, 1, W - 1))
    static = group_query_model(local_window_size=W, sliding_window_cache=1)
    for i in static.graph.input:
        if i.name.startswith("past_"):
            i.type.tensor_type.shape.dim[2].dim_value = W - 1
    graph = gs.import_onnx(static)
    with pytest.raises(TrtattnError, match="past_key has 3 slots, fewer than local_window_size 4"):
        convert_group_query(graph, graph.nodes[-1], "trtattn/gqa")


def test_a_window_buffer_with_an_attention_bias_is_refused():
    """attention_bias columns over a window buffer are not pinned down: listed with why, not fused."""
    model = group_query_model(local_window_size=W, sliding_window_cache=1)
    model.graph.node[-1].input.extend(["", "", "", "bias"])
    model.graph.input.append(helper.make_tensor_value_info("bias", 1, [1, 1, "s", "t"]))
    (report,) = fuse_model(model, dims={"past": W, "t": W + 8}).reports
    assert "window buffer and has an attention_bias" in report.reason
