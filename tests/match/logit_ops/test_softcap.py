"""trtattn/match/logit_ops/softcap.py: cap * tanh(logits / cap), and what is not a soft-cap."""

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from tests.conftest import site_statuses
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def capped_model(outer: float, inner: float = 2.0):
    """outer * tanh(logits / inner): a soft-cap only when outer == inner."""
    g = gs.import_onnx(attention_model(softcap=inner))
    tanh = next(n for n in g.nodes if n.op == "Tanh")
    mul = tanh.outputs[0].outputs[0]
    mul.inputs[1 if mul.inputs[0] is tanh.outputs[0] else 0] = gs.Constant("outer", np.asarray(outer, np.float32))
    return gs.export_onnx(g)


def test_tanh_scaled_by_another_value_than_it_divides_by_is_not_a_softcap():
    """softcap.py:33 (b == a): Attention's softcap is a * tanh(x / a); 3 * tanh(x / 2) is something else."""
    assert [s for s, _ in site_statuses(fuse_model(capped_model(2.0)))] == ["fused"]
    result = fuse_model(capped_model(3.0))
    [(status, reason)] = site_statuses(result)
    assert status == "not fused" and "not a soft-cap" in reason and not result.ok, reason


def _softcap_written(cap: float, inner: str):
    """cap * tanh(logits * (1/cap)) with the constant on the left or right (inner="mul_left"/"mul_right"), or
    cap * tanh(logits / d)
    with d a constant 0 (inner="div_zero") or a tensor computed from the input (inner="div_tensor")."""
    g = gs.import_onnx(attention_model(softcap=cap))
    div = next(n for n in g.nodes if n.op == "Div" and n.outputs[0].outputs[0].op == "Tanh")
    if inner in ("mul_left", "mul_right"):
        inputs = [gs.Constant("inv_cap", np.asarray(1 / cap, np.float32)), div.inputs[0]]
        div.op, div.inputs = "Mul", inputs if inner == "mul_left" else inputs[::-1]
    elif inner == "div_zero":
        div.inputs[1] = gs.Constant("zero_cap", np.asarray(0.0, np.float32))
    else:  # a scalar computed from the activations: not a constant
        x = g.inputs[0]
        mean = gs.Variable("x_mean", dtype=np.float32)
        g.nodes.append(gs.Node("ReduceMean", attrs={"keepdims": 0}, inputs=[x], outputs=[mean]))
        div.inputs[1] = mean
    return gs.export_onnx(g)


def test_softcap_forms_and_what_is_not_one():
    """softcap.py:28-34: the cap as Mul by 1/cap with the constant first (the loop over both Mul inputs),
    a cap of 1; a Tanh of the logits divided by 0 or by a tensor is listed, not a crash."""
    for cap, inner in ((2.0, "mul_left"), (2.0, "mul_right"), (1.0, "mul_left")):
        result = fuse_model(_softcap_written(cap, inner))
        assert [s for s, _ in site_statuses(result)] == ["fused"], (cap, inner, site_statuses(result))
        assert result.reports[0].site.softcap == pytest.approx(cap)
    for inner in ("div_zero", "div_tensor"):
        result = fuse_model(_softcap_written(2.0, inner))
        [(status, reason)] = site_statuses(result)
        assert status == "not fused" and "not a soft-cap" in reason, (inner, reason)
