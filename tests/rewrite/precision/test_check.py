"""trtattn/rewrite/precision/check.py: the precision check of a converted model against its original."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.errors import VerificationError


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def _line_and_copy(n: int, off_at: int, off_by: float):
    """An fp32 original returning x, and an fp16 candidate returning x with element `off_at` moved by `off_by`."""
    from trtattn.rewrite.precision import check

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    original = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "o", [x], [y]),
                                 opset_imports=[helper.make_opsetid("", 17)])
    delta = np.zeros(n, np.float16)
    delta[off_at] = off_by
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Add", ["x16", "delta"], ["y16"]),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    candidate = helper.make_model(helper.make_graph(nodes, "c", [x], [y], [numpy_helper.from_array(delta, "delta")]),
                                  opset_imports=[helper.make_opsetid("", 17)])
    return check, original, candidate


def test_one_element_off_by_a_tenth_of_the_largest_fails_the_precision_check():
    """check.py:63 (`or` of the max and the L2 criteria): one element of 1000 off by 10% of the largest value
    has a relative L2 error of 0.006, under its bound; the max criterion alone must fail it."""
    n = 1000
    feeds = [{"x": np.linspace(-1.0, 1.0, n, dtype=np.float32)}]
    check, original, close = _line_and_copy(n, 10, 0.0)
    assert check.verify(original, close, feeds, precision="fp16")["y"].rel < 1e-3
    _, _, wrong = _line_and_copy(n, 10, 0.1)
    with pytest.raises(VerificationError, match=r"output 'y' is off by 0\.1 .*relative L2 0\.00"):
        check.verify(original, wrong, feeds, precision="fp16")


def test_every_element_off_by_a_little_fails_on_the_l2_criterion():
    """check.py:63 (the relative-L2 half): every element off by 1.5% of the largest value is within the max
    criterion (0.02) but not the L2 one (0.026 > 0.01): a drift that is everywhere fails."""
    from trtattn.rewrite.precision import check

    n = 1000
    feeds = [{"x": np.linspace(-1.0, 1.0, n, dtype=np.float32)}]
    _, original, _ = _line_and_copy(n, 0, 0.0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Add", ["x16", "drift"], ["y16"]),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    drift = numpy_helper.from_array(np.asarray(0.015, np.float16), "drift")
    drifted = helper.make_model(helper.make_graph(nodes, "c", [x], [y], [drift]),
                                opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(VerificationError, match=r"output 'y' is off by 0\.015 .*relative L2 0\.02"):
        check.verify(original, drifted, feeds, precision="fp16")
