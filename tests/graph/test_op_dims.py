"""graph/op_dims.py: the dims a model's attention ops fix, read from their attributes, the weights' shapes and the
folder's config, before any search."""

import onnx
import pytest

from trtattn.errors import TrtattnError
from trtattn.graph.dim_facts import ConfigSizes
from trtattn.graph.op_dims import op_dims
from trtattn.testing.contrib_graphs import cache_model, group_query_decoder
from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder
from trtattn.testing.gqa_fusion_graphs import (
    fused_rotary_gqa,
    onnxscript_test_gqa,
    onnxscript_test_sliced_gqa,
    unfused_rotary_gqa,
)


@pytest.mark.parametrize("heads,kv_heads,head", [(4, 2, 16), (6, 1, 8), (2, 2, 32)])
def test_packed_qkv_width_gives_the_cache_head_size(heads, kv_heads, head):
    """(num_heads + 2 * kv_num_heads) * head_size is the packed width: the cache's symbolic last dim is its head size."""
    ops = op_dims(genai_decoder(GenaiSpec(heads=heads, kv_heads=kv_heads, head_size=head, hidden=32, layers=1)))
    assert ops.fixed["kv_cache_dim"].value == head
    assert f"({heads} + 2 * {kv_heads})" in ops.fixed["kv_cache_dim"].why and "GroupQueryAttention" in ops.fixed[
        "kv_cache_dim"].why


def test_total_is_past_plus_new_from_the_masks_shape():
    """GenAI's builder computes total_sequence_length as Shape(attention_mask)[1]: that dim is past + new, said once
    however many layers read it."""
    ops = op_dims(genai_decoder(GenaiSpec(layers=2)))
    assert [(s.total, s.parts) for s in ops.sums] == [("total_sequence_length", ("past_sequence_length",
                                                                                 "sequence_length"))]
    assert ops.apply({"past_sequence_length": 0, "sequence_length": 5}) == {
        "past_sequence_length": 0, "sequence_length": 5, "total_sequence_length": 5, "kv_cache_dim": 16}
    assert ops.limits["total_sequence_length"].value == GenaiSpec().context_length  # the rotary cache's rows


def test_batch_one_over_a_past_and_a_prefill_at_any_batch():
    ops = op_dims(genai_decoder(GenaiSpec(layers=1)))
    decode = ops.decode({"batch_size": 2, "past_sequence_length": 6, "sequence_length": 8}, {})
    assert decode["batch_size"] == 1 and decode["total_sequence_length"] == 14
    assert ops.decode({"batch_size": 2, "past_sequence_length": 6, "sequence_length": 1}, {})["batch_size"] == 2
    assert ops.decode({"batch_size": 2, "past_sequence_length": 6, "sequence_length": 8}, {"batch_size": 2})[
        "batch_size"] == 2  # the user's batch is theirs
    prefill = ops.prefill(decode, {}, {"batch_size": 2})
    assert (prefill["past_sequence_length"], prefill["batch_size"], prefill["total_sequence_length"]) == (0, 2, 8)
    assert ops.prefill(decode, {"past_sequence_length": 3}, {"batch_size": 2}) is None


def test_a_user_dim_the_op_fixes_otherwise_is_refused_naming_the_op():
    ops = op_dims(genai_decoder(GenaiSpec(layers=1)))
    ops.check_user({"kv_cache_dim": 16})
    with pytest.raises(TrtattnError, match="kv_cache_dim=8: GroupQueryAttention '.*' reads a head size of 16"):
        ops.check_user({"kv_cache_dim": 8})


def test_weights_give_the_width_where_no_shape_is_written():
    """The query's width from its projection's weight (no value_info in the model)."""
    model = genai_decoder(GenaiSpec(layers=1))
    assert not model.graph.value_info
    assert op_dims(model).fixed["kv_cache_dim"].value == 16


