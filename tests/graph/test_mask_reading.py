"""Verification feeds exercise a mask as the model reads it (graph/mask_reading.py, graph/feeds.py): its axes are
measured, a [batch, key] padding mask (in either order) keeps a prefix of keys per batch row, any other mask is
random with key 0 kept in every row. Fed all ones, as a [B, 1, S, S] or [S, S] mask was, or as [B, S] when it is
[S, B], a rewrite that dropped or transposed the mask passed verification."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from mask_models import MODELS, key_flags, self_attention
from onnx import helper

from trtattn.graph.feeds import make_feeds, measured_specs
from trtattn.graph.mask_reading import read_masks, reads_key_flags
from trtattn.graph.roles import input_specs
from trtattn.verify import compare_models


def without_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its Attention given no attn_mask: a rewrite that dropped the mask."""
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    (attention,) = (n for n in wrong.graph.node if n.op_type == "Attention")
    del attention.input[3:]
    return wrong


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_rewrite_that_drops_the_mask_fails_verification(name):
    shape, nodes, _ = MODELS[name]
    original = self_attention(shape, nodes)
    assert compare_models(original, original).passed
    outcome = compare_models(original, without_mask(original))
    assert not outcome.passed and outcome.summary().max_abs_err > 1e-2
    said = outcome.inputs.domains["mask"]  # the record says what the mask was drawn from
    assert said.startswith("padding mask") if name == "transposed_key_batch" else said.startswith("mask")


def test_a_rewrite_that_reads_an_s_b_mask_as_b_s_fails_verification():
    """The original transposes its [s, b] mask to [b, s]; the wrong rewrite reshapes it (reads [s, b] as [b, s]).
    At a batch of 2 the mask was read as 8 rows of 2 keys, too short to pad: fed all ones."""
    shape, nodes, _ = MODELS["transposed_key_batch"]
    original = self_attention(shape, nodes)
    shape_of = [helper.make_node("Shape", ["mask"], ["sb"]),
                helper.make_node("Constant", [], ["swap"], value=onnx.numpy_helper.from_array(np.array([1, 0]))),
                helper.make_node("Gather", ["sb", "swap"], ["bs"]),
                helper.make_node("Reshape", ["mask", "bs"], ["mask_bs"])]
    wrong = self_attention(shape, shape_of + key_flags("mask_bs"))
    assert compare_models(original, original, dims={"b": 2}).passed
    outcome = compare_models(original, wrong, dims={"b": 2})
    assert not outcome.passed and outcome.summary().max_abs_err > 1e-2


def test_a_rewrite_that_drops_an_additive_mask_fails_verification():
    """A float [b, 1, s, s] attn_mask is added to the logits: fed ones (what a mask named so was fed), it
    shifts every logit alike and changes nothing; fed a bias with -1e4 holes it masks."""
    shape, nodes, _ = MODELS["batch_1_query_key"]
    original = self_attention(shape, nodes)
    original.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    mask = make_feeds(original, seed=0)["mask"]
    kept = mask > -1e4
    assert kept[..., 0].all() and not kept.all() and np.abs(mask[kept]).max() > 0.5  # a bias where kept
    outcome = compare_models(original, without_mask(original))
    assert not outcome.passed and outcome.summary().max_abs_err > 1e-2


@pytest.mark.parametrize("name", sorted(MODELS))
def test_mask_feeds_keep_a_key_in_every_row_and_mask_some(name):
    """Along the measured key axis: key 0 kept in every row, some keys masked; the same on the same seed."""
    shape, nodes, key_axis = MODELS[name]
    model = self_attention(shape, nodes)
    mask = make_feeds(model, seed=3)["mask"]
    keys = np.moveaxis(mask, key_axis, -1)
    assert keys.any(axis=-1).all() and not mask.all()
    assert np.array_equal(mask, make_feeds(model, seed=3)["mask"])
    # padding=False (a form's check spreads the padding itself): a mask with a query axis stays random
    assert make_feeds(model, seed=3, padding=False)["mask"].all() == (name == "transposed_key_batch")
    assert make_feeds(model, seed=3, all_keys=True)["mask"].all()  # a probe of the model's own pattern


