"""A GenAI-shaped int4 layer (SimplifiedLayerNormalization, MatMulNBits, GroupQueryAttention with a past,
SkipSimplifiedLayerNormalization) through `fuse --ops trt` and `build` (issue 34, failure 3): ONNX Runtime's ops
are lowered to standard ONNX before AutoCast and the precision table, where they were refused ("AutoCast cannot
convert ops outside the ONNX domain", "precision_table cannot count the matmul work of com.microsoft:MatMulNBits"),
and `--ops trt --precision fp32` writes its model."""

from __future__ import annotations

import json

import onnx
import pytest

from trtattn.cli import main
from trtattn.testing.contrib_ops import genai_layer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def layer(tmp_path_factory):
    path = tmp_path_factory.mktemp("genai") / "layer.onnx"
    onnx.save(genai_layer(), path)
    return path


def test_ops_trt_at_fp32_writes_tensorrt_ops_over_standard_onnx(layer, tmp_path, capsys):
    out = tmp_path / "layer.trt.onnx"
    assert main(["-q", "fuse", str(layer), "-o", str(out), "--ops", "trt", "--precision", "fp32"]) == 0
    written = onnx.load(out)
    ops = {(n.domain or "", n.op_type) for n in written.graph.node}
    assert {("trt", "TRT_Attention"), ("trt", "TRT_KVCacheUpdate"), ("", "DequantizeLinear"),
            ("", "RMSNormalization")} <= ops
    assert not [op for op in ops if op[0] == "com.microsoft"]
    assert json.loads(out.with_suffix(".json").read_text())["verification"]["passed"] is True
    said = capsys.readouterr().out
    assert "2 com.microsoft:MatMulNBits as blocked DequantizeLinear + MatMul" in said
    assert "1 com.microsoft:SkipSimplifiedLayerNormalization as Add + RMSNormalization" in said


def test_build_at_the_default_precision_converts_the_lowered_form(layer, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["-q", "build", str(layer), "--plan-json", str(plan)]) == 4  # no TensorRT here: the plan, exit 4
    written = json.loads(plan.read_text())
    assert written["precision"] == "fp16" and [s["dtype"] for s in written["sites"]] == ["fp16"]
    assert sum(written["precision_table"].values()) == pytest.approx(1.0)
    assert "ONNX Runtime's own ops lowered to standard ONNX" in capsys.readouterr().out


def test_a_genai_builder_decoder_with_its_norm_ops_goes_to_tensorrt_ops_without_dims(tmp_path):
    """testing/genai_graphs' decoder with the builder's SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization
    (packed QKV, rotary inside GroupQueryAttention): --ops trt --precision fp32 writes and verifies its model."""
    from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder

    source, out = tmp_path / "model.onnx", tmp_path / "model.trt.onnx"
    onnx.save(genai_decoder(GenaiSpec(norms="microsoft")), source)
    assert any(n.op_type == "SkipSimplifiedLayerNormalization" for n in onnx.load(source).graph.node)
    assert main(["-q", "fuse", str(source), "-o", str(out), "--ops", "trt", "--precision", "fp32"]) == 0
    written = onnx.load(out)
    assert sum(n.op_type == "TRT_Attention" for n in written.graph.node) == 2
    assert not [n for n in written.graph.node if n.domain == "com.microsoft" or "Simplified" in n.op_type]
