"""graph.dependence: which graph inputs reach a tensor by value, and which only by shape."""

import numpy as np
import onnx_graphsurgeon as gs

from trtattn.graph.dependence import depends_on_input_values, value_inputs


def _node(op, inputs, name, dtype=np.float32, attrs=None):
    out = gs.Variable(name, dtype=dtype)
    gs.Node(op, name=f"{name}_node", inputs=inputs, outputs=[out], attrs=attrs or {})
    return out


def _inputs():
    x = gs.Variable("x", dtype=np.float32, shape=["B", "S", 8])
    mask = gs.Variable("mask", dtype=np.int64, shape=["B", "S"])
    return x, mask, {"x", "mask"}


def test_shape_and_size_carry_no_values():
    x, _, names = _inputs()
    shape = _node("Shape", [x], "shape", np.int64)
    size = _node("Size", [x], "size", np.int64)
    out = _node("Add", [_node("Cast", [shape], "cast", attrs={"to": 1}), _node("Cast", [size], "cast2",
                                                                             attrs={"to": 1})], "out")
    assert not depends_on_input_values(out, names)
    assert value_inputs(out, names) == set()


def test_values_found_past_shape_only_branches():
    x, mask, names = _inputs()
    length = _node("Cast", [_node("Shape", [x], "shape", np.int64)], "length", attrs={"to": 1})
    bias = _node("Mul", [_node("Cast", [mask], "maskf", attrs={"to": 1}), gs.Constant("big", np.array(-1e9, np.float32))],
                 "bias")
    out = _node("Add", [bias, _node("Add", [length, x], "xl")], "out")
    assert depends_on_input_values(bias, names)
    assert value_inputs(bias, names) == {"mask"}
    assert value_inputs(out, names) == {"mask", "x"}  # x by value through xl, not only through its shape
    assert value_inputs(length, names) == set()
    assert value_inputs(out, {"mask"}) == {"mask"}  # only the names asked about count as inputs


def test_constants_depend_on_nothing():
    c = gs.Constant("c", np.ones((2, 2), np.float32))
    assert value_inputs(_node("Neg", [c], "neg"), {"x"}) == set()


def test_limit_bounds_the_walk():
    x, _, names = _inputs()
    t = x
    for i in range(70):  # the input is 70 tensors up the chain
        t = _node("Identity", [t], f"id{i}")
    assert depends_on_input_values(t, names)
    assert not depends_on_input_values(t, names, limit=64)  # cut short: not found
    assert depends_on_input_values(t, names, limit=71)
    assert value_inputs(t, names, limit=71) == {"x"}
    assert value_inputs(t, names, limit=70) == set()


def test_a_tensor_reached_twice_does_not_end_the_walk():
    """y = mask + (r + r), r = Relu(x): the walk meets r a second time before it reaches mask; a revisit is
    skipped, not the end of the walk."""
    x, mask, names = _inputs()
    r = _node("Relu", [x], "r")
    y = _node("Add", [_node("Cast", [mask], "m", attrs={"to": 1}), _node("Add", [r, r], "rr")], "y")
    assert value_inputs(y, names) == {"x", "mask"}


def test_a_node_reads_its_inputs_and_the_outer_names_its_subgraphs_use():
    """An If whose branch reads the outer 'a' and its own 't': the If reads 'cond' and 'a', not 't' (the
    slicer and a taken branch's liveness would otherwise wait for a tensor no node outside makes)."""
    from onnx import TensorProto, helper

    from trtattn.graph.dependence import node_reads

    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    branch = helper.make_graph([helper.make_node("Relu", ["a"], ["t"]), helper.make_node("Neg", ["t"], ["y"])],
                               "then", [], [out])
    other = helper.make_graph([helper.make_node("Identity", ["b"], ["y"])], "else", [], [out])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)
    assert sorted(node_reads(node)) == ["a", "b", "cond"]
