"""trtattn/graph/qdq_pairs.py: Q/DQ pairs written around tensors."""

from onnx import TensorProto, helper

from tests.conftest import one_node_model
from trtattn.graph.qdq_pairs import OUTPUT_DTYPE_OPSET, write_propagated_pairs


# Survivors of mutating graph/qdq_pairs.py (benchmarks/mutate.py, base 8bb4c20):
# each test pins an outcome the fast lane left open.
def test_no_pair_written_counts_zero_and_leaves_the_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = one_node_model("Relu", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                      opset=OUTPUT_DTYPE_OPSET)
    before = model.SerializeToString()
    assert write_propagated_pairs(model) == 0
    assert model.SerializeToString() == before