def test_config_gives_the_head_size_the_ops_leave_unknown():
    """A query whose width nothing says (a graph input of symbolic width): genai_config.json's head_size decides."""
    model = genai_decoder(GenaiSpec(layers=1))
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    gqa.input[0] = "qkv_in"
    model.graph.input.append(onnx.helper.make_tensor_value_info("qkv_in", onnx.TensorProto.FLOAT,
                                                                ["batch_size", "sequence_length", "width"]))
    assert "kv_cache_dim" not in op_dims(model).fixed
    fixed = op_dims(model, ConfigSizes("genai_config.json", head_size=16)).fixed["kv_cache_dim"]
    assert fixed.value == 16 and "genai_config.json" in fixed.why


def test_multi_head_attention_mask_is_past_plus_new():
    ops = op_dims(cache_model("MultiHeadAttention", mask=True))
    assert ops.pasts == {"past": "mha"} and ops.batch_one is None
    assert not ops.sums  # its mask's width is written "past+s": an expression, computed, not a dim to set


def test_static_cache_dims_fix_nothing_and_models_without_caches_say_nothing():
    assert not op_dims(genai_decoder(GenaiSpec(static_head_dim=True, layers=1))).fixed
    assert op_dims(group_query_decoder()).pasts == {"past_sequence_length": "gqa"}
    no_cache = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    assert not op_dims(no_cache)


def test_rotary_tables_given_as_inputs_cover_the_past_and_the_new_tokens():
    """onnxscript's GQA fusion tests feed cos/sin [max_seqlen, Dh / 2]: the rows must reach P + S (was: max_seqlen
    left at the default 8 below P + S, 'cos_cache dimension 0 shall not be less than total_sequence_length')."""
    fused, unfused = op_dims(fused_rotary_gqa()), op_dims(unfused_rotary_gqa())
    assert [(c.rows, c.parts) for c in fused.covers] == [("max_seqlen", ("P", "S"))]
    assert [(c.rows, c.parts) for c in unfused.covers] == [("max_seqlen", ("P", "S"))]  # every other length
    assert fused.apply({"P": 6, "S": 8, "max_seqlen": 8})["max_seqlen"] == 14
    assert fused.apply({"P": 6, "S": 8, "max_seqlen": 8}, {"max_seqlen": 8})["max_seqlen"] == 8  # the user's


def test_a_window_buffer_is_its_window_long_and_the_total_reaches_it():
    """GenAI's Gemma 2 sliding layer (sliding_window_cache): its buffer dim is local_window_size, no past and no part
    of the total; the total is raised to the window, through the past at a step and the new tokens at a prefill
    (the lengths where the kernel's present has no unspecified slot)."""
    ops = op_dims(genai_decoder(GenaiSpec(layers=2, window=8, sliding=(0,))))
    assert ops.fixed["past_sliding_length"].value == 8 and "sliding_window_cache" in ops.fixed["past_sliding_length"].why
    assert "past_sliding_length" not in ops.pasts and ops.windows == {"past_sliding_length"}
    assert [(s.total, s.parts) for s in ops.sums] == [("total_sequence_length", ("past_sequence_length",
                                                                                 "sequence_length"))]
    assert ops.floors["total_sequence_length"].value == 8
    step = ops.decode({"batch_size": 2, "past_sequence_length": 2, "sequence_length": 3}, {})
    assert (step["past_sequence_length"], step["sequence_length"], step["total_sequence_length"]) == (5, 3, 8)
    assert step["past_sliding_length"] == 8 and step["batch_size"] == 1
    prefill = ops.prefill(step, {}, {"batch_size": 2})
    assert (prefill["past_sequence_length"], prefill["sequence_length"], prefill["total_sequence_length"]) == (0, 8, 8)
    assert prefill["past_sliding_length"] == 8
    assert ops.within_limits(step) and not ops.within_limits({**step, "total_sequence_length": 7})
    long = ops.decode({"batch_size": 1, "past_sequence_length": 20, "sequence_length": 1}, {})
    assert (long["past_sequence_length"], long["total_sequence_length"]) == (20, 21)  # long enough: kept


