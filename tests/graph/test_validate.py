"""graph/validate.py: a written model with TensorRT's own ops, excused a check its source fails too, is loaded
as its verification runs it (ONNX Runtime with trtattn_plugins' kernels), never refused because plain ONNX
Runtime has no kernel for trt ops (issue 34: "trt:TRT_KVCacheUpdate(-1) is not a registered function/op")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.graph.validate import InvalidModelError, check_written


def _model(cache_update: bool, op: str = "TRT_KVCacheUpdate") -> onnx.ModelProto:
    """SimplifiedLayerNormalization in the default domain (ONNX Runtime's, not ONNX's: a check the source fails)
    feeding the update of a [1, 2, 8, 4] cache."""
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["update"], epsilon=1e-5)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])]
    out = "update"
    opsets = [helper.make_opsetid("", 21)]
    if cache_update:
        inputs += [helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, 8, 4]),
                   helper.make_tensor_value_info("write_indices", TensorProto.INT32, [1])]
        nodes.append(helper.make_node(op, ["past", "update", "write_indices"], ["present"], domain="trt",
                                      name="cache_update"))
        out = "present"
        opsets.append(helper.make_opsetid("trt", 1))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(4, np.float32), "gamma")])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def test_trt_ops_excused_a_check_load_through_the_plugins():
    source = _model(False)
    with pytest.raises(InvalidModelError):  # the check is not excused without a source failing it
        check_written(_model(True), "not writing m.onnx", [])
    check_written(_model(True), "not writing m.onnx", [source])  # loads with trtattn_plugins' kernels


def test_an_undocumented_trt_op_is_still_refused():
    with pytest.raises(InvalidModelError, match="TRT_KVCacheUpdat"):
        check_written(_model(True, op="TRT_KVCacheUpdat"), "not writing m.onnx", [_model(False)])
