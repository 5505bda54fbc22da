"""rewrite/window_cache.py: GroupQueryAttention's fixed window buffer (sliding_window_cache=1, GenAI's Gemma 2/3
sliding layers) as the standard Attention op plus a gather, against ONNX Runtime's kernel at many lengths."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from trtattn.rewrite.fuse import fuse_model
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


def test_decoding_step_by_step_reads_its_own_buffer(pair):
    """A prompt longer than W, then single tokens, each step fed the previous present: the fused model's buffer
    stays the kernel's (the next step's outputs agree)."""
    original, fused, packed = pair
    feeds = _feeds(0, W + 3, seed=1, packed=packed)
    states = [feeds["past_key"], feeds["past_value"]], [feeds["past_key"], feeds["past_value"]]
    total = W + 3
    for step in range(W + 2):
        outs = []
        for session, state in zip((original, fused), states):
            f = {**feeds, "past_key": state[0], "past_value": state[1]}
            outs.append(session.run(None, f))
            state[:] = outs[-1][1:]
        np.testing.assert_allclose(outs[1][0], outs[0][0], atol=1e-5)
        np.testing.assert_allclose(outs[1][1], outs[0][1], atol=1e-6)
        feeds = {**_feeds(total, 1, seed=100 + step, packed=packed)}
        total += 1


def test_a_buffer_of_another_size_is_refused_by_name():
    """The kernel's buffer of more than W slots is not pinned down: a static one is refused at conversion, a
    dynamic one fails in a node that names the buffer (not read with another layout)."""
    model = group_query_model(local_window_size=W, sliding_window_cache=1)
    result = fuse_model(model)
    with pytest.raises(Exception, match="past_key_has_4_slots"):
        _session(result.model).run(None, group_query_feeds(1, 1, W + 2))
    static = group_query_model(local_window_size=W, sliding_window_cache=1)
    for i in static.graph.input:
        if i.name.startswith("past_"):
            i.type.tensor_type.shape.dim[2].dim_value = W + 2
    (report,) = fuse_model(static, dims={"past": W + 2}).reports
    assert "has 6 slots, not local_window_size 4" in report.reason


def test_a_window_buffer_with_an_attention_bias_is_refused():
    """attention_bias columns over a window buffer are not pinned down: listed with why, not fused."""
    model = group_query_model(local_window_size=W, sliding_window_cache=1)
    model.graph.node[-1].input.extend(["", "", "", "bias"])
    model.graph.input.append(helper.make_tensor_value_info("bias", 1, [1, 1, "s", "t"]))
    (report,) = fuse_model(model, dims={"past": W, "t": W + 8}).reports
    assert "window buffer and has an attention_bias" in report.reason
