"""Issue 18, class 8: foreign layouts. tf2onnx lowers Keras' Einsums to Reshapes whose targets no shape
inference follows (fresh unk__N dims) and heads split with a unit axis ([B,S,N,H,1], [B,S,1,N,H]); the
layout search regroups such Reshapes by sizes measured at two runs of the model, not by dim names."""

import collections

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from trtattn.graph.measure import Sizes, measured, probe_dims
from trtattn.graph.view import GraphView
from trtattn.match.axes import Atoms, regroup
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import unit_axis_model


@pytest.mark.parametrize("unit,seq,opset", [("trailing", 5, 17), ("middle", 5, 17), ("leading", 5, 17), ("trailing", 8, 17),
                                            ("trailing", 5, 12), ("middle", 5, 12), ("leading", 5, 12)])
def test_heads_split_with_a_unit_axis_and_fresh_dims_fuse(unit, seq, opset):
    """[B,S,N,H,1], [B,S,1,N,H], [1,B,S,N,H]; at seq 8 the positions are as long as the head dim. At opset 12
    the 5-D Softmax normalises everything from its axis on (Softmax-1's 2-D coercion), read so."""
    model = unit_axis_model(unit=unit, seq=seq, opset=opset)
    assert [o.version for o in model.opset_import if o.domain == ""] == [opset]
    result = fuse_model(model)
    [report] = result.reports
    assert report.status == "fused", report.reason
    assert (report.site.q_heads, report.site.kv_heads, report.site.head_size) == (4, 4, 8)
    assert result.verification.passed is True
    assert collections.Counter(n.op_type for n in result.model.graph.node)["Attention"] == 1


def test_unit_axis_model_refuses_an_opset_its_graph_cannot_be_written_in():
    with pytest.raises(ValueError, match="opset 11.*Max"):
        unit_axis_model(opset=11)


def _frame(atoms, *names):
    return tuple((atoms.new(a),) for a in names)


def test_measured_sizes_split_the_merged_batch_where_names_cannot():
    """[B*N, S, S] -> [B, N, S, S, 1] with every dim a fresh symbol: only the numbers tell B from N and the
    positions from the heads (seq 4 = heads 4 at the first run)."""
    atoms = Atoms()
    frame = _frame(atoms, "x0", "m", "n")
    src = [Sizes((8, 16)), Sizes((4, 12)), Sizes((4, 12))]  # batch 2 -> 4, seq 4 -> 12, 4 heads
    dst = [Sizes((2, 4)), Sizes((4, 4)), Sizes((4, 12)), Sizes((4, 12)), Sizes((1, 1))]
    assert regroup(atoms, frame, src, dst, "r") == (("x0.0",), ("x0.1",), ("m",), ("n",), ())
    assert atoms.known("x0.1") == 4 and atoms.measure["x0.0"] == (2, 4)
    # the names alone split the batch too (the one unknown atom, the one extra dim), but cannot say the
    # heads are 4: both parts stay unknown, to be read at run time from the Reshape's shape input
    names = ["unk__1", "unk__2", "unk__3"], ["unk__4", "unk__5", "unk__6", "unk__7", 1]
    unnamed = Atoms()
    assert regroup(unnamed, _frame(unnamed, "x0", "m", "n"), *names, "r") == (("x0.0",), ("x0.1",), ("m",), ("n",), ())
    assert unnamed.known("x0.0") is None and unnamed.known("x0.1") is None


def test_a_varying_dim_is_never_filled_by_static_atoms():
    """[B, S, 4, 8] -> [B*S, 32] -> back: the heads and head dim (static) go together, the positions with
    the batch, whichever order a name-based guess would prefer."""
    atoms = Atoms()
    frame = _frame(atoms, "b", "s", "h", "d")
    src = [Sizes((2, 4)), Sizes((8, 24)), Sizes((4, 4)), Sizes((8, 8))]
    assert regroup(atoms, frame, src, [Sizes((16, 96)), Sizes((32, 32))], "r") == (("b", "s"), ("h", "d"))
    with pytest.raises(Exception, match="cannot tell how"):  # 32 static cannot be B*S at both runs
        regroup(atoms, frame, src, [Sizes((32, 32)), Sizes((16, 96))], "r")


