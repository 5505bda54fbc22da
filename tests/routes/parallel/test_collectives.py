"""trtattn/routes/parallel/collectives.py: the ranks run with their collectives, checked against the original."""

import numpy as np
from onnx import TensorProto, helper

from tests.conftest import graph_model
from trtattn.routes.parallel.collectives import check_ranks


# Survivors of mutating routes/parallel (benchmarks/mutate.py): each test pins an outcome the fast lane left open.
def test_an_empty_output_matches_with_no_error():
    """An output with no elements on every rank and in the original is equal: its error is 0, within any bound."""
    model = graph_model([helper.make_node("Identity", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    check = check_ranks(model, [model, model], {}, {}, [{"x": np.zeros((0,), np.float32)}], atol=1e-4)
    assert check.errors == {"y": 0.0}
    assert check.passed