def causal(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` (ending in "attn_mask") with a causal mask combined in (Trilu): a key reaches only the queries
    after it, so a toggled key changes a clipped run of queries."""
    *head, last = nodes
    last = onnx.NodeProto()
    last.CopyFrom(nodes[-1])
    last.output[0] = "mask_rows"
    return [*head, last, helper.make_node("Cast", ["mask_rows"], ["rows64"], to=onnx.TensorProto.INT64),
            helper.make_node("Trilu", ["rows64"], ["lower"], upper=0),
            helper.make_node("Cast", ["lower"], ["attn_mask"], to=onnx.TensorProto.BOOL)]


@pytest.mark.parametrize("shape,to_mask,role", [
    (["b", "s"], key_flags("mask"), {"kind": "padding_mask", "key_axis": 1, "batch_axis": 0}),
    (["b", "s"], causal(key_flags("mask")), {"kind": "padding_mask", "key_axis": 1, "batch_axis": 0}),
    (["s", "b"], MODELS["transposed_key_batch"][1], {"kind": "padding_mask", "key_axis": 0, "batch_axis": 1}),
    (["s", "b"], causal(MODELS["transposed_key_batch"][1]), {"kind": "padding_mask", "key_axis": 0, "batch_axis": 1}),
    (["s", "s"], causal(MODELS["query_key"][1]), {"kind": "mask", "key_axis": 1}),
    (["b", 1, "s", "s"], MODELS["batch_1_query_key"][1], {"kind": "mask", "key_axis": 3}),
])
def test_a_mask_role_is_read_from_its_axes(shape, to_mask, role):
    """Padding (its axes are the batch and the keys, in either order, with a causal mask combined in too) or
    a mask with a query axis; the hidden states x, which reach the logits through products, stay plain floats."""
    specs = {s.name: s.role for s in measured_specs(self_attention(shape, to_mask), {"b": 3})}
    assert {k: v for k, v in specs["mask"].items() if k != "true_at"} == role
    assert specs["x"] == {"kind": "float"}


def test_a_reading_is_taken_again_on_feeds_the_model_runs_on():
    """A dims search runs the model on dims it may not run at: no reading then, and none kept."""
    model = self_attention(*MODELS["transposed_key_batch"][:2])
    specs = input_specs(model)
    mask = np.ones((6, 3), bool)
    assert read_masks(model, specs, {"x": np.zeros((3, 6, 16), np.float64), "mask": mask}) == {}  # x's type: no run
    reading = read_masks(model, specs, {"x": np.zeros((3, 6, 16), np.float32), "mask": mask})
    assert reading == {"mask": {"axes": ["key", "batch"], "additive": False}}


def test_a_general_mask_feed_keeps_several_keys_in_a_row_and_masks_others():
    """A [b, 1, s, s] mask (no padding axes) is random along its keys: rows keep more than key 0, and some
    keys are masked; a feed keeping key 0 alone would not show a mask read on the wrong axis."""
    shape, nodes, key_axis = MODELS["batch_1_query_key"]
    mask = np.moveaxis(make_feeds(self_attention(shape, nodes), seed=3)["mask"], key_axis, -1)
    kept = mask.sum(axis=-1)
    assert (kept >= 2).mean() > 0.5 and not mask.all()


def _dropped(mask: np.ndarray, *cells) -> np.ndarray:
    changed = mask.copy()
    for cell in cells:
        changed[cell] = False
    return changed


def test_a_key_flag_is_a_change_at_its_batch_row_and_key_only_and_key_0_at_every_query_row():
    """reads_key_flags: a [B, S] input dropped at (b, j) against an attn_mask [B, 1, Sq, Skv] (or broadcast)."""
    base = np.ones((2, 1, 3, 4), bool)
    assert reads_key_flags(base, _dropped(base, (1, 0, slice(None), 0)), (1, 0), (2, 4))
    assert reads_key_flags(base, _dropped(base, (0, 0, slice(None), 1)), (0, 1), (2, 4))
    assert reads_key_flags(base, _dropped(base, (0, 0, slice(1, None), 1)), (0, 1), (2, 4))  # causal: key 1 from row 1
    assert not reads_key_flags(base, _dropped(base, (1, 0, slice(1, None), 0)), (1, 0), (2, 4))  # key 0 not in row 0
    assert not reads_key_flags(base, _dropped(base, (0, 0, slice(None), 1)), (1, 0), (2, 4))  # another row and key
    assert not reads_key_flags(base, base, (1, 0), (2, 4))  # no change: not read
    square = np.ones((4, 4), bool)  # [Sq, Skv] broadcast over the batch: its axis 0 is no batch
    assert not reads_key_flags(square, _dropped(square, (slice(None), 0)), (1, 0), (2, 4))