def test_measuring_leaves_the_graph_as_it_was_and_scales_each_input_dim_by_its_own_prime():
    model = unit_axis_model(unit="middle")
    base, choices = probe_dims(model)
    assert (base["unk__1"], base["unk__2"]) == (2, 5)
    assert {choices[0]["unk__1"] // 2, choices[0]["unk__2"] // 5} == {2, 3}  # one prime per independent dim
    assert choices[1]["unk__1"] == 6 and choices[1]["unk__2"] == 15  # then one factor for all
    graph = gs.import_onnx(model)
    view = GraphView(graph, model)
    before = [(n.name, [t.name for t in n.outputs], [len(t.outputs) for t in n.outputs]) for n in graph.nodes]
    softmax = next(n for n in graph.nodes if n.op == "Softmax")
    got = measured(view, softmax.outputs[0])
    assert [n for n in got if not n.static] and all(isinstance(d, Sizes) for d in got)
    assert [d for d in got if d.static] == [Sizes((4, 4)), Sizes((1, 1))]  # the heads and the unit axis
    assert [(n.name, [t.name for t in n.outputs], [len(t.outputs) for t in n.outputs]) for n in graph.nodes] == before
    assert np.prod([d[0] for d in got]) == 2 * 4 * 5 * 5


def test_atoms_of_unknown_size_merged_in_one_axis_keep_together():
    """[a*b, c] -> [32, c] where a and b were never told apart: the merged axis stays whole, the measured
    positions c are not split off with part of it."""
    atoms = Atoms()
    frame = ((atoms.new("a"), atoms.new("b")), (atoms.new("c"),))
    src = [Sizes((32, 32)), Sizes((5, 15))]
    assert regroup(atoms, frame, src, src, "r") == (("a", "b"), ("c",))


def test_heads_merged_into_the_batch_are_not_taken_for_static_positions(zoo_dir, monkeypatch):
    """The fuzzer's ViT with heads merged into the batch around both products ([B*N, 17, 17], issue 18's
    heads_3d): B*N split by numbers (the batch varies between the runs, the 4 heads do not), not into
    17 'heads' because 17 is the one static dim in sight."""
    from trtattn.testing.fuzz.oracle import run_case

    monkeypatch.setenv("TRTATTN_ZOO_CACHE", str(zoo_dir))
    result = run_case("vit.torchscript/1/heads_3d/all")
    assert result.outcome == "fused", result.reason


def test_sizes_show_a_static_dim_as_one_number_and_a_varying_one_per_run():
    assert repr(Sizes((4, 4))) == "4" and repr(Sizes((2, 6))) == "(2|6)"
    assert Sizes((4, 4)).static and not Sizes((2, 6)).static


def test_a_model_that_needs_two_dims_equal_is_measured_at_the_second_choice():
    """x [B, S, 8] + y [B, T, 8] runs only with S == T: the first choice (one prime per dim) fails to run,
    the second (every dim times 3) runs, and it is what is measured."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "T", 8])
    shape = helper.make_tensor("shape", TensorProto.INT64, [4], [0, 0, 2, 4])
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Reshape", ["s", "shape"], ["r"])]
    graph = helper.make_graph(nodes, "g", [x, y], [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
                              [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    base, choices = probe_dims(model)
    assert choices[0]["S"] // base["S"] != choices[0]["T"] // base["T"]  # the first choice cannot run
    g = gs.import_onnx(model)
    got = measured(GraphView(g, model), g.tensors()["r"])
    assert got is not None and got[2:] == [Sizes((2, 2)), Sizes((4, 4))]
    assert got[1] == Sizes((base["S"], 3 * base["S"]))  # the second choice: every dim times 3


def test_a_copy_of_the_atoms_carries_every_field():
    """A trial split works on a copy: a field the copy dropped (the broadcast batch atoms, the run-time
    entries, the measured sizes) would be forgotten by every trial."""
    atoms = Atoms()
    frame = _frame(atoms, "x0", "m")
    atoms.broadcast.add("x0")
    atoms.entries["x0"] = ("shape", 0)
    atoms.measure["m"] = Sizes((2, 6))
    atoms.hard_coded["m"] = (6, "r")
    atoms.dynamic.add("m")
    copy = atoms.copy()
    assert frame and vars(copy) == vars(atoms)
    assert all(getattr(copy, k) is not v for k, v in vars(atoms).items() if isinstance(v, (dict, set)))
