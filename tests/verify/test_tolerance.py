"""verify/tolerance: the one tolerance table, its two named uses and the one place that loosens it."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.errors import TrtattnError
from trtattn.verify.tolerance import TOLERANCES, Check, Tolerance, loosened, tolerance, tolerance_for


def test_an_engine_is_allowed_more_than_a_rewrite_in_every_precision_both_check():
    shared = set(TOLERANCES[Check.ENGINE]) & set(TOLERANCES[Check.REWRITE])
    assert shared == {"fp32", "fp16", "bf16"}
    for precision in shared:
        engine, rewrite = tolerance(Check.ENGINE, precision), tolerance(Check.REWRITE, precision)
        assert engine.atol >= rewrite.atol and engine.rtol >= rewrite.rtol
    assert tolerance(Check.ENGINE, "fp16").atol > tolerance(Check.REWRITE, "fp16").atol  # a converted model


def test_a_precision_without_a_bound_is_refused_by_name():
    with pytest.raises(TrtattnError, match="unknown precision 'fp8'"):
        tolerance(Check.REWRITE, "fp8")


def test_loosened_widens_to_the_lower_precision_except_what_the_user_gave():
    fp32, bf16 = tolerance(Check.REWRITE, "fp32"), tolerance(Check.REWRITE, "bf16")
    assert loosened(fp32, "bf16") == bf16
    assert loosened(fp32, "bf16", (True, False)) == Tolerance(fp32.atol, bf16.rtol)
    wide = Tolerance(1.0, 1.0)
    assert loosened(wide, "bf16") == wide  # never tightened


def test_tolerance_for_reads_the_precision_the_model_computes_in_and_keeps_given_bounds():
    w = numpy_helper.from_array(np.ones((4, 4), np.float16), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 4])], [w])
    model = helper.make_model(graph)
    assert tolerance_for(model) == tolerance(Check.REWRITE, "fp16")
    assert tolerance_for(model, atol=1e-6) == Tolerance(1e-6, tolerance(Check.REWRITE, "fp16").rtol)
