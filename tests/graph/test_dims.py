"""trtattn/graph/dims.py: the dims a model's inputs take."""

import onnx
from onnx import TensorProto, helper

from tests.conftest import one_node_model
from trtattn.graph.dims import _empty_output


# Survivors of mutating graph/dims.py (benchmarks/mutate.py, base 8bb4c20):
# each test pins an outcome the fast lane left open.
def test_an_empty_input_dim_is_chosen_not_an_empty_output():
    """A dim the graph names plainly (an empty past: past = 0) is an input's, chosen; only an expression of
    the input dims below 1 (past - 1) says the run would give an empty output."""
    def model(out_dim: str) -> onnx.ModelProto:
        return one_node_model("Identity", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "past"])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_dim])])
    assert not _empty_output(model("past"), {"past": 0})
    assert _empty_output(model("past - 1"), {"past": 1})
    assert not _empty_output(model("past - 1"), {"past": 2})
