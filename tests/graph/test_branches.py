"""trtattn/graph/branches.py: the inputs that decide an If, and the model with one branch taken."""

import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.graph import validate


# Survivors of mutating graph/branches.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
def _if_model(extra_reader: str | None = None) -> onnx.ModelProto:
    """If(flag) -> (y, p): then y = x + w (w the branch's initializer), p an empty constant (a placeholder);
    else y = -x, p = [1, 1]. extra_reader: "node" (flag also read by a node) or "subgraph" (by another If's
    branch)."""
    import numpy as np
    from onnx import numpy_helper

    spec = lambda name, s, t=TensorProto.FLOAT: helper.make_tensor_value_info(name, t, s)  # noqa: E731
    empty = numpy_helper.from_array(np.zeros([0], np.float32))
    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t_y"], name="t/add"),
                              helper.make_node("Constant", [], ["t_p"], name="t/empty", value=empty)], "then", [],
                             [spec("t_y", [2]), spec("t_p", [0])], [numpy_helper.from_array(np.float32([10, 20]), "w")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e_y"], name="e/neg"),
                               helper.make_node("Constant", [], ["e_p"], name="e/ones",
                                                value=numpy_helper.from_array(np.float32([1, 1])))], "else", [],
                              [spec("e_y", [2]), spec("e_p", [2])])
    nodes = [helper.make_node("If", ["flag"], ["y", "p"], name="if", then_branch=then, else_branch=other)]
    inputs = [spec("x", [2]), spec("flag", [], TensorProto.BOOL), spec("other", [], TensorProto.BOOL)]
    outputs = [spec("y", [2]), spec("p", None)]
    if extra_reader == "node":
        nodes.append(helper.make_node("Cast", ["flag"], ["flag_f"], name="cast", to=TensorProto.FLOAT))
        outputs.append(spec("flag_f", []))
    elif extra_reader == "subgraph":
        reads = lambda name: helper.make_graph(  # noqa: E731
            [helper.make_node("Cast", ["flag"], [f"{name}_f"], name=f"{name}/cast", to=TensorProto.FLOAT)], name, [],
            [spec(f"{name}_f", [])])
        nodes.append(helper.make_node("If", ["other"], ["flag_f"], name="if2", then_branch=reads("a"),
                                      else_branch=reads("b")))
        outputs.append(spec("flag_f", []))
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17)])


def _reference_run(model, **feeds):
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in model.graph.output]
    values = ReferenceEvaluator(model).run(None, {k: np.asarray(v) for k, v in feeds.items()})
    return dict(zip(names, values))


def test_only_boolean_inputs_deciding_an_if_are_branch_inputs():
    from trtattn.graph.branches import branch_inputs

    assert branch_inputs(_if_model()) == ["flag"]  # 'other' is boolean but decides nothing
    assert branch_inputs(_if_model("subgraph")) == ["flag", "other"]


@pytest.mark.parametrize("value,y,p", [(True, [11.0, 22.0], []), (False, [-1.0, -2.0], [1.0, 1.0])])
def test_taking_a_branch_is_the_model_with_that_input_fixed(value, y, p):
    import numpy as np

    from trtattn.graph.branches import take_branch

    model = _if_model()
    before = model.SerializeToString()
    taken = take_branch(model, "flag", value)
    assert model.SerializeToString() == before  # the input model is not modified
    assert not [n for n in taken.graph.node if n.op_type == "If"]
    assert [i.name for i in taken.graph.input] == ["x", "other"]  # flag is read by nothing now
    validate.check(taken, "taken")
    got = _reference_run(taken, x=np.float32([1, 2]), other=True)
    assert got["y"].tolist() == y and got["p"].tolist() == p


