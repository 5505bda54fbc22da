"""Tests for the survivors of mutating last round's graph modules (benchmarks/mutate.py, base d3efd07):
graph/validate.py, graph/branches.py, graph/memory.py. Each pins an outcome the fast lane left open."""

import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.graph import validate
from trtattn.graph.validate import InvalidModelError


def _relu(opset_domain: str = "") -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(opset_domain, 17)])


# ---------------------------------------------------------------- validate.py
def test_the_default_domain_imported_as_ai_onnx_is_the_default_domain():
    """opset_import may name the default domain 'ai.onnx': a node in domain '' is then known at its version."""
    validate.structural(_relu("ai.onnx"))
    model = _relu("ai.onnx")
    model.graph.node[0].op_type = "Gelu"  # opset 20
    with pytest.raises(Exception, match="'Gelu' does not exist at opset 17"):
        validate.structural(model)


def test_a_subgraph_is_checked_and_named():
    """An If whose then-branch reads a name nothing defines: refused, naming the branch and the name."""
    model = _relu()
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    model.graph.input.append(cond)

    def branch(name, read):
        return helper.make_graph([helper.make_node("Identity", [read], [f"{name}_out"], name=f"{name}/id")], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])])

    good = branch("else_g", "y")
    model.graph.node.append(helper.make_node("If", ["c"], ["z"], name="if", then_branch=branch("then_g", "y"),
                                             else_branch=good))
    model.graph.output[0].name = "z"
    validate.check(model, "m")
    then = next(a.g for a in model.graph.node[-1].attribute if a.name == "then_branch")
    then.node[0].input[0] = "ghost"  # the then-branch reads what nothing defines
    with pytest.raises(InvalidModelError, match="m: node 'then_g/id' \\(Identity\\) reads 'ghost'"):
        validate.check(model, "m")


def _two_inputs(op: str, types: tuple, shapes: tuple) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], name="n")], "g",
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in zip("ab", types, shapes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("types,shapes", [
    ((TensorProto.FLOAT, TensorProto.INT64), ([2], [2])),  # a type the op does not take: check_type
    ((TensorProto.FLOAT, TensorProto.FLOAT), ([2], [3])),  # shapes that cannot broadcast: strict_mode
])
def test_the_full_check_refuses_what_the_structural_one_lets_through(types, shapes):
    model = _two_inputs("Add", types, shapes)
    validate.structural(model)
    with pytest.raises(InvalidModelError, match="^m: invalid ONNX \\(.*"):
        validate.check(model, "m")
    validate.check(model, "m", full=False)
