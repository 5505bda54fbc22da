"""graph/upgrade.py and shapes.upgrade_opset: the opset upgrade is never a refusal of a model ONNX Runtime runs
(issue 34: ONNX Runtime's transformer-optimizer test models at opset 16 were refused at read, "cannot convert the
model from opset 16 to 23: ... No Adapter From Version $16 for LayerNormalization")."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.graph.shapes import opset_of, upgrade_opset
from trtattn.graph.upgrade import upgrade_by_node
from trtattn.graph.validate import findings
from trtattn.testing import optimizer_graphs


def _layer_norm_then_reduce(opset: int = 16) -> onnx.ModelProto:
    """ONNX Runtime's own LayerNormalization below 17 (its epsilon misspelled, as ORT's optimizer tests write it),
    then ReduceMean with its axes as an attribute (an input from opset 18)."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], epsion=1e-5, name="ln"),
             helper.make_node("ReduceMean", ["ln"], ["y"], axes=[-1], name="mean")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.linspace(0.5, 2, 8, dtype=np.float32), "g"),
                               numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_onnx_runtimes_own_layer_norm_below_17_upgrades_node_by_node():
    model = _layer_norm_then_reduce()
    with pytest.raises(Exception, match="LayerNormalization"):  # ONNX's converter refuses the whole model
        onnx.version_converter.convert_version(model, 23)
    upgraded = upgrade_opset(model, 23)
    assert opset_of(upgraded) == 23 and not findings(upgraded)  # valid at 23, where the model read was not
    ops = {n.op_type: n for n in upgraded.graph.node}
    assert [a.name for a in ops["LayerNormalization"].attribute] == []  # the misspelt attribute ORT never read
    assert len(ops["ReduceMean"].input) == 2 and not ops["ReduceMean"].attribute  # axes moved to an input
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(upgraded, {"x": x})[0], _run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_nodes_unchanged_between_the_opsets_are_kept_as_they_are():
    model = _layer_norm_then_reduce(opset=18)
    model.graph.node[1].attribute.pop()
    model.graph.node[1].input.append("axes")
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    upgraded = upgrade_by_node(model, 18, 23)
    assert [n.SerializeToString() for n in upgraded.graph.node][1] == model.graph.node[1].SerializeToString()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(optimizer_graphs.models()))
def test_the_optimizers_generator_graphs_at_opset_16_are_fused(name):
    """ONNX Runtime runs each; fuse upgrades it to 23 and fuses its one attention, verified."""
    import trtattn

    model = optimizer_graphs.models()[name]
    assert opset_of(model) == 16 and any(n.op_type == "LayerNormalization" for n in model.graph.node)
    result = trtattn.fuse(model)
    assert result.ok and [r.status.value for r in result.reports] == ["fused"]
    assert any(n.op_type == "Attention" for n in result.model.graph.node) and not findings(result.model)