def test_a_taken_branch_can_leave_its_placeholders_out():
    import numpy as np

    from trtattn.graph.branches import empty_outputs, take_branch

    then = next(a.g for a in _if_model().graph.node[0].attribute if a.name == "then_branch")
    assert empty_outputs(then) == {"t_p"}
    taken = take_branch(_if_model(), "flag", True, drop_empty=True)
    assert [o.name for o in taken.graph.output] == ["y"]
    assert "p" not in {o for n in taken.graph.node for o in n.output}
    validate.check(taken, "taken")
    assert _reference_run(taken, x=np.float32([1, 2]), other=True)["y"].tolist() == [11.0, 22.0]
    kept = take_branch(_if_model(), "flag", False, drop_empty=True)  # the else branch has no placeholder
    assert [o.name for o in kept.graph.output] == ["y", "p"]


def _unused(model: onnx.ModelProto) -> list[str]:
    """Nodes whose outputs nothing reads, inputs and initializers no node reads (subgraphs included)."""
    def reads(graph):
        return {i for n in graph.node for i in n.input} | {
            i for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH for i in reads(a.g)}

    read = reads(model.graph) | {o.name for o in model.graph.output}
    return ([f"node {n.name}" for n in model.graph.node if not read & set(n.output)]
            + [f"input {i.name}" for i in model.graph.input if i.name not in read]
            + [f"initializer {t.name}" for t in model.graph.initializer if t.name not in read])


@pytest.mark.parametrize("value,gone", [(True, "z"), (False, "x")])
def test_a_taken_branch_keeps_nothing_unused(value, gone):
    """The placeholders' makers go with them, and so do the inputs and weights only the other branch read
    (a first step's past, a cached step's encoder states); an input no branch read stays."""
    import numpy as np
    from onnx import numpy_helper

    from trtattn.graph.branches import take_branch

    model = _if_model()
    model.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2]))
    model.graph.initializer.append(numpy_helper.from_array(np.float32([3, 4]), "v"))
    other = next(a.g for a in model.graph.node[0].attribute if a.name == "else_branch")
    other.node[0].op_type, other.node[0].input[:] = "Sub", ["v", "z"]  # else: y = v - z, v an outer weight
    assert _unused(model) == ["input other"]
    taken = take_branch(model, "flag", value, drop_empty=True)
    assert _unused(taken) == ["input other"]  # the input the If never read is the user's business
    assert gone not in {i.name for i in taken.graph.input} and "flag" not in {i.name for i in taken.graph.input}
    assert ("v" in {t.name for t in taken.graph.initializer}) == (not value)
    validate.check(taken, "taken")
    got = _reference_run(taken, **{"x" if value else "z": np.float32([1, 2])}, other=True)
    assert got["y"].tolist() == ([11.0, 22.0] if value else [2.0, 2.0])


def test_an_empty_initializer_output_is_a_placeholder_too():
    import numpy as np
    from onnx import numpy_helper

    from trtattn.graph.branches import empty_outputs

    spec = lambda name, s: helper.make_tensor_value_info(name, TensorProto.FLOAT, s)  # noqa: E731
    branch = helper.make_graph([], "b", [], [spec("e", [0, 4]), spec("full", [1])],
                               [numpy_helper.from_array(np.zeros([0, 4], np.float32), "e"),
                                numpy_helper.from_array(np.zeros([1], np.float32), "full")])
    assert empty_outputs(branch) == {"e"}


@pytest.mark.parametrize("reader", ["node", "subgraph"])
def test_the_fixed_input_stays_while_something_else_reads_it(reader):
    from trtattn.graph.branches import take_branch

    taken = take_branch(_if_model(reader), "flag", True)
    assert "flag" in [i.name for i in taken.graph.input]
    validate.check(taken, "taken")


def test_taking_a_branch_of_an_input_that_decides_no_if_is_refused():
    from trtattn.errors import TrtattnError
    from trtattn.graph.branches import take_branch

    with pytest.raises(TrtattnError, match="'other' is not a boolean input that decides an If of the main graph"):
        take_branch(_if_model(), "other", True)
