"""graph/rotary.py: a RotaryEmbedding op's inputs in each domain's order and its attributes, read and written."""

import onnx_graphsurgeon as gs

from trtattn.graph.rotary import RotaryAttrs, is_rotary, rotary_inputs


def test_each_domain_orders_x_tables_and_positions_its_own_way():
    assert rotary_inputs("", ["x", "cos", "sin", "pos"]) == ("x", "cos", "sin", "pos")
    assert rotary_inputs("ai.onnx", ["x", "cos", "sin"]) == ("x", "cos", "sin", None)
    assert rotary_inputs("", ["x", "cos", "sin", ""]) == ("x", "cos", "sin", None)
    assert rotary_inputs("com.microsoft", ["x", "pos", "cos", "sin"]) == ("x", "cos", "sin", "pos")
    x, cos, sin, pos = (gs.Variable(n) for n in ("x", "cos", "sin", ""))
    assert rotary_inputs("", [x, cos, sin, pos])[3] is None  # an omitted optional input
    assert is_rotary("RotaryEmbedding", "com.microsoft") and is_rotary("RotaryEmbedding", None)
    assert not is_rotary("RotaryEmbedding", "custom") and not is_rotary("Rotary", "")


def test_attributes_read_at_the_op_defaults_and_written_back():
    assert RotaryAttrs.of({}) == RotaryAttrs(False, 0, 0)
    read = RotaryAttrs.of({"interleaved": 1, "rotary_embedding_dim": 16, "num_heads": 4})
    assert read.as_attrs() == {"interleaved": 1, "rotary_embedding_dim": 16, "num_heads": 4}
    assert RotaryAttrs.of({}).as_attrs() == {"interleaved": 0, "rotary_embedding_dim": 0}  # no num_heads for 4-D


def test_a_rotation_of_the_whole_head_is_rotary_embedding_dim_0():
    assert RotaryAttrs.for_head(False, 64, 64).rotary_embedding_dim == 0
    assert RotaryAttrs.for_head(False, 0, 64).rotary_embedding_dim == 0
    partial = RotaryAttrs.for_head(True, 32, 64)
    assert (partial.rotary_embedding_dim, partial.rotary_dim(64), RotaryAttrs().rotary_dim(64)) == (32, 32, 64)
