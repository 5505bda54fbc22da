"""rewrite/lower: ONNX Runtime's layer norms and MatMulNBits as standard ONNX, each lowering checked on ONNX
Runtime against the op (issue 34: AutoCast, the precision table and TensorRT's parser know standard ONNX only)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from trtattn.errors import TrtattnError
from trtattn.graph.validate import findings
from trtattn.rewrite.lower import CannotLower, lower_contrib
from trtattn.rewrite.lower import nbits as nbits_mod
from trtattn.testing import contrib_ops


def _feeds(model: onnx.ModelProto, seeds=(0, 1)) -> list[dict]:
    shapes = {i.name: [d.dim_value or 3 for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    return [{k: np.random.default_rng(s).standard_normal(v).astype(np.float32) for k, v in shapes.items()}
            for s in seeds]


def _run(model: onnx.ModelProto, feeds: dict, level: str = "default") -> list[np.ndarray]:
    options = ort.SessionOptions()
    if level == "basic":  # the default level fuses DequantizeLinear + MatMul back into MatMulNBits
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _standard(model: onnx.ModelProto) -> bool:
    return all(n.domain in ("", "ai.onnx") and onnx.defs.has(n.op_type) for n in model.graph.node)


NORM_CASES = [("SkipLayerNormalization", (0,)), ("SkipLayerNormalization", (0, 1, 2, 3)),
              ("SkipSimplifiedLayerNormalization", (0, 3)), ("SkipSimplifiedLayerNormalization", (0, 2, 3)),
              ("SimplifiedLayerNormalization", (0,)), ("SimplifiedLayerNormalization", (0, 1))]


@pytest.mark.parametrize("op,outputs", NORM_CASES)
@pytest.mark.parametrize("epsilon", [None, 1e-6])
def test_layer_norms_lower_to_standard_ops_exactly(op, outputs, epsilon):
    """Every output a model reads (the residual sum the next layer takes, mean, inv_std_var) is computed;
    without an epsilon attribute the op's own default is used (inputs of 1e-3: epsilon matters)."""
    attributes = {} if epsilon is None else {"epsilon": epsilon}
    model = contrib_ops.norm_model(op, outputs=outputs, **attributes)
    feeds = [{k: v * 1e-3 for k, v in f.items()} for f in _feeds(model)]
    lowered = lower_contrib(model, feeds)
    assert lowered is not None and _standard(lowered.model)
    assert {o.version for o in lowered.model.opset_import if o.domain == ""} == {23}
    assert [c.op.split(":")[1] for c in lowered.checks] == [op]
    assert not findings(lowered.model)  # structure and ONNX's strict inference
    for f in feeds:
        for want, got in zip(_run(model, f), _run(lowered.model, f)):
            assert want.shape == got.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_skip_simplified_mean_is_refused_when_read():
    """ONNX Runtime's kernel leaves SkipSimplifiedLayerNormalization's mean output zero: nothing to lower it to."""
    model = contrib_ops.norm_model("SkipSimplifiedLayerNormalization", outputs=(0, 1))
    with pytest.raises(CannotLower, match="skipsimplifiedlayernormalization.*output 1"):
        lower_contrib(model, _feeds(model))


@pytest.mark.parametrize("k,block", [(32, 16), (40, 16), (64, 32)])
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_nbits_lowers_to_blocked_dequantize_and_matmul(k, block, zero_points, bias):
    """At accuracy level 0 ONNX Runtime's op computes in fp32: the lowering equals it to rounding, and equals
    the weight the codes stand for (K not a multiple of the block: B padded). Symmetric weights (no zero
    points) are int4 without a zero point, others uint4 with theirs."""
    model, weight = contrib_ops.matmul_nbits_model(k, 24, block, zero_points=zero_points, bias=bias, accuracy_level=0)
    feeds = _feeds(model)
    lowered = lower_contrib(model, feeds)
    assert lowered is not None and _standard(lowered.model)
    (dq,) = [n for n in lowered.model.graph.node if n.op_type == "DequantizeLinear"]
    assert {a.name: helper.get_attribute_value(a) for a in dq.attribute} == {"axis": 0, "block_size": block}
    weights = {t.name: t for t in lowered.model.graph.initializer}
    assert weights[dq.input[0]].data_type == (onnx.TensorProto.UINT4 if zero_points else onnx.TensorProto.INT4)
    assert list(weights[dq.input[0]].dims) == [k, 24] and len(dq.input) == (3 if zero_points else 2)
    assert not any(name.endswith(".B") for name in weights)  # the packed weight is gone
    for f in feeds:
        (want,) = _run(model, f)
        (got,) = _run(lowered.model, f, level="basic")
        product = f["a"] @ weight.astype(np.float64)
        if bias:
            product = product + numpy_helper.to_array(weights["bias"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, product, rtol=1e-5, atol=1e-5)
    assert lowered.checks[0].worst <= 1.0


def test_matmul_nbits_at_accuracy_level_4_is_checked_within_the_int8_rounding_of_a():
    """ONNX Runtime's CPU kernel rounds A to int8 per block at accuracy level 4: the lowering (exact) differs from
    the op by more than fp32 rounding, within the bound evaluated from A, and the note says why."""
    model, weight = contrib_ops.matmul_nbits_model(64, 24, 16, accuracy_level=4)
    feeds = _feeds(model)
    lowered = lower_contrib(model, feeds)
    check = lowered.checks[0]
    (want,) = _run(model, feeds[0])
    exact = feeds[0]["a"] @ weight.astype(np.float64)
    assert check.max_abs_err == pytest.approx(max(float(np.abs(want - exact).max()), 0.0), rel=1e-3, abs=1e-6)
    assert check.max_abs_err > 1e-4 and check.worst <= 1.0  # int8 A, not fp32 rounding
    assert "accuracy_level 4" in check.why and "int8" in lowered.note()


def test_a_bound_too_tight_fails_naming_the_node(monkeypatch):
    """The check can fail: at accuracy level 4 against the fp32 rounding bound only."""
    model, _ = contrib_ops.matmul_nbits_model(64, 24, 16, accuracy_level=4)
    monkeypatch.setattr(nbits_mod, "INT8_ACTIVATIONS", -1)  # ours: the level no longer allowed int8 rounding
    with pytest.raises(TrtattnError, match="MatMulNBits node 'w/MatMulNBits'.*times its bound"):
        lower_contrib(model, _feeds(model))


def test_act_order_groups_are_refused_naming_the_node():
    model, _ = contrib_ops.matmul_nbits_model(32, 8, 16, zero_points=True, accuracy_level=0)
    node = model.graph.node[0]
    g_idx = np.arange(32, dtype=np.int32)[::-1] // 16
    model.graph.initializer.append(numpy_helper.from_array(g_idx, "g_idx"))
    node.input.append("g_idx")
    with pytest.raises(CannotLower, match="w/MatMulNBits.*g_idx"):
        lower_contrib(model, _feeds(model))


def test_nothing_to_lower_is_none():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    assert lower_contrib(helper.make_model(graph), []) is None
