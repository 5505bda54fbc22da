"""`trtattn fuse` on GenAI builder-shaped models with no --dims: the dims come from the model's own ops, the sites are
verified at a prefill (empty cache) and at a step over a past, and the written model gives the original's logits
and caches on ONNX Runtime at both."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trtattn.cli import main
from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder, genai_feeds
from trtattn.testing.gqa_fusion_graphs import (
    fused_rotary_gqa,
    onnxscript_fused,
    onnxscript_test_feeds,
    onnxscript_test_gqa,
    onnxscript_test_sliced_gqa,
    onnxscript_test_standard_gqa,
    rotary_gqa_feeds,
    unfused_rotary_gqa,
)


def _fuse(tmp_path, spec: GenaiSpec, *extra: str) -> tuple[int, dict, str]:
    source, out, report = tmp_path / "model.onnx", tmp_path / "fused.onnx", tmp_path / "report.json"
    onnx.save(genai_decoder(spec), source)
    code = main(["-q", "fuse", str(source), "-o", str(out), "--report", str(report), *extra])
    return code, json.loads(report.read_text()) if report.exists() else {}, str(out)


def _same_outputs(spec: GenaiSpec, fused: str, atol: float) -> None:
    original = ort.InferenceSession(genai_decoder(spec).SerializeToString(), providers=["CPUExecutionProvider"])
    rewritten = ort.InferenceSession(fused, providers=["CPUExecutionProvider"])
    assert not any(n.op_type == "GroupQueryAttention" for n in onnx.load(fused).graph.node)
    for batch, new, past in ((2, 8, 0), (1, 1, 9), (1, 5, 4)):
        feeds = genai_feeds(spec, batch=batch, new=new, past=past, seed=3)
        for a, b in zip(original.run(None, feeds), rewritten.run(None, feeds)):
            np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), atol=atol)


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-4),
                                        pytest.param("float16", 2e-2, marks=pytest.mark.slow)])
def test_fuse_without_dims_verifies_at_prefill_and_decode(tmp_path, dtype, atol):
    spec = GenaiSpec(dtype=dtype)
    code, report, fused = _fuse(tmp_path, spec)
    assert code == 0, report
    assert [s["status"] for s in report["sites"]] == ["fused", "fused"]
    dims = report["dims"]
    assert dims["values"]["past_sequence_length"] > 0 and dims["values"]["kv_cache_dim"] == 16
    assert [d["past_sequence_length"] for d in dims["also_verified_at"]] == [0]
    assert report["verification"]["passed"] and report["verification"]["iterations"] == 3
    _same_outputs(spec, fused, atol)


def test_fuse_at_an_empty_past_the_user_gives(tmp_path):
    code, report, _ = _fuse(tmp_path, GenaiSpec(layers=1), "--dims", "past_sequence_length=0")
    assert code == 0, report
    assert report["dims"]["values"]["past_sequence_length"] == 0 and "also_verified_at" not in report["dims"]


@pytest.mark.parametrize("name,make", [("fused-packed", lambda: fused_rotary_gqa(packed=True)),
                                       ("unfused", unfused_rotary_gqa)])
def test_fuse_onnxscript_style_gqa_without_dims(tmp_path, name, make):
    """GQA with its rotary tables as inputs, fused and unfused, as onnxscript's fusion tests write it: exit 0, the
    written model equal to the original at a step over a past (batch 1, max_seqlen = P + S)."""
    source, out = tmp_path / f"{name}.onnx", tmp_path / "out.onnx"
    onnx.save(make(), source)
    assert main(["-q", "fuse", str(source), "-o", str(out)]) == 0
    feeds = rotary_gqa_feeds(past=5, new=3, packed=name == "fused-packed", seed=1)
    original = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    fused = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(original, fused):
        np.testing.assert_allclose(b, a, atol=1e-4)


_ONNXSCRIPT_TESTS = {"phi": dict(), "gemma-before": dict(norm="before_transpose"),
                     "gemma-after": dict(norm="after_transpose"),
                     "gemma-before-no-past": dict(norm="before_transpose", past=False),
                     "gemma-after-no-past": dict(norm="after_transpose", past=False),
                     "no-rotary": dict(rotary=False, mask=False)}
_FAST = {("phi", False), ("gemma-after-no-past", True), ("gemma-before", False)}


@pytest.mark.parametrize("name,fused", [pytest.param(n, f, marks=() if (n, f) in _FAST else pytest.mark.slow)
                                        for n in [*_ONNXSCRIPT_TESTS, "sliced-qkv"] for f in (False, True)
                                        if not (f and n == "no-rotary")])
def test_fuse_onnxscript_gqa_test_models_without_dims(tmp_path, name, fused):
    """onnxscript's GQA fusion test models (gqa_test.py's Phi and Gemma sources with and without a past,
    gqa_packed_qkv_test's sliced QKV) and what onnxscript's own fusions make of them, as a user runs them: exit 0,
    every site fused, the written model equal to the original at the tests' sizes (was: exit 2 at the dims search,
    'Scale and (optional) bias must match X.shape[axis:]' with Dh guessed 8, and batch 8 or a past where only
    batch 1 and an empty past run)."""
    source = onnxscript_test_sliced_gqa() if name == "sliced-qkv" else onnxscript_test_gqa(**_ONNXSCRIPT_TESTS[name])
    if fused:
        pytest.importorskip("onnxscript")
        source = onnxscript_fused(source)
    path, out, report = tmp_path / "model.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    onnx.save(source, path)
    assert main(["-q", "fuse", str(path), "-o", str(out), "--report", str(report)]) == 0
    assert {s["status"] for s in json.loads(report.read_text())["sites"]} == {"fused"}
    feeds = onnxscript_test_feeds(source, past=0 if "no-past" in name else 16, seed=2)
    original = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    rewritten = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(original, rewritten):
        np.testing.assert_allclose(b, a, atol=1e-4)


def test_fuse_the_standard_gqa_test_source(tmp_path):
    """rules/fusion/_gqa_test.py's opset-23 Attention over key/value heads broadcast by Expand: fused, verified,
    the written model equal to the original."""
    source, out, report = tmp_path / "model.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    onnx.save(onnxscript_test_standard_gqa(), source)
    assert main(["-q", "fuse", str(source), "-o", str(out), "--report", str(report)]) == 0
    assert [s["status"] for s in json.loads(report.read_text())["sites"]] == ["fused"]
    rng = np.random.default_rng(4)
    feeds = {i.name: rng.random([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in onnx.load(source).graph.input}
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
