"""The quantization step after the attention of a dynamically quantized model (verify/requant.py)."""

from pathlib import Path

import onnx
import pytest

from trtattn.rewrite.fuse import fuse_model
from trtattn.verify.compare import compare_models, default_feeds
from trtattn.verify.requant import downstream_quantizers, downstream_step
from trtattn.verify.tolerance import Tolerance, requantized

QDYN = Path(__file__).parents[1] / "data" / "foreign" / "bert.ort-qdyn.onnx"


@pytest.fixture(scope="module")
def fused():
    model = onnx.load(QDYN)
    return model, fuse_model(model)


def test_dynamically_quantized_encoder_fuses_with_reason(fused):
    model, result = fused
    assert result.ok
    assert "DynamicQuantizeLinear" in (result.verification.tolerance_why or "")
    sites = [r.site.output for r in result.reports]
    step = downstream_step(model, sites, default_feeds(model))
    assert step > 0 and result.verification.atol > step


def test_wrong_scale_still_refused(fused):
    model, result = fused
    broken = onnx.ModelProto()
    broken.CopyFrom(result.model)
    for node in broken.graph.node:
        if node.op_type == "Attention":
            for a in node.attribute:
                if a.name == "scale":
                    a.f *= 2.0
    outcome = compare_models(model, broken, [r.site for r in result.reports])
    assert outcome.why  # the loosened bound, and still the wrong scale fails it
    assert not outcome.passed


def test_fp32_without_quantization_keeps_its_bound():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Softmax", ["x"], ["s"]),
                                    onnx.helper.make_node("Relu", ["s"], ["y"])], "g", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    assert downstream_quantizers(model, ["s"]) == []
    assert downstream_step(model, ["s"], default_feeds(model)) == 0.0
    tol = Tolerance(1e-4, 1e-4)
    assert requantized(tol, 0.0) == tol
    assert requantized(tol, 0.5, atol_given=True) == tol
    assert requantized(tol, 0.5) == Tolerance(1e-4 + 0.5, 1e-4)
