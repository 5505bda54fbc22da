"""An input's role kind is one enum (graph/roles.py RoleKind): the guesses and the measured masks write its
members, a role read from the model's metadata is read through it, and a kind trtattn does not know is refused
naming the input (before, it was drawn as a float without a word)."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.errors import TrtattnError
from trtattn.graph.roles import InputSpec, RoleKind, input_specs, role_kind


def _model(roles: dict | None = None) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])]
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["ids_f", "mask_f"], ["m"]),
             helper.make_node("Unsqueeze", ["m", "last"], ["m3"]),
             helper.make_node("Add", ["x", "m3"], ["y"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(np.array([-1], np.int64), "last")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if roles is not None:
        helper.set_model_props(model, {"trtattn.inputs": json.dumps({"inputs": roles})})
    return model


def test_guessed_roles_are_written_with_the_enum_and_serialise_as_their_strings():
    specs = {s.name: s for s in input_specs(_model())}
    assert {n: s.kind for n, s in specs.items()} == {"input_ids": RoleKind.TOKEN_IDS,
                                                     "attention_mask": RoleKind.PADDING_MASK, "x": RoleKind.FLOAT}
    assert all(type(s.role["kind"]) is RoleKind for s in specs.values())
    assert json.loads(json.dumps(specs["attention_mask"].role)) == {"kind": "padding_mask"}
    assert f"{RoleKind.PADDING_MASK}" == str(RoleKind.PADDING_MASK) == "padding_mask"


def test_declared_roles_are_read_through_the_enum_and_a_role_without_a_kind_is_a_float():
    specs = {s.name: s for s in input_specs(_model({"input_ids": {"kind": "token_ids", "vocab": 7},
                                                    "attention_mask": {"kind": "ones_mask"}, "x": {}}))}
    assert (specs["input_ids"].kind, specs["attention_mask"].kind, specs["x"].kind) == \
        (RoleKind.TOKEN_IDS, RoleKind.ONES_MASK, RoleKind.FLOAT)
    assert specs["input_ids"].role == {"kind": "token_ids", "vocab": 7}  # the declared role, as declared
    assert InputSpec("z", np.dtype(np.float32), [2]).kind is RoleKind.FLOAT


def test_a_declared_kind_trtattn_does_not_know_is_refused_naming_the_input():
    with pytest.raises(TrtattnError, match=r"input 'attention_mask': role kind 'padding' is not one") as err:
        input_specs(_model({"attention_mask": {"kind": "padding"}}))
    assert "padding_mask" in str(err.value)  # the kinds it knows are listed
    with pytest.raises(TrtattnError, match="input 'q'"):
        role_kind({"kind": "token"}, "q")


def test_a_masks_side_and_polarity_are_read_from_its_role():
    """Other packages ask the spec, not its role dict: left padding and True-at-padding are what the role says."""
    mask = InputSpec("attention_mask", np.dtype(np.int64), ["batch", "seq"], {"kind": "padding_mask"})
    assert not mask.left_padded and not mask.true_at_padding
    flipped = InputSpec("m", np.dtype(bool), ["batch", "seq"], {"kind": "padding_mask", "side": "left",
                                                                 "true_at": "padding"})
    assert flipped.left_padded and flipped.true_at_padding
