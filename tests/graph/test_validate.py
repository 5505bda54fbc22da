"""trtattn/graph/validate.py: the checks a model read or written passes, naming the graph at fault.

graph/validate.py: a written model with TensorRT's own ops, excused a check its source fails too, is loaded
as its verification runs it (ONNX Runtime with trtattn_plugins' kernels), never refused because plain ONNX
Runtime has no kernel for trt ops (issue 34: "trt:TRT_KVCacheUpdate(-1) is not a registered function/op")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import one_node_model
from trtattn.graph import validate
from trtattn.graph.validate import InvalidModelError, check_written


# Survivors of mutating graph/validate.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
def _relu(opset_domain: str = "") -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(opset_domain, 17)])


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


def test_an_unimported_domain_is_refused_when_the_default_is_imported_as_ai_onnx():
    model = _relu("ai.onnx")
    model.graph.node.append(helper.make_node("Plugin", ["y"], ["z"], name="plug", domain="trt"))
    model.graph.output[0].name = "z"
    with pytest.raises(Exception, match="node 'plug' \\(Plugin\\) is in domain 'trt', which the model does not import"):
        validate.structural(model)


def test_a_graphs_attribute_of_a_custom_op_is_checked_too():
    """A node of a domain ONNX does not define, with a list of subgraphs (a GRAPHS attribute): each is checked."""
    spec = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    body = helper.make_graph([helper.make_node("Relu", ["ghost"], ["b"], name="body/relu")], "body", [], [spec("b")])
    model = _relu()
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    model.graph.node.append(helper.make_node("Loopish", ["y"], ["z"], name="custom", domain="com.example",
                                             bodies=[body]))
    model.graph.output[0].name = "z"
    with pytest.raises(Exception, match="node 'body/relu' \\(Relu\\) reads 'ghost'"):
        validate.structural(model)


def test_the_top_graph_and_a_subgraph_are_named_apart():
    model = _relu()
    model.graph.output[0].name = "nowhere"
    with pytest.raises(Exception, match="^graph output 'nowhere' is produced by no node$"):
        validate.structural(model)
    model = _relu()
    spec = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    empty = helper.make_graph([], "empty_branch", [], [spec("missing")])
    ok = helper.make_graph([helper.make_node("Identity", ["y"], ["o"], name="id")], "ok", [], [spec("o")])
    model.graph.node.append(helper.make_node("If", ["c"], ["z"], name="if", then_branch=empty, else_branch=ok))
    model.graph.output[0].name = "z"
    with pytest.raises(Exception, match="^subgraph 'empty_branch' output 'missing' is produced by no node$"):
        validate.structural(model)


# Survivors of mutating graph/validate.py (benchmarks/mutate.py, base 8bb4c20):
# each test pins an outcome the fast lane left open.
def test_a_model_under_protobufs_limit_is_checked_from_memory_not_its_file(tmp_path):
    """LayerNormalization at opset 16: ONNX fails it, ONNX Runtime runs it. What ONNX Runtime is asked is the model
    as read and repaired in memory; the file (here not a model at all) is opened only past protobuf's limit."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "w")]
    model = one_node_model("LayerNormalization", [x, helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], opset=16, inits=inits, axis=-1)
    path = tmp_path / "in.onnx"
    path.write_bytes(b"not a model")
    note = validate.check_read(model, path)
    assert note is not None and "ONNX Runtime loads it" in note and "LayerNormalization" in note


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


def _stale_constant_model(declared: list) -> onnx.ModelProto:
    """A [1] INT64 Constant whose value_info says `declared` (GenAI's builder says [] of its 1-element constants)."""
    const = helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array([1], np.int64), "one"))
    add = helper.make_node("Add", ["x", "one"], ["y"])
    graph = helper.make_graph([const, add], "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [3])],
                              value_info=[helper.make_tensor_value_info("one", TensorProto.INT64, declared)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_constants_stale_value_info_is_dropped_at_read_with_a_note():
    """Was: `build DIR` on a GenAI builder folder at fp32 wrote nothing ("Inferred shape and existing shape differ
    in rank: (1) vs (0)" on /model/constant_nodes/INT64/[1]) once its contrib ops were lowered and the strict
    check could see the builder's hint. ONNX Runtime takes the constant's own shape, so the hint goes."""
    model = _stale_constant_model([])
    assert validate.findings(model)  # the strict check refuses it as written
    note = validate.check_read(model, "m.onnx")
    assert note is not None and "value_info of one said shape [] where its Constant holds [1]" in note
    assert not validate.findings(model) and not model.graph.value_info


@pytest.mark.parametrize("declared", [[1], ["n"]])
def test_a_constants_value_info_that_agrees_or_is_symbolic_is_kept(declared):
    model = _stale_constant_model(declared)
    assert validate.check_read(model, "m.onnx") is None
    assert [v.name for v in model.graph.value_info] == ["one"]


def test_several_stale_constants_are_counted_in_the_one_note():
    model = _stale_constant_model([])
    const = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array([2], np.int64), "two"))
    model.graph.node.insert(0, const)
    model.graph.node.append(helper.make_node("Add", ["y", "two"], ["z"]))
    model.graph.output[0].name = "z"
    model.graph.value_info.append(helper.make_tensor_value_info("two", TensorProto.INT64, [3]))
    note = validate.check_read(model, "m.onnx")
    assert note is not None and "(and 1 more)" in note and not model.graph.value_info
