"""Issue 34: a Conformer-style attention (ONNX Runtime's optimizer generators) and a tf2onnx Einsum attention,
built by hand; ONNX Runtime runs each, and fuse fuses its one attention, verified. The zoo's GPT-2 slimmed and
converted to fp16 by onnxconverter-common, without and with a cache."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import trtattn
from trtattn.cli import main
from trtattn.testing.converted_graphs import conformer_attention, einsum_attention, slimmed_fp16_gpt2

MODELS = {"conformer": lambda: conformer_attention(),
          "conformer_shared_qk": lambda: conformer_attention(shared_qk=True, past=3),
          "einsum_10000": lambda: einsum_attention(),
          "einsum_1e9": lambda: einsum_attention(fill=-1e9),
          "einsum_float_min": lambda: einsum_attention(fill=float(np.finfo(np.float32).min))}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_converted_attention_is_fused_and_verified(name):
    model = MODELS[name]()
    ort.InferenceSession(model.SerializeToString())  # the reference runs it as written
    result = trtattn.fuse(model)
    assert result.ok, [r.reason for r in result.reports]
    assert [r.status.value for r in result.reports] == ["fused"]


def _initializers(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("fill", [-10000.0, -1e9])
def test_einsum_attention_computes_keras_attention_with_its_fill(fill):
    """The graph is the attention it claims: scores scaled by 1/sqrt(head), the mask added as (1 - m) * fill."""
    model, rng = einsum_attention(fill=fill), np.random.default_rng(1)
    w = _initializers(model)
    assert float(w["fill"]) == fill
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    mask = np.ones((2, 5), np.float32)
    mask[1, 3:] = 0
    q, k, v = (np.einsum("bfd,dnh->bfnh", x, w[f"{t}.w"]) for t in "qkv")
    scores = np.einsum("btnh,bfnh->bnft", k, q / np.sqrt(8)) + ((1 - mask) * fill)[:, None, None, :]
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.einsum("bfnh,nhd->bfd", np.einsum("bnft,btnh->bfnh", probs, v), w["o.w"])
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "mask": mask})[0]
    assert np.abs(got - want).max() < 1e-4


@pytest.mark.parametrize("shared_qk", [False, True])
def test_conformer_attention_appends_the_new_keys_to_its_cache(shared_qk):
    """The caches grow by `seq` positions, the new keys last; with shared_qk, K is projected with Q's weight."""
    past, seq = 3, 4
    model, rng = conformer_attention(past=past, seq=seq, shared_qk=shared_qk), np.random.default_rng(2)
    feeds = {"x0": rng.standard_normal((1, seq, 16)), "x1": rng.standard_normal((1, seq, 16)),
             "cache_k": rng.standard_normal((1, 2, past, 8)), "cache_v": rng.standard_normal((1, 2, past, 8)),
             "pos": np.zeros((1, 2, seq, past + seq))}
    feeds = {n: a.astype(np.float32) for n, a in feeds.items()}
    names = [o.name for o in model.graph.output]
    out = dict(zip(names, ort.InferenceSession(model.SerializeToString()).run(None, feeds)))
    assert out["out_cache_k"].shape == out["out_cache_v"].shape == (1, 2, past + seq, 8)
    assert np.array_equal(out["out_cache_k"][:, :, :past], feeds["cache_k"])
    w = _initializers(model)
    h = feeds["x0"] + feeds["x1"]  # SkipLayerNormalization of x0 + x1 feeds Q, K and V
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * w["ln.w"] + w["ln.b"]
    k_weight = w["q.w"] if shared_qk else w["k.w"]
    k_new = (h @ k_weight + w["k.b"]).reshape(1, seq, 2, 8).transpose(0, 2, 1, 3)
    assert np.abs(out["out_cache_k"][:, :, past:] - k_new).max() < 1e-4


def _converters():
    for name in ("onnxslim", "onnxconverter_common", "transformers", "torch"):
        pytest.importorskip(name)


def test_slimmed_fp16_gpt2_is_fused_and_keeps_its_fp32_outputs(tmp_path):
    """onnxslim then onnxconverter-common's fp16 with keep_io_types: the fp32 output is a Cast of the fp16 graph's
    (was: 'the rewritten model does not run: Type (tensor(float16)) of output arg (last_hidden_state) ... does not
    match'). Both sites fused and verified; the written model's output is fp32, near the original's."""
    _converters()
    model = slimmed_fp16_gpt2(cache=False)
    source, out = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    onnx.save(model, source)
    assert main(["-q", "fuse", str(source), "-o", str(out)]) == 0
    feeds = {"input_ids": np.arange(10, dtype=np.int64).reshape(2, 5) % 100,
             "attention_mask": np.ones((2, 5), np.int64)}
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-2)


@pytest.mark.slow
def test_slimmed_fp16_gpt2_with_a_cache_is_refused_as_onnx_runtime_refuses_it(tmp_path, capsys):
    """With present outputs the converter writes an invalid model: it renames the present's producer and casts it
    back to fp32 for the output, but the attention inside still reads the fp32 name as fp16. ONNX Runtime refuses
    it, so fuse refuses it at read with ONNX Runtime's own reason, not at the dims search or after a rewrite."""
    _converters()
    model = slimmed_fp16_gpt2(cache=True)
    with pytest.raises(Exception, match="Type Error"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    onnx.save(model, tmp_path / "model.onnx")
    capsys.readouterr()
    assert main(["-q", "fuse", str(tmp_path / "model.onnx"), "-o", str(tmp_path / "out.onnx")]) == 2
    error = capsys.readouterr().err
    assert "ONNX Runtime refuses it too" in error and "Transpose" in error and "does not run at" not in error
