"""rewrite/normalize/cleanup.py: what cleanup removed is a record, written as normalize's report "cleanup"."""

import json

import onnx
from onnx import TensorProto, helper

from trtattn.rewrite.normalize.cleanup import CleanupStats, cleanup


def _with_an_identity() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Identity", ["x"], ["t"], name="id"), helper.make_node("Relu", ["t"], ["y"], name="r")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def test_an_identity_is_a_noop_removed_and_the_json_keeps_its_keys():
    out, stats = cleanup(_with_an_identity())
    assert [n.op_type for n in out.graph.node] == ["Relu"]
    assert stats == CleanupStats(folded_nodes=0, noops_removed=1) and stats.changed
    assert json.dumps(stats.to_json()) == '{"folded_nodes": 0, "noops_removed": 1}'


def test_branches_are_counted_together():
    assert CleanupStats(1, 2) + CleanupStats(3, 0) == CleanupStats(4, 2)
    assert not CleanupStats().changed
