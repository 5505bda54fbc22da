"""Issue 34: a Conformer-style attention (ONNX Runtime's optimizer generators) and a tf2onnx Einsum attention,
built by hand; ONNX Runtime runs each, and fuse fuses its one attention, verified. The zoo's GPT-2 slimmed and
converted to fp16 by onnxconverter-common, without and with a cache."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

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
