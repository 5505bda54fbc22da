"""trtattn/verify/compare.py: comparing a rewritten model with its original, and the tolerances."""

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from tests.conftest import scaled_initializer
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model
from trtattn.verify import compare_models, tolerance_for
from trtattn.verify.compare import max_abs_error


# Survivors of mutating verify/compare.py (benchmarks/mutate.py, base 8bb4c20):
# each test pins an outcome the fast lane left open.
def test_the_max_abs_error_is_the_largest_difference():
    assert max_abs_error([1.0, 2.0, -np.inf], [1.0, 2.5, -np.inf]) == 0.5
    assert max_abs_error([[3.0, 0.0]], [[1.0, 0.0]]) == 2.0


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def fp16_block() -> onnx.ModelProto:
    """attention_model's block with its weights, input and output in fp16 (a model that computes in fp16)."""
    model = attention_model()
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        if value.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(value.astype(np.float16), init.name))
    for v in (model.graph.input[0], model.graph.output[0]):
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def test_fp16_rewrite_tolerance_catches_a_projection_off_by_ten_percent():
    """verify/tolerance.py (Check.REWRITE, fp16): the fused fp16 block passes (0.001), the same block with its
    Q projection scaled by 1.1 fails (0.09 against a bound of 0.028); x10 the tolerance, it passed."""
    model = fp16_block()
    atol, rtol = tolerance_for(model)
    fused = fuse_model(model)
    assert fused.ok and [r.status for r in fused.reports] == ["fused"]
    q_proj = model.graph.node[0].input[1]  # x @ Wq: the first MatMul
    assert model.graph.node[0].op_type == "MatMul"
    outcome = compare_models(model, scaled_initializer(model, q_proj, 1.1), atol=atol, rtol=rtol)
    assert not outcome.passed and min(outcome.output_errors.values()) > 0.05, outcome.summary()
