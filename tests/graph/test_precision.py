"""graph/precision: the one home of the precision names, the dtype maps and the model's precision."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.graph.precision import (
    ELEM_PRECISIONS,
    NUMPY_NAMES,
    PRECISION_ELEMS,
    ModelPrecision,
    Weighing,
    elem_precision,
    model_precision,
    numpy_precision,
)


def _weights_model(fp16_elements: int, fp32_elements: int, io_type=TensorProto.FLOAT) -> onnx.ModelProto:
    """A model holding an fp16 and an fp32 weight of the given sizes, added to its input."""
    h = numpy_helper.from_array(np.zeros(fp16_elements, np.float16), "h")
    f = numpy_helper.from_array(np.zeros(fp32_elements, np.float32), "f")
    nodes = [helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["h32"], ["hs"]), helper.make_node("ReduceSum", ["f"], ["fs"]),
             helper.make_node("Add", ["hs", "fs"], ["y"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", io_type, [])], [h, f])
    return helper.make_model(graph)


def test_the_two_weighings_disagree_only_where_no_type_holds_most_of_both_count_and_bytes():
    split = _weights_model(600, 400)  # 60% of the elements fp16, 1200 of 2800 bytes
    assert model_precision(split, Weighing.COMPUTED) == ModelPrecision("fp16", "weights")
    assert model_precision(split, Weighing.STORED) == ModelPrecision("fp32", "weights")
    clear = _weights_model(900, 100)
    assert model_precision(clear, Weighing.COMPUTED).name == model_precision(clear, Weighing.STORED).name == "fp16"


@pytest.mark.parametrize("weighing, where", [(Weighing.STORED, "outputs"), (Weighing.COMPUTED, "inputs and outputs")])
def test_a_model_without_weights_is_read_from_its_edges(weighing, where):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
    assert model_precision(helper.make_model(graph), weighing) == ModelPrecision("bf16", where)


def test_fp64_counts_as_fp32_for_the_tolerance_and_not_at_all_for_the_route():
    d = numpy_helper.from_array(np.zeros(8, np.float64), "d")
    graph = helper.make_graph([helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT16)], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [8])], [d])
    model = helper.make_model(graph)
    assert model_precision(model, Weighing.STORED) == ModelPrecision("fp32", "weights")
    assert model_precision(model, Weighing.COMPUTED) == ModelPrecision("fp16", "inputs and outputs")


def test_names_map_both_ways():
    assert all(PRECISION_ELEMS[name] == elem for elem, name in ELEM_PRECISIONS.items())
    assert all(numpy_precision(numpy) == name for name, numpy in NUMPY_NAMES.items())
    assert numpy_precision(helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN).name) == "fp8"
    assert numpy_precision("int32") is None and numpy_precision(None) is None
    assert elem_precision(TensorProto.BFLOAT16) == "bf16"
    assert elem_precision(TensorProto.DOUBLE) == "fp32"  # no attention computes in fp64: the plan's default