def test_a_window_buffer_decoder_fuses_as_a_user_runs_it():
    """No --dims: the search runs at the window's buffer and verifies a step and a prefill."""
    from trtattn.rewrite.fuse import fuse_model

    result = fuse_model(genai_decoder(GenaiSpec(layers=2, window=8, sliding=(0,))))
    assert result.ok, [r.row() for r in result.reports]
    dims = [result.dims["values"], *result.dims.get("also_verified_at", [])]
    assert len(dims) == 2 and all(d["past_sliding_length"] == 8 and d["total_sequence_length"] >= 8 for d in dims)
    assert {d["past_sequence_length"] for d in dims} >= {0}


@pytest.mark.parametrize("norm", ["before_transpose", "after_transpose"])
def test_a_norm_scale_given_as_an_input_is_the_normalized_last_axis(norm):
    """Gemma's query/key RMS norm with its weight an input of symbolic size ["Dh"] (onnxscript's GemmaGQAFusionTest):
    the scale is X.shape[axis:], so Dh is the heads' size, 16 (was: the default 8, 'Scale and (optional) bias must
    match X.shape[axis:]', refused at 64 dims)."""
    fixed = op_dims(onnxscript_test_gqa(norm=norm)).fixed["Dh"]
    assert fixed.value == 16 and "SimplifiedLayerNormalization" in fixed.why and "query_scale" in fixed.why


def test_a_scale_of_a_named_input_width_fixes_nothing():
    """A LayerNormalization over an input [B, S, hidden] with its scale ["hidden"]: the width is the user's dim,
    one name for both, nothing to fix."""
    h = onnx.helper
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", "S", "hidden"])
    w = h.make_tensor_value_info("w", onnx.TensorProto.FLOAT, ["hidden"])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", "S", "hidden"])
    model = h.make_model(h.make_graph([h.make_node("LayerNormalization", ["x", "w"], ["y"])], "g", [x, w], [y]))
    assert "hidden" not in op_dims(model).fixed


def test_one_row_of_positions_or_of_seqlens_k_fixes_the_batch_to_one():
    """Positions Range(P, P + S) unsqueezed to [1, S] (RotaryEmbedding's position_ids is [batch, S]), and
    onnxscript's fused seqlens_k ReduceMax'ed from them ([1]; GroupQueryAttention's is [batch]): batch 1."""
    fixed = op_dims(onnxscript_test_gqa()).fixed["B"]
    assert fixed.value == 1 and "RotaryEmbedding" in fixed.why and "'positions'" in fixed.why
    assert "B" not in op_dims(fused_rotary_gqa()).fixed  # seqlens_k tiled over the batch: any batch
    assert "B" not in op_dims(onnxscript_test_sliced_gqa()).fixed  # seqlens_k [B] an input


def test_a_cache_read_only_for_its_length_is_a_past():
    """Without a past concatenated, onnxscript's Gemma test still takes past_key/past_value, read only through Shape
    for the positions and the mask: their length is a past (tried empty first), not one the ops concatenate."""
    assert op_dims(onnxscript_test_gqa(norm="after_transpose", past=False)).pasts == {"P": "Shape of 'past_key'"}
    assert "P" not in op_dims(onnxscript_test_gqa(norm="after_transpose")).pasts  # concatenated: any past


def test_a_key_and_value_of_different_widths_are_refused_before_any_search():
    """gqa_packed_qkv_extended_test's slices off the head boundary (key 160 wide, value 180): no size runs it (ONNX
    Runtime: 'value is expected to have same hidden size as key'), said naming the op (was: 64 dims tried first)."""
    with pytest.raises(TrtattnError, match="GroupQueryAttention 'gqa' takes a key 160 wide and a value 180 wide"):
        op_dims(onnxscript_test_sliced_gqa(key_start=300))
    assert op_dims(onnxscript_test_sliced_gqa()).pasts == {"P": "gqa"}  # aligned: read as usual


def test_the_new_length_of_q_k_v_sliced_from_a_packed_input_is_inferred():
    """gqa_packed_qkv_test's source slices Q, K and V from one input: the new length is their inferred axis 1, so
    the cos/sin rows cover past + new (was: no new length, the rows left at 8, verified at an empty past only)."""
    ops = op_dims(onnxscript_test_sliced_gqa())
    assert ops.news == {"S"} and [(c.rows, c.parts) for c in ops.covers] == [("max_seqlen", ("P", "S"))]
