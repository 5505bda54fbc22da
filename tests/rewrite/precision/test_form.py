"""rewrite/precision/form.py: the record a passed precision check leaves (Prepared.precision_check)."""

import onnx

from trtattn.rewrite.precision.check import OutputError
from trtattn.rewrite.precision.form import FormPrecision


def _form(errors) -> FormPrecision:
    return FormPrecision(model=onnx.ModelProto(), precision="fp16", table={"fp16": 1.0}, kept_fp32={},
                         errors=errors, tolerance={"rel": 0.01}, runner="onnxruntime")


def test_the_summary_is_the_worst_output_of_each_measure():
    """max_rel from the output of the largest relative error, max_rel_l2 the largest of any output (another one)."""
    errors = {"a": OutputError(max_abs=0.2, rel=0.02, rel_l2=0.001, nonfinite=0, ref_max=10.0),
              "b": OutputError(max_abs=0.01, rel=0.005, rel_l2=0.004, nonfinite=0, ref_max=2.0)}
    check = _form(errors).summary()
    assert (check.precision, check.run_on, check.max_rel, check.max_rel_l2) == ("fp16", "onnxruntime", 0.02, 0.004)
    assert check.outputs == errors and check.outputs is not errors and check.inputs is None


def test_a_form_with_no_float_output_compared_reports_no_error():
    """Nothing compared (no float output): both measures are 0, not a sentinel a reader would print."""
    check = _form({}).summary()
    assert (check.max_rel, check.max_rel_l2) == (0.0, 0.0) and check.outputs == {}
